"""Settings checked without building what they configure.

A registered class checks its settings in its classmethod ``check_settings(s)``: it reads them off
``s`` (a namespace of the dataclass's fields), raises ``ValueError`` naming the owner, the setting
and the value, and may put a normal form back (``s.gamma = check_real(...)``). A :class:`Checked`
subclass runs it when built, keeping the normal forms; :meth:`~dfedrw.peer.registry.Registry.check`
runs it on a scenario's settings alone (:func:`settings_view`): loading a scenario builds nothing.

What only the running system supplies as an object (a rule's TPM and CRS, an attack's defence or
data sample) is None in a view: such a value is checked where the class is built, in its
``__post_init__`` after ``super().__post_init__()``, never in ``check_settings``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields
from types import SimpleNamespace
from typing import Any

from dfedrw.peer.quote import shown

__all__ = ["Checked", "Described", "check_choice", "check_int", "check_real", "checked_by", "settings_view"]


class Checked:
    """Base of a frozen dataclass whose settings :meth:`check_settings` checks (see the module)."""

    @classmethod
    def check_settings(cls, s: SimpleNamespace) -> None:
        """Check the settings in ``s``, putting normal forms back; nothing by default. A
        subclass that adds settings calls ``super().check_settings(s)`` first."""

    def __post_init__(self) -> None:
        names = [f.name for f in fields(self) if f.init]  # type: ignore[arg-type]
        s = SimpleNamespace(**{name: getattr(self, name) for name in names})
        type(self).check_settings(s)
        for name in names:
            value = getattr(s, name)
            if value is not getattr(self, name):
                object.__setattr__(self, name, value)


def settings_view(cls: type, arguments: Mapping[str, Any]) -> SimpleNamespace:
    """The settings a ``cls(**arguments)`` would hold, defaults filled in, without building it:
    what :meth:`Checked.check_settings` reads (None where neither is given: see the module)."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        if not f.init:
            continue
        if f.name in arguments:
            values[f.name] = arguments[f.name]
        elif f.default is not MISSING:
            values[f.name] = f.default
        elif f.default_factory is not MISSING:
            values[f.name] = f.default_factory()
        else:
            values[f.name] = None
    return SimpleNamespace(**values)


def check_real(
    owner: str,
    name: str,
    value: object,
    *,
    positive: bool = False,
    nonnegative: bool = False,
) -> float:
    """``float(value)`` if it is a finite real number meeting the sign requirement. A ``bool`` is
    refused: ``temperature=True`` is far likelier a configuration slip than a request for 1.0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}: {name} must be a real number, got {shown(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{owner}: {name} must be finite, got {shown(value)}")
    if positive and not number > 0:
        raise ValueError(f"{owner}: {name} must be > 0, got {shown(value)}")
    if nonnegative and not number >= 0:
        raise ValueError(f"{owner}: {name} must be >= 0, got {shown(value)}")
    return number


def check_int(owner: str, name: str, value: object, *, minimum: int | None = None) -> int:
    """Return ``int(value)`` if it is an integer (not a bool) and at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}: {name} must be an integer, got {shown(value)}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {shown(value)}")
    return number


def check_choice(owner: str, name: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise name the valid ones."""
    valid = tuple(choices)
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"{owner}: {name} must be one of {list(valid)}, got {shown(value)}")
    return value


class Described:
    """What an object of a :class:`Checked` class would say of itself with the settings ``s``,
    none built: the settings, and the class's attributes and properties read on them (a data
    set's ``num_classes`` that depends on its ``labels``). Read only."""

    def __init__(self, cls: type, s: SimpleNamespace) -> None:
        self.__dict__.update(vars(s))
        self.__dict__["_cls"] = cls

    def __getattr__(self, name: str) -> Any:
        attribute = inspect.getattr_static(self._cls, name)
        if isinstance(attribute, property):
            return attribute.fget(self)
        return getattr(self._cls, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._cls.__name__}'s description is read only")


def checked_by(check: Any) -> Any:
    """Decorator for a builder function (a model's, a topology's): ``check(**arguments)`` refuses
    what the builder would refuse, building nothing (see :meth:`Registry.check`)."""

    def mark(builder: Any) -> Any:
        builder.check_arguments = check
        return builder

    return mark
