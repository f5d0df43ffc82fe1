"""Registries of named extensions, and the parameter checks every extension class shares.

Every pluggable piece is registered by name in a :class:`Registry` with the ``register``
decorator beside it: the aggregation stack (TPMs, CRSs, rules), the Byzantine attacks, and
the data sets, models, topologies and transports a scenario names::

    @CRS_REGISTRY.register("softmax")
    @dataclass(frozen=True)
    class Softmax(ReweightingStrategy):
        temperature: float = 0.1
        ...

The constructor's keyword parameters (a builder function's, for the kinds that take functions:
models, topologies), with their defaults, *are* its settings: a scenario sets them in the class's
own table (``[aggregation.balance] gamma = 2``, ``[data."mylab:Faces"] size = 32``), and the class
checks them (raising ``ValueError``), once, for every entry point. Parameters whose value the
running system knows (each registry's ``supplied`` names, e.g. a client's number of Byzantine
neighbours, or a model's input features) are passed by :meth:`Registry.build` only to a
constructor that has a parameter of that name, and cannot be set by configuration.

Besides the built-in names, a registry resolves installed plugins (entry points of its group,
``dfedrw.rules``, ``dfedrw.tpms``, ``dfedrw.crs``, ``dfedrw.attacks``, ``dfedrw.datasets``,
``dfedrw.models``, ``dfedrw.topologies``, ``dfedrw.transports``; named by the entry point)
and an import path ``"package.module:Name"`` naming any class (or builder) on ``sys.path``. A typo
in a name or a parameter fails with one line rather than being ignored: unknown names list the
valid ones, unknown parameters the accepted ones.

A class checks its settings in its classmethod ``check_settings`` (:mod:`dfedrw.peer.checked`),
which :meth:`Registry.check` runs without building the class. The ``check_*`` helpers (exported
here and there) word those checks alike, naming the owner, the parameter, the bad value and what
is allowed; they raise ``ValueError`` (never ``assert``, which ``python -O`` strips).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dfedrw.peer.checked import Checked, Described, check_choice, check_int, check_real, settings_view
from dfedrw.peer.quote import shown

__all__ = [
    "SUPPLIED",
    "Registry",
    "Setting",
    "check_choice",
    "export_registered",
    "settings_of",
    "check_int",
    "check_real",
]


# Values the running system gives a rule, TPM, CRS or attack when (and only when) its constructor
# has a parameter of that name; a scenario cannot set them (a registry's default ``supplied``; the
# other kinds name their own). ``tpm``/``crs``: the built TPM and CRS of a rule scored like
# DFedReweighting; ``num_byzantine``: what a robust rule is told of its Byzantine neighbours
# (ALIE: the number of Byzantine clients); ``lr``: the local learning rate; ``seed``: a per-client
# seed; ``num_clients``: all clients; ``total_rounds``: T; ``defence``, ``attacker_data`` and
# ``round_window``: what an attack may know (see peer/attacks/base.py).
SUPPLIED = frozenset({"tpm", "crs", "num_byzantine", "lr", "seed", "num_clients", "total_rounds", "defence", "attacker_data", "round_window"})


@dataclass(frozen=True)
class Setting:
    """A setting: its name, default (``Setting.REQUIRED`` if none) and annotation as written."""

    name: str
    default: Any
    annotation: str

    REQUIRED = inspect.Parameter.empty


def _annotation_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _defines(cls: type, method: str) -> bool:
    return any(method in vars(k) for k in cls.__mro__ if k not in (object, type))


def _takes(method: Any, count: int) -> bool:
    """Whether ``method`` (as found on a class: ``self`` first) accepts ``count`` positional
    arguments after ``self``. True where its signature cannot be read (it is then called as it is)."""
    if isinstance(method, (staticmethod, classmethod)) or not callable(method):
        return True
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*([None] * (count + 1)))
    except TypeError:
        return False
    return True


def _signature_text(method: Any) -> str:
    """``method``'s parameters by name, ``(self, inputs)``: what a message shows."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return "(...)"
    return str(inspect.Signature([p.replace(annotation=inspect.Parameter.empty, default=inspect.Parameter.empty) for p in parameters]))


class Registry(Mapping[str, type]):
    """Name -> class for one kind of pluggable piece, with its settings read off the constructor.

    ``kind`` ("rule", "tpm", "crs", "attack", "dataset", "model", "topology", "transport") words the
    messages; ``group`` is the entry-point group of installed plugins; ``required``: a class defines
    at least one of these methods; ``supplied``: the names the running system gives, never
    configured (:data:`SUPPLIED` unless the kind says otherwise); ``functions``: a builder function
    (its result is what the kind builds) may stand where a class does; ``calls``: how the running
    system calls a class's methods (method -> the names of the positional arguments it passes),
    checked against each class's signature when it registers or is named. ``package``: on first use
    every module of this package is imported, so that every built-in class has registered itself
    with its decorator, wherever it lives (a new module needs no list); ``modules``: the order in
    which their classes are listed (modules not named come after, by name). As a ``Mapping`` it
    holds the built-in and entry-point names; :meth:`resolve` also accepts ``"module:Class"``.
    """

    def __init__(
        self,
        kind: str,
        group: str,
        *,
        package: str | None = None,
        modules: Iterable[str] = (),
        required: Iterable[str] = ("__call__",),
        supplied: Iterable[str] = SUPPLIED,
        functions: bool = False,
        calls: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self._package = package
        self._modules = tuple(modules)
        self._required = tuple(required)
        self.supplied_names = frozenset(supplied)
        self._functions = functions
        self._calls = dict(calls or {})
        self._classes: dict[str, type] = {}
        self._imported = False
        self._plugins: dict[str, importlib.metadata.EntryPoint] | None = None

    # -- registration --------------------------------------------------------------------
    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator: ``@REGISTRY.register("name")``. A name is registered once."""
        if not isinstance(name, str) or not name or ":" in name or "." in name:
            raise ValueError(f"{self.kind} name {shown(name)}: a non-empty string without ':' or '.'")

        def add(cls: type) -> type:
            self.check_class(name, cls)
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(f"{self.kind} {shown(name)} is already registered ({self._classes[name].__qualname__})")
            self._classes[name] = cls
            return cls

        return add

    def check_class(self, name: str, cls: Any) -> None:
        if self._functions and inspect.isfunction(cls):
            return
        if not inspect.isclass(cls):
            what = "a class or a function" if self._functions else "a class"
            raise ValueError(f"{self.kind} {shown(name)}: {shown(cls)} is not {what}")
        if self._required and not any(_defines(cls, method) for method in self._required):
            raise ValueError(f"{self.kind} {shown(name)}: class {cls.__qualname__} has no {' or '.join(self._required)} method")
        for method, arguments in self._calls.items():
            if not _defines(cls, method):
                continue
            found = inspect.getattr_static(cls, method)
            if not _takes(found, len(arguments)):
                kind = f"{'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind}"
                raise ValueError(
                    f"{self.kind} {shown(name)}: {cls.__qualname__}.{method}{_signature_text(found)} cannot be "
                    f"called as {kind}'s {method}({', '.join(arguments)}); is {cls.__qualname__} {kind}?"
                )

    def _import_builtins(self) -> None:
        if not self._imported:
            self._imported = True
            found = []
            if self._package is not None:
                package = importlib.import_module(self._package)
                found = sorted(f"{self._package}.{m.name}" for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
            for module in (*self._modules, *(m for m in found if m not in self._modules)):
                importlib.import_module(module)

    def _entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        if self._plugins is None:
            self._plugins = {ep.name: ep for ep in importlib.metadata.entry_points(group=self.group)}
        return self._plugins

    # -- lookup --------------------------------------------------------------------------
    def builtin_names(self) -> list[str]:
        """Built-in names by the declared order of their modules, then registration order: the
        same list whichever module a program happened to import first."""
        self._import_builtins()
        order = {m: i for i, m in enumerate(self._modules)}
        names = list(self._classes)

        def place(name: str) -> tuple[int, str]:
            module = self._classes[name].__module__
            return (order[module], "") if module in order else (len(order), module)

        return sorted(names, key=place)

    def names(self) -> list[str]:
        """Built-in names in registration order, then installed plugins' names (sorted)."""
        builtin = self.builtin_names()
        return builtin + sorted(n for n in self._entry_points() if n not in self._classes)

    def __getitem__(self, name: str) -> type:
        if name not in self.names():
            raise KeyError(name)
        return self.resolve(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def resolve(self, name: str) -> type:
        """The class registered as ``name``, an installed plugin's, or ``"module:Class"``; a
        ``ValueError`` (one line naming the value) for an unknown name, a module that fails to
        import, a missing attribute, or something that is not a class of this kind."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} must be a name, got {shown(name)}")
        self._import_builtins()
        if name in self._classes:
            return self._classes[name]
        plugins = self._entry_points()
        if name in plugins:
            try:
                cls = plugins[name].load()
            except Exception as exc:  # noqa: BLE001 - any failure of the plugin is reported
                raise ValueError(f"{self.kind} {shown(name)}: plugin {shown(plugins[name].value)} failed to load: {_one_line(exc)}") from None
            self.check_class(name, cls)
            return cls
        if ":" not in name:
            raise ValueError(
                f"unknown {self.kind} {shown(name)}; valid choices: {sorted(self.names())} "
                f"(or an import path 'module:Class')"
            )
        module_name, _, attribute = name.partition(":")
        if not module_name or not attribute:
            raise ValueError(f"{self.kind} {shown(name)}: an import path looks like 'package.module:Class'")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - ImportError, or the module's own error
            raise ValueError(f"{self.kind} {shown(name)}: cannot import module {shown(module_name)}: {_one_line(exc)}") from None
        cls: Any = module
        for part in attribute.split("."):
            if not hasattr(cls, part):
                raise ValueError(f"{self.kind} {shown(name)}: module {shown(module_name)} has no attribute {shown(attribute)}")
            cls = getattr(cls, part)
        self.check_class(name, cls)
        return cls

    # -- settings ------------------------------------------------------------------------
    def settings(self, name: str) -> list[Setting]:
        """The keyword parameters a configuration may set (none the running system supplies)."""
        return [
            Setting(p.name, p.default, _annotation_text(p.annotation))
            for p in _keyword_parameters(self.resolve(name))
            if p.name not in self.supplied_names
        ]

    def parameters(self, name: str) -> list[Setting]:
        """Every keyword parameter of ``name``'s constructor, supplied ones included."""
        return [Setting(p.name, p.default, _annotation_text(p.annotation)) for p in _keyword_parameters(self.resolve(name))]

    def supplied(self, name: str) -> list[str]:
        """The supplied values the class takes."""
        return [p.name for p in _keyword_parameters(self.resolve(name)) if p.name in self.supplied_names]

    def takes(self, name: str, *parameters: str) -> bool:
        """Whether ``name``'s constructor has every one of these parameters (read off the
        signature, so a registered variant of a class is treated as the class is)."""
        accepted = {p.name for p in _keyword_parameters(self.resolve(name))}
        return all(p in accepted for p in parameters)

    def coerce(self, name: str, key: str, value: Any) -> Any:
        """``value`` for setting ``key`` of ``name``, with TOML's numbers fitted to the annotation:
        an integer for a ``float`` becomes a float, an integral float for an ``int`` an integer.
        Raises ``ValueError`` for a key that is not a setting (naming the accepted ones), a
        supplied key, or a boolean for a non-boolean setting; the class checks the rest."""
        settings = {s.name: s for s in self.settings(name)}
        if key in self.supplied_names:
            raise ValueError(f"{shown(key)} is set by the running system and cannot be configured")
        if key not in settings:
            raise ValueError(
                f"{self.kind} {shown(name)} has no setting {shown(key)}; settings: {', '.join(settings) or '(none)'}"
            )
        words = {w.strip() for w in settings[key].annotation.split("|")}
        if isinstance(value, bool):
            if "bool" not in words and settings[key].annotation:
                raise ValueError(f"expected {settings[key].annotation}, got a boolean")
            return value
        if "float" in words and isinstance(value, int):
            return float(value)
        if "int" in words and "float" not in words and isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    def build(self, name: str, params: Mapping[str, Any] | None = None, supplied: Mapping[str, Any] | None = None) -> Any:
        """``cls(**params, **supplied)``: ``params`` checked against the class's settings,
        ``supplied`` passed only where the constructor has a parameter of that name."""
        cls, arguments = self._arguments(name, params, supplied)
        return cls(**arguments)

    def check(self, name: str, params: Mapping[str, Any] | None = None, supplied: Mapping[str, Any] | None = None) -> None:
        """What :meth:`build` refuses, refused (``ValueError``), building nothing where the class
        can check its settings alone (see :meth:`described`)."""
        self.described(name, params, supplied)

    def described(self, name: str, params: Mapping[str, Any] | None = None, supplied: Mapping[str, Any] | None = None) -> Any:
        """What :meth:`check` checks, and something to read ``name``'s attributes from with these
        settings: a :class:`~dfedrw.peer.checked.Described` for a ``Checked`` class (every built-in
        one), None for a builder that declares its check (:func:`~dfedrw.peer.checked.checked_by`),
        nothing built; any other class or builder (a plugin's) built once and thrown away."""
        cls, arguments = self._arguments(name, params, supplied)
        if isinstance(cls, type) and issubclass(cls, Checked):
            s = settings_view(cls, arguments)
            cls.check_settings(s)
            return Described(cls, s)
        if not isinstance(cls, type) and callable(getattr(cls, "check_arguments", None)):
            cls.check_arguments(**arguments)
            return None
        return cls(**arguments)

    def _arguments(self, name: str, params: Mapping[str, Any] | None, supplied: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        """``name``'s class and the keyword arguments it is built with (see :meth:`build`)."""
        cls = self.resolve(name)
        params = dict(params or {})
        accepted = {p.name for p in _keyword_parameters(cls)}
        for key in params:
            if not isinstance(key, str):
                raise ValueError(f"{self.kind} {shown(name)}: parameter names must be strings, got {shown(key)}")
            if key in self.supplied_names or key in (supplied or {}):
                raise ValueError(f"{self.kind} {shown(name)}: {shown(key)} is set by the running system and cannot be configured")
            if key not in accepted:
                settings = [s.name for s in self.settings(name)]
                raise ValueError(
                    f"{self.kind} {shown(name)} has no setting {shown(key)}; settings: {', '.join(settings) or '(none)'}"
                )
        given = {k: v for k, v in (supplied or {}).items() if k in accepted}
        missing = [
            p.name
            for p in _keyword_parameters(cls)
            if p.default is inspect.Parameter.empty and p.name not in params and p.name not in given
        ]
        if missing:
            raise ValueError(f"{self.kind} {shown(name)} requires {', '.join(missing)}")
        return cls, {**given, **params}

    def create(self, name: str, **arguments: Any) -> Any:
        """``name`` built from keyword ``arguments``, settings and supplied values alike (by hand,
        e.g. ``make_crs("softmax", temperature=0.1)``): the checks of :meth:`build`, and a supplied
        value the class does not take is an error, not ignored."""
        supplied = {k: v for k, v in arguments.items() if k in self.supplied_names}
        unused = [k for k in supplied if not self.takes(name, k)]
        if unused:
            settings = [s.name for s in self.settings(name)]
            raise ValueError(f"{self.kind} {shown(name)} has no setting {shown(unused[0])}; settings: {', '.join(settings) or '(none)'}")
        return self.build(name, {k: v for k, v in arguments.items() if k not in supplied}, supplied)

    def describe(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """One row per name: ``name``, ``cls`` (qualified), ``settings``, ``supplied``, ``doc``
        (the docstring's first paragraph, as one line), ``threat`` (an attack's declared threat
        model, in words; None for other kinds or a class that declares none)."""
        rows = []
        for name in self.names() if names is None else names:
            cls = self.resolve(name)
            summary = (inspect.getdoc(cls) or "").strip().split("\n\n")[0]
            rows.append(
                {
                    "name": name,
                    "cls": f"{cls.__module__}.{cls.__qualname__}",
                    "settings": self.settings(name),
                    "supplied": self.supplied(name),
                    "doc": " ".join(summary.split()),
                    "threat": _threat_text(cls),
                }
            )
        return rows


def export_registered(package: str, names: dict[str, Any], *registries: Registry) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package that exports every built-in class of its
    registries by its class name (``from dfedrw.peer.aggregation import Median``) besides its
    own ``names`` (its globals): read off the registries, so no list is kept by hand."""

    def registered() -> dict[str, Any]:
        return {registry.resolve(n).__name__: registry.resolve(n) for registry in registries for n in registry.builtin_names()}

    def getattr_(name: str) -> Any:
        classes = registered()
        if name in classes:
            return classes[name]
        raise AttributeError(f"module {shown(package)} has no attribute {shown(name)}")

    def dir_() -> list[str]:
        return sorted({*names, *registered()})

    return getattr_, dir_


def settings_of(tables: tuple, name: str) -> dict[str, Any]:
    """The settings of ``name`` from a scenario's frozen settings tables (``((name, ((setting,
    value), ...)), ...)``, lists frozen as tuples), as TOML gave them."""

    def thawed(value: Any) -> Any:
        return [thawed(v) for v in value] if isinstance(value, tuple) else value

    for table_name, items in tables:
        if table_name == name:
            return {k: thawed(v) for k, v in items}
    return {}


def _threat_text(cls: Any) -> str | None:
    model = getattr(cls, "threat_model", None)
    describe = getattr(model, "describe", None)
    return describe() if callable(describe) else None


@functools.lru_cache(maxsize=1024)
def _keyword_parameters(cls: Any) -> tuple[inspect.Parameter, ...]:
    """The keyword parameters of ``cls``'s constructor. Read once per class: loading a scenario
    builds and checks dozens of pieces, and ``inspect.signature`` was most of that time."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p for p in inspect.signature(cls).parameters.values() if p.kind in kinds)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
