"""Seeded graph builders, Byzantine placement and edge-list io (all in ``topologies.graphs``)."""

from dfedrw.topologies.graphs import *  # noqa: F403 - the package's public names are that module's
from dfedrw.topologies.graphs import __all__  # noqa: F401
