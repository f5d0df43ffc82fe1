"""Settings checked without building what they configure: ``Registry.check`` runs a class's
``check_settings`` on its settings alone, and loading a scenario builds no data set, model, rule,
TPM, CRS or attack (each is built where a client is wired)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torch import nn

from dfedrw.peer.attacks import ATTACK_REGISTRY, threat_model_of
from dfedrw.peer.checked import Checked, check_real
from dfedrw.peer.config.scenario import ScenarioError, load_scenario
from dfedrw.peer.config.tables import KIND_REGISTRY
from dfedrw.peer.registry import Registry
from dfedrw.peer.wiring.assembly import client_attack, client_rule
from dfedrw.peer.wiring.plan import scenario_topology


@pytest.fixture
def constructions(monkeypatch):
    """The objects of a :class:`Checked` class (data sets, rules, TPMs, CRSs, attacks) and the
    torch modules (models) built since the test began, by class name."""
    built: list[str] = []
    checked, module = Checked.__post_init__, nn.Module.__init__

    def counted(self) -> None:
        built.append(type(self).__name__)
        checked(self)

    def counted_module(self, *args, **kwargs) -> None:
        built.append(type(self).__name__)
        module(self, *args, **kwargs)

    monkeypatch.setattr(Checked, "__post_init__", counted)
    monkeypatch.setattr(nn.Module, "__init__", counted_module)
    return built


def test_check_runs_a_checked_class_s_checks_on_its_settings_alone(constructions):
    registry = Registry("rule", "dfedrw.test-nothing")

    @registry.register("scaled")
    @dataclass(frozen=True)
    class Scaled(Checked):
        num_byzantine: int
        factor: float = 2.0

        @classmethod
        def check_settings(cls, s) -> None:
            s.factor = check_real("Scaled", "factor", s.factor, positive=True)

        def __call__(self, inputs):
            return inputs

    registry.check("scaled", {"factor": 3}, {"num_byzantine": 1, "lr": 0.1})
    with pytest.raises(ValueError, match=r"Scaled: factor must be > 0, got -1"):
        registry.check("scaled", {"factor": -1}, {"num_byzantine": 1})
    with pytest.raises(ValueError, match=r"no setting 'fac'; settings: factor"):
        registry.check("scaled", {"fac": 1})
    with pytest.raises(ValueError, match="requires num_byzantine"):
        registry.check("scaled", {"factor": 1.0})
    assert constructions == []
    built = registry.build("scaled", {"factor": 3}, {"num_byzantine": 1})
    assert constructions == ["Scaled"] and built.factor == 3.0 and isinstance(built.factor, float)  # the normal form kept


def test_check_builds_a_class_that_does_not_check_its_settings_alone_once():
    registry = Registry("rule", "dfedrw.test-nothing")
    built = []

    @registry.register("plain")
    class Plain:
        def __init__(self, factor: float = 2.0):
            if factor <= 0:
                raise ValueError("Plain: factor must be > 0")
            built.append(factor)

        def __call__(self, inputs):
            return inputs

    registry.check("plain", {"factor": 4.0})
    assert built == [4.0]
    with pytest.raises(ValueError, match="Plain: factor must be > 0"):
        registry.check("plain", {"factor": -1.0})


def test_every_built_in_data_set_model_rule_tpm_crs_and_attack_checks_its_settings_alone():
    for kind in ("dataset", "rule", "tpm", "crs", "attack"):
        registry = ATTACK_REGISTRY if kind == "attack" else KIND_REGISTRY[kind]
        unchecked = [name for name in registry.builtin_names() if not issubclass(registry.resolve(name), Checked)]
        assert unchecked == [], f"{kind}: built to be checked: {unchecked}"
    models = KIND_REGISTRY["model"]
    assert [name for name in models.builtin_names() if not callable(getattr(models.resolve(name), "check_arguments", None))] == []


def _every_rule_and_attack() -> list[list[str]]:
    """Scenarios that name every built-in rule (a table for each of its TPM and CRS) and attack."""
    out = [[]]
    for rule in KIND_REGISTRY["rule"].builtin_names():
        out.append(["topology.byzantine=2", "attack.name=gaussian", f"aggregation.rule={rule}", "aggregation.crs=softmax", "aggregation.crs_params.softmax.temperature=0.5"])
    for attack in ATTACK_REGISTRY.builtin_names():
        colluding = threat_model_of(ATTACK_REGISTRY.resolve(attack)).colludes
        out.append(["topology.byzantine=2", f"attack.name={attack}", *(["attack.colluding=true"] if colluding else [])])
    return out


# Every built-in model on a data set it fits (none of these files needs to be here: loading reads none).
MODELS_AND_DATA = [
    ("softmax_regression", "digits", []), ("mlp", "digits", []), ("lenet5", "fashion-mnist", []), ("lenet5", "mnist", []),
    ("femnist_cnn", "femnist", ["data.partition=natural", "train.femnist_cnn.width=64"]), ("resnet20", "cifar10", []),
    ("resnet18", "cifar100", ["data.cifar100.labels=coarse", "train.resnet18.groups=4"]),
]


@pytest.mark.parametrize("model, data, more", MODELS_AND_DATA, ids=lambda x: x if isinstance(x, str) else "")
def test_loading_a_scenario_builds_no_data_set_or_model(model, data, more, constructions, tmp_path):
    scenario = load_scenario(None, [f"data.name={data}", f"train.model={model}", f"data.dir={tmp_path}", *more])
    assert constructions == []
    from dfedrw.peer.learning.datasets import build_dataset
    from dfedrw.peer.learning.models import make_model

    source = build_dataset(data, None, tmp_path)  # what a client builds: each is counted here
    make_model(model, source.num_features, source.num_classes, input_shape=getattr(source, "input_shape", None), params=None)
    assert constructions and scenario.train.model == model


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.name=digits", "train.model=lenet5"], r"train.model='lenet5' with data.name='digits': lenet5 needs images at least 12x12"),
        (["data.name=digits", "train.model=resnet20", "train.resnet20.norm=batch"], r"resnet20: norm='batch' is not valid"),
        (["data.name=fashion-mnist", "train.model=femnist_cnn", "train.femnist_cnn.width=0"], r"femnist_cnn: width must be an integer"),
        (["data.name=cifar10", "train.model=lenet5", "data.augment=crop", "data.name=digits"], r"lenet5 needs images at least 12x12"),
        (["data.name=cifar100", "data.cifar100.labels=middle"], r"cifar100: labels must be one of \['fine', 'coarse'\], got 'middle'"),
    ],
)
def test_a_model_that_does_not_fit_or_a_bad_data_setting_is_refused_building_nothing(overrides, message, constructions):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(None, overrides)
    assert constructions == []


@pytest.mark.parametrize("overrides", _every_rule_and_attack(), ids=lambda o: "-".join(x.split("=")[1] for x in o[1:3]) or "default")
def test_loading_a_scenario_builds_no_rule_tpm_crs_or_attack(overrides, constructions):
    scenario = load_scenario(None, ["data.name=digits", *overrides])
    assert constructions == []  # no data set or model either
    # Where a client is wired, each is built (the count above can see a construction).
    topo = scenario_topology(scenario)
    honest = next(k for k in range(scenario.num_clients) if k not in topo.byzantine)
    client_rule(scenario, topo, honest)
    if topo.byzantine:
        client_attack(scenario, topo, sorted(topo.byzantine)[0])
    assert constructions


def test_a_bad_setting_is_still_refused_at_load_naming_its_key(constructions):
    with pytest.raises(ScenarioError, match=r"^aggregation.crs_params.softmax.temperature=-1.0: Softmax: temperature must be > 0"):
        load_scenario(None, ["aggregation.crs=softmax", "aggregation.crs_params.softmax.temperature=-1.0"])
    with pytest.raises(ScenarioError, match=r"^attack.gaussian.std=0.0: Gaussian: std must be > 0"):
        load_scenario(None, ["topology.byzantine=2", "attack.name=gaussian", "attack.gaussian.std=0.0"])
    with pytest.raises(ScenarioError, match=r"^attack.badnets.trigger_size=0: .*size must be >= 1"):
        load_scenario(None, ["topology.byzantine=2", "attack.name=badnets", "attack.badnets.trigger_size=0"])
    assert constructions == []
