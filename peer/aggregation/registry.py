"""Name -> factory registries and parameter checks shared by TPMs, CRSs, rules and attacks.

Every pluggable piece of the aggregation stack (and the Byzantine attacks) is chosen by a
name from a plain ``dict[str, type]`` and configured with keyword parameters that usually come
from a scenario file. A typo in either must fail loudly rather than be silently ignored, so all
registries build through :func:`build_from_registry`, which

* rejects an unknown name with a ``ValueError`` listing the valid names,
* rejects a parameter the class's ``__init__`` does not accept, naming it and the accepted ones,
* rejects a missing required parameter, naming it.

The small ``check_*`` helpers give hyper-parameter validation in ``__init__``/``__post_init__``
one wording everywhere: the message names the owner, the parameter, the bad value and what is
allowed. They raise ``ValueError`` (never ``assert``, which ``python -O`` strips).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "build_from_registry",
    "check_choice",
    "check_int",
    "check_real",
]


def build_from_registry(
    kind: str,
    registry: Mapping[str, Any],
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    fixed: Mapping[str, Any] | None = None,
) -> Any:
    """Build ``registry[name](**fixed, **params)`` after checking the name and the parameters.

    ``kind`` ("crs", "tpm", "rule", "attack") only words the error messages. ``fixed`` holds
    arguments the calling code supplies itself (e.g. the TPM and CRS objects of a rule); a user
    parameter of the same name is refused, because letting configuration override them would
    hide which value is really used.
    """
    if not isinstance(name, str) or name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; valid choices: {sorted(registry)}")
    params = dict(params or {})
    fixed = dict(fixed or {})
    factory = registry[name]

    signature = inspect.signature(factory)
    parameters = signature.parameters.values()
    takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    keyword_names = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    accepted = [p for p in keyword_names if p not in fixed]

    for key in params:
        if not isinstance(key, str):
            raise ValueError(f"{kind} {name!r}: parameter names must be strings, got {key!r}")
        if key in fixed:
            raise ValueError(
                f"{kind} {name!r}: parameter {key!r} is set by the caller and cannot be "
                f"configured here; accepted parameters: {accepted}"
            )
        if key not in keyword_names and not takes_any_keyword:
            raise ValueError(
                f"{kind} {name!r} does not accept parameter {key!r}; "
                f"accepted parameters: {accepted}"
            )

    missing = [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in params
        and p.name not in fixed
    ]
    if missing:
        raise ValueError(
            f"{kind} {name!r} requires parameter(s) {missing}; accepted parameters: {accepted}"
        )
    return factory(**fixed, **params)


def check_real(
    owner: str,
    name: str,
    value: object,
    *,
    positive: bool = False,
    nonnegative: bool = False,
) -> float:
    """Return ``float(value)`` if it is a finite real number meeting the sign requirement.

    ``bool`` is refused although Python treats it as an ``int``: ``temperature=True`` is far
    more likely a configuration slip than a request for 1.0.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}: {name} must be a real number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}")
    if positive and not number > 0:
        raise ValueError(f"{owner}: {name} must be > 0, got {value!r}")
    if nonnegative and not number >= 0:
        raise ValueError(f"{owner}: {name} must be >= 0, got {value!r}")
    return number


def check_int(owner: str, name: str, value: object, *, minimum: int | None = None) -> int:
    """Return ``int(value)`` if it is an integer (not a bool) and at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}: {name} must be an integer, got {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value!r}")
    return number


def check_choice(owner: str, name: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise name the valid ones."""
    valid = tuple(choices)
    if not isinstance(value, str) or value not in valid:
        raise ValueError(f"{owner}: {name} must be one of {list(valid)}, got {value!r}")
    return value
