"""Configuration: what a scenario says, checked, and nothing built from it.

A scenario is frozen dataclasses read from TOML (:mod:`.scenario`, one section each in
:mod:`.sections` and :mod:`.aggregation`), every key checked as it is read (:mod:`.checks`,
:mod:`.tables` for a class's own settings table, :mod:`.legacy` for the old flat keys), ``--set``
overrides (:mod:`.overrides`), and the settings a run would ignore (:mod:`.unused`). It imports the
registries to check names and settings; :mod:`dfedrw.peer.wiring` builds what a scenario names. Its
API is importable from here (``from dfedrw.peer.config import load_scenario``).
"""

from dfedrw.peer.config.checks import ScenarioError
from dfedrw.peer.config.scenario import (
    DEFAULT_SCENARIO, SCENARIO_DIGEST_ENV, Scenario, dump_scenario, load_scenario, load_validated, scenario_changes,
    scenario_from_dict, scenario_to_dict,
)
from dfedrw.peer.config.aggregation import AggregationConfig, AttackConfig
from dfedrw.peer.config.sections import (
    CheckpointConfig, DataConfig, EngineConfig, EvalConfig, NetworkConfig, TopologyConfig, TrainConfig,
)

__all__ = [
    "DEFAULT_SCENARIO", "SCENARIO_DIGEST_ENV", "AggregationConfig", "AttackConfig", "CheckpointConfig", "DataConfig",
    "EngineConfig", "EvalConfig", "NetworkConfig", "Scenario", "ScenarioError", "TopologyConfig", "TrainConfig",
    "dump_scenario", "load_scenario", "load_validated", "scenario_changes", "scenario_from_dict", "scenario_to_dict",
]
