"""The error every scenario check raises: one line that names the key and what it accepts."""

from __future__ import annotations


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message names the key and the fix."""
