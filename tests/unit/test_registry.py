"""Registries of rules, TPMs, CRSs and attacks: settings tables, supplied values, plugins,
legacy keys, run identity, `dfedrw list` and the generated tables of docs/reference.md."""

import hashlib
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from dfedrw.peer.aggregation import Balance, DFedReweighting, Loss, LossClippedAtMean, MultiKrum, Softmax
from dfedrw.peer.registry import Registry
from dfedrw.peer.attacks import ALIE, Gaussian
from dfedrw.peer.config.scenario import Scenario, ScenarioError, dump_scenario, load_scenario, scenario_changes, scenario_from_dict
from dfedrw.peer.config.legacy import LEGACY
from dfedrw.peer.kinds.catalog import REGISTRIES, render_readme
from dfedrw.peer.wiring.build import build_attack, build_client_rule

ROOT = Path(__file__).resolve().parents[2]


def _load(text: str) -> Scenario:
    return scenario_from_dict(tomllib.loads(text))


# -- the Registry class -------------------------------------------------------------------------


def test_registry_register_resolve_build_describe():
    registry = Registry("rule", "dfedrw.test-nothing")

    @registry.register("scaled")
    class Scaled:
        """Scale everything. Second line."""

        def __init__(self, factor: float = 2.0, num_byzantine: int = 0):
            if factor <= 0:
                raise ValueError(f"Scaled: factor must be > 0, got {factor!r}")
            self.factor, self.num_byzantine = factor, num_byzantine

        def __call__(self, inputs):
            return inputs

    assert registry.names() == ["scaled"] and "scaled" in registry and registry["scaled"] is Scaled
    built = registry.build("scaled", {"factor": 3}, {"num_byzantine": 4, "lr": 0.1})
    assert (built.factor, built.num_byzantine) == (3, 4)
    [row] = registry.describe()
    assert row["doc"] == "Scale everything. Second line." and row["supplied"] == ["num_byzantine"]
    assert [(s.name, s.default) for s in row["settings"]] == [("factor", 2.0)]
    assert registry.coerce("scaled", "factor", 3) == 3.0 and isinstance(registry.coerce("scaled", "factor", 3), float)
    with pytest.raises(ValueError, match="set by the running system"):
        registry.build("scaled", {"num_byzantine": 1})
    with pytest.raises(ValueError, match=r"no setting 'fac'; settings: factor"):
        registry.build("scaled", {"fac": 1})
    with pytest.raises(ValueError, match="already registered"):
        registry.register("scaled")(type("Other", (), {"__call__": lambda self: None}))
    with pytest.raises(ValueError, match="has no __call__"):
        registry.register("plain")(type("Plain", (), {}))


def test_a_class_signature_is_read_once_and_each_class_keeps_its_own(monkeypatch):
    import inspect

    registry = Registry("rule", "dfedrw.test-nothing")

    @registry.register("first")
    class First:
        def __init__(self, alpha: float = 1.0):
            self.alpha = alpha

        def __call__(self, inputs):
            return inputs

    @registry.register("second")
    class Second(First):
        def __init__(self, beta: int = 2):
            self.beta = beta

    read = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda obj, *a, **kw: (read.append(obj), real(obj, *a, **kw))[1])
    for _ in range(3):
        assert [(s.name, s.default) for s in registry.settings("first")] == [("alpha", 1.0)]
        assert [(s.name, s.default) for s in registry.settings("second")] == [("beta", 2)]
        assert registry.build("first", {"alpha": 3.0}).alpha == 3.0
    assert sorted(map(id, read)) == sorted([id(First), id(Second)])


def test_import_path_errors_are_one_line_naming_the_value():
    from dfedrw.peer.aggregation import RULE_REGISTRY

    assert RULE_REGISTRY.resolve("dfedrw.peer.aggregation.coordinate:Median").__name__ == "Median"
    for value, words in [
        ("no_such_module_xyz:Rule", "cannot import module 'no_such_module_xyz'"),
        ("dfedrw.peer.aggregation.baselines:Nope", "has no attribute 'Nope'"),
        ("dfedrw.peer.aggregation.baselines:math", "is not a class"),
        ("dfedrw.peer.aggregation.rules:RoundInputs", "has no __call__"),
    ]:
        with pytest.raises(ScenarioError) as err:
            load_scenario(None, [f"aggregation.rule='{value}'"])
        message = str(err.value)
        assert message.startswith(f"aggregation.rule='{value}': ") and words in message and "\n" not in message


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        # A class of another kind, named where this kind is asked for: refused at load, not by a
        # TypeError mid-run.
        ("attack.name", "dfedrw.peer.aggregation.coordinate:Median",
         "Median.__call__(self, inputs) cannot be called as an attack's __call__(received, receiver, generator); is Median an attack?"),
        ("aggregation.rule", "dfedrw.peer.attacks.classic:SignFlip",
         "SignFlip.__call__(self, received, receiver, generator) cannot be called as a rule's __call__(inputs)"),
        ("aggregation.tpm", "dfedrw.peer.aggregation.crs:Softmax", "cannot be called as a tpm's __call__(candidates, evaluate)"),
        ("aggregation.crs", "dfedrw.peer.aggregation.tpm:Loss", "cannot be called as a crs's __call__(scores)"),
    ],
)
def test_a_class_of_another_kind_is_refused_at_load_in_one_line(key, value, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(None, [f"{key}='{value}'"])
    assert str(err.value).startswith(f"{key}='{value}': ") and words in str(err.value) and "\n" not in str(err.value)


def test_methods_are_checked_against_how_the_kind_calls_them():
    registry = Registry("attack", "dfedrw.test-nothing", required=("__call__", "plan"),
                        calls={"__call__": ("received", "receiver", "generator"), "plan": ("view", "generator")})

    class Flexible:  # defaults, *args and a plan alone all take the call
        def __call__(self, received, receiver=0, *rest, generator=None):
            return received

    class Planner:
        def plan(self, view, generator):
            return view

    class Sloppy:
        def __call__(self, *args, **kwargs):
            return None

    for cls in (Flexible, Planner, Sloppy):
        assert registry.register(cls.__name__.lower())(cls) is cls

    class TooFew:
        def __call__(self, received):
            return received

    class TooMany:
        def plan(self, view, generator, extra):
            return view

    class KeywordOnly:
        def __call__(self, *, received, receiver, generator):
            return received

    for cls, method in ((TooFew, "__call__"), (TooMany, "plan"), (KeywordOnly, "__call__")):
        with pytest.raises(ValueError, match=rf"{cls.__name__}\.{method}\(.*\) cannot be called as an attack's {method}\("):
            registry.register(cls.__name__.lower())(cls)
    assert "toofew" not in registry and registry.names() == ["flexible", "planner", "sloppy"]


def test_every_built_in_class_takes_its_kinds_calls():
    # A registry checks each class as it registers: every built-in of every kind loads. The
    # kinds whose classes the system calls say how; models, topologies (builders) and
    # transports (a placement) have no method to check.
    checked = {kind for kind, registry in REGISTRIES.items() if registry._calls}
    assert checked == {"rules", "tpms", "crs", "attacks", "datasets", "schedules"}
    for registry in REGISTRIES.values():
        assert all(registry.resolve(name) for name in registry.names())


def test_a_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_lab.py").write_text("raise RuntimeError('half-written\\nmodule')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ScenarioError) as err:
        load_scenario(None, ["attack.name='broken_lab:Attack'"])
    assert str(err.value) == (
        "attack.name='broken_lab:Attack': attack 'broken_lab:Attack': cannot import module 'broken_lab': "
        "RuntimeError: half-written module"
    )


def test_entry_point_plugins_are_listed_and_resolved(monkeypatch):
    from importlib.metadata import EntryPoint

    from dfedrw.peer.aggregation import CRS_REGISTRY

    ep = EntryPoint(name="lab_softmax", value="dfedrw.peer.aggregation.crs:Softmax", group="dfedrw.crs")
    monkeypatch.setattr(CRS_REGISTRY, "_plugins", {"lab_softmax": ep})
    assert CRS_REGISTRY.names()[-1] == "lab_softmax" and CRS_REGISTRY.resolve("lab_softmax") is Softmax
    s = load_scenario(None, ["aggregation.crs=lab_softmax", "aggregation.crs_params.lab_softmax.temperature=2"])
    assert s.aggregation.params("crs") == {"temperature": 2.0}


def test_a_docstring_summary_wrapped_over_lines_is_described_whole():
    # Prepare
    registry = Registry("rule", "dfedrw.test-nothing")

    @registry.register("wrapped")
    class Wrapped:
        """A summary that a line of the source
        cannot hold.

        The rest is not part of it.
        """

        def __call__(self, inputs):
            return inputs

    # Execute
    [row] = registry.describe()

    # Assert
    assert row["doc"] == "A summary that a line of the source cannot hold."


# -- settings tables in a scenario ------------------------------------------------------------------


def test_settings_live_in_each_class_table():
    s = _load(
        """
        [topology]
        byzantine = 2
        [attack]
        name = "alie"
        [attack.alie]
        z = 1
        [aggregation]
        rule = "balance"
        [aggregation.balance]
        gamma = 3
        [aggregation.crs_params.softmax]
        temperature = 0.5
        [aggregation.tpm_params.combined]
        accuracy = 1
        [peers.3.aggregation]
        rule = "dfedreweighting"
        tpm = "combined"
        crs = "softmax"
        [peers.3.aggregation.crs_params.softmax]
        scale = 1
        """
    )
    assert s.aggregation.params("rule") == {"gamma": 3.0}
    assert s.attack.params() == {"z": 1.0}
    own = s.aggregation_for(3)
    assert own.params("crs") == {"temperature": 0.5, "scale": 1.0} and own.params("tpm") == {"accuracy": 1.0}
    assert build_client_rule(s, 0, 2, 0.01, 7) == Balance(gamma=3.0)
    rule = build_client_rule(s, 3, 2, 0.01, 7)
    assert isinstance(rule, DFedReweighting) and rule.crs == Softmax(0.5, 1.0) and rule.tpm.accuracy == 1.0
    attack = build_attack(s, 12, 2)
    assert attack == ALIE(z=1.0, num_clients=12, num_byzantine=2)


def test_supplied_values_cannot_be_set():
    for key in ["aggregation.trimmed_mean.num_byzantine=2", "aggregation.qfdfl.lr=0.1", "aggregation.flame.seed=3",
                "attack.alie.num_clients=5", "peers.2.aggregation.krum.num_byzantine=1"]:
        with pytest.raises(ScenarioError) as err:
            load_scenario(None, [key])
        name, _, value = key.partition("=")
        assert str(err.value).startswith(f"{name}={value}: ") and "set by the running system" in str(err.value)


def test_bad_value_names_key_value_and_what_is_allowed():
    with pytest.raises(ScenarioError) as err:
        load_scenario(None, ["aggregation.rule=balance", "aggregation.balance.gamma=-1"])
    assert str(err.value) == "aggregation.balance.gamma=-1.0: Balance: gamma must be > 0, got -1.0"
    with pytest.raises(ScenarioError, match=r"^attack.std=0.0: Gaussian: std must be > 0"):
        load_scenario(None, ["attack.std=0"])
    with pytest.raises(ScenarioError, match=r"^aggregation.crs_params.softmax.temp=.*no setting 'temp'; settings: temperature, scale"):
        load_scenario(None, ["aggregation.crs_params.softmax.temp=1"])
    with pytest.raises(ScenarioError, match=r"^unknown key 'aggregation.nope'.*balance"):
        load_scenario(None, ["aggregation.nope.x=1"])
    # A table of a class not in use is checked too; a combination error names the table.
    with pytest.raises(ScenarioError, match=r"^aggregation.tpm_params.combined: WeightedCombination: accuracy and loss"):
        load_scenario(None, ["aggregation.tpm_params.combined.accuracy=0", "aggregation.tpm_params.combined.loss=0"])


def test_alie_is_checked_with_the_true_counts_at_load():
    with pytest.raises(ScenarioError, match=r"^attack.alie: ALIE: s = "):
        load_scenario(None, ["attack.name=alie", "topology.honest=2", "topology.byzantine=3"])


# -- legacy keys and identity ---------------------------------------------------------------------


LEGACY_VALUES = {
    "aggregation.temperature": 0.5, "aggregation.accuracy_scale": 1.0, "aggregation.loss_clip_weighting": "inverse",
    "aggregation.clip_threshold": 2.0, "aggregation.tpm_accuracy_weight": 1.0, "aggregation.tpm_loss_weight": -1.0,
    "aggregation.dfedavg_weighting": "uniform", "aggregation.multi_krum_m": 3, "aggregation.flame_noise": 0.01,
    "aggregation.flame_cluster_on": "models", "aggregation.balance_gamma": 3.0, "aggregation.balance_kappa": 0.5,
    "aggregation.balance_alpha": 0.2, "aggregation.q": 0.5, "attack.std": 5.0, "attack.center": "zero",
    "attack.scale": -4.0, "attack.z": 1.5,
}


def _new_key(legacy: str) -> str:
    kind, name, setting = LEGACY[legacy]
    return {"rule": f"aggregation.{name}", "tpm": f"aggregation.tpm_params.{name}",
            "crs": f"aggregation.crs_params.{name}", "attack": f"attack.{name}"}[kind] + f".{setting}"


@pytest.mark.parametrize("legacy", sorted(LEGACY))
def test_legacy_flat_keys_map_to_the_class_tables(legacy):
    value = tomli_w.dumps({"v": LEGACY_VALUES[legacy]})[4:].strip()
    old = load_scenario(None, [f"{legacy}={value}"])
    new = load_scenario(None, [f"{_new_key(legacy)}={value}"])
    assert old == new and scenario_changes(old) == scenario_changes(new)
    # The identity still uses the old flat key, as earlier versions wrote it.
    section, _, key = legacy.partition(".")
    assert scenario_changes(new)[section][key] == LEGACY_VALUES[legacy]
    # Per client too.
    if section == "aggregation":
        over = load_scenario(None, [f"peers.1.{legacy}={value}"]).aggregation_for(1)
        assert over == new.aggregation


def test_legacy_spellings_of_unset():
    s = load_scenario(None, ["aggregation.multi_krum_m=0", "attack.z='auto'", "aggregation.multi_krum.m=4", "peers.2.aggregation.multi_krum_m=0"])
    assert s.attack.params("alie") == {} and s.aggregation.params("rule", "multi_krum") == {"m": 4}
    assert s.aggregation_for(2).params("rule", "multi_krum") == {}
    assert build_client_rule(load_scenario(None, ["aggregation.rule=multi_krum"]), 0, 2, 0.01, 0) == MultiKrum(2)


def test_nested_form_round_trips_and_keeps_its_identity(tmp_path):
    s = load_scenario(None, ["aggregation.rule=geometric_median", "aggregation.geometric_median.max_iter=5",
                             "aggregation.balance_gamma=3", "peers.2.aggregation.crs_params.softmax.temperature=0.5"])
    dump_scenario(s, tmp_path / "s.toml")
    text = (tmp_path / "s.toml").read_text()
    assert "[aggregation.geometric_median]" in text and "balance_gamma" not in text
    again = load_scenario(tmp_path / "s.toml")
    assert again == s and scenario_changes(again) == scenario_changes(s)
    assert scenario_changes(s)["aggregation"]["geometric_median"] == {"max_iter": 5}


def test_default_values_given_explicitly_do_not_change_the_identity():
    plain = load_scenario(None, [])
    explicit = load_scenario(None, ["aggregation.balance.gamma=2", "attack.gaussian.std=30", "aggregation.temperature=0.1"])
    assert plain == explicit and scenario_changes(plain) == scenario_changes(explicit)


COMMITTED_RUNS = sorted((ROOT / "docs" / "results" / "data").glob("*/runs/*/scenario.toml"))


def test_every_committed_run_keeps_its_folder_hash():
    from dfedrw.experiments.sweep_plan import scenario_key

    assert len(COMMITTED_RUNS) > 100
    wrong = []
    for path in COMMITTED_RUNS:
        recorded = path.parent.name.rsplit("-", 1)[1]
        scenario = load_scenario(path)
        key = hashlib.sha256(tomli_w.dumps(scenario_changes(scenario)).encode("utf-8")).hexdigest()[:10]
        assert key == scenario_key(scenario)
        if key != recorded:
            wrong.append(f"{path.parent.name}: {key}")
    assert not wrong, wrong


# -- listing and the reference tables -------------------------------------------------------------


def test_reference_page_registry_tables_are_what_the_registries_render():
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    for kind in REGISTRIES:
        assert f"<!-- registry:{kind} -->" in page and f"<!-- /registry:{kind} -->" in page
    assert render_readme(page) == page, "docs/reference.md tables are stale: run `dfedrw list --readme docs/reference.md`"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# notes\nno tables here\n", "no <!-- registry:KIND --> marker"),
        ("<!-- registry:rules -->\nold\n", "markers without their pair: rules"),
    ],
)
def test_a_page_without_a_whole_pair_of_markers_is_refused_not_called_up_to_date(text, message, tmp_path, capsys):
    # Prepare
    from dfedrw.experiments.cli import main

    page = tmp_path / "page.md"
    page.write_text(text)

    # Execute
    code = main(["list", "--readme", str(page)])

    # Assert
    assert code == 2 and message in capsys.readouterr().err and page.read_text() == text


def test_dfedrw_list_prints_names_settings_and_summaries(capsys):
    from dfedrw.experiments.cli import main

    assert main(["list", "rules"]) == 0
    out = capsys.readouterr().out
    assert "balance" in out and "gamma: float = 2.0" in out and "BALANCE: accept neighbours" in out
    assert main(["list", "crs", "--plugin", "dfedrw.peer.aggregation.crs:Softmax"]) == 0
    assert "dfedrw.peer.aggregation.crs:Softmax" in capsys.readouterr().out
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(f"{kind} (settings" in out for kind in REGISTRIES)
    assert main(["list", "attacks", "--plugin", "nope_mod:X"]) == 2
    assert "cannot import module 'nope_mod'" in capsys.readouterr().err


def test_a_registry_finds_every_module_of_its_package_and_lists_them_in_the_declared_order(tmp_path, monkeypatch):
    # Prepare: a package of three modules, one of them named in the order, one private
    import sys

    from dfedrw.peer.registry import Registry

    package = tmp_path / "reg_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from dfedrw.peer.registry import Registry\nREG = Registry('rule', 'none.group', package='reg_pkg', modules=('reg_pkg.zeta',))\n")
    for module, name in (("alpha", "a"), ("zeta", "z"), ("_private", "p")):
        (package / f"{module}.py").write_text(
            f"from reg_pkg import REG\n\n@REG.register('{name}')\nclass C:\n    def __call__(self, x):\n        return x\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))

    # Execute
    registry = __import__("reg_pkg").REG
    names = registry.builtin_names()

    # Assert: zeta first (declared), then alpha (found); a private module is not imported
    assert isinstance(registry, Registry) and names == ["z", "a"]
    assert "reg_pkg._private" not in sys.modules
    for m in [m for m in sys.modules if m.startswith("reg_pkg")]:
        monkeypatch.delitem(sys.modules, m)
