"""Settings a scenario gives that its run will not use: an attack with no Byzantine client to
run it, a TPM or CRS for clients whose rule scores no neighbour, a hidden width for a model
without a hidden layer, and the like. Each was written expecting an effect and the run goes on
without it, so the launchers (``dfedrw run``, ``compose``, ``sweep``) name each in one line
instead of refusing. Tables of classes not in use (``[attack.alie]`` while ``attack.name =
"gaussian"``) are not listed, as a scenario or grid keeps those for its variants; but when no
client's rule scores its neighbours, every TPM and CRS setting given is listed, unused tables too.
"""

from __future__ import annotations

from dfedrw.peer.quote import shown
from dfedrw.peer.config.scenario import DataConfig, Scenario, TopologyConfig, TrainConfig
from dfedrw.peer.aggregation.rules import takes_tpm_and_crs
from dfedrw.peer.config.aggregation import AggregationConfig, AttackConfig
from dfedrw.peer.config.tables import KIND_REGISTRY
from dfedrw.peer.attacks import ATTACK_REGISTRY

# A value equal to its field's default may never have been written: only other values count.


def unused_settings(scenario: Scenario) -> list[str]:
    """One line for each setting of ``scenario`` that its run will not use, in key order."""
    return [*_attack(scenario), *_aggregation(scenario), *_train(scenario), *_topology(scenario), *_data(scenario)]


def _attack(sc: Scenario) -> list[str]:
    if sc.topology.byzantine:
        return []
    told = []  # (the setting given, what to set instead)
    probe = []
    if sc.attack.name != "none" and hasattr(ATTACK_REGISTRY.resolve(sc.attack.name), "backdoor"):
        # Not unused: the trigger is still measured (scenario_backdoor), the base rate of success.
        probe.append(
            f"attack.name={shown(sc.attack.name)} plants no backdoor: topology.byzantine=0; its trigger is only measured "
            "on the honest models (attack_success is the base rate: triggered inputs a clean model puts in the target class)"
        )
    elif sc.attack.name != "none":
        told.append((f"attack.name={shown(sc.attack.name)}", "attack.name='none'"))
    if sc.attack.colluding:
        told.append(("attack.colluding=true", "attack.colluding=false"))
    for key in ("start", "stop", "period", "on", "scores", "strike", "trusted_rounds"):
        default = getattr(AttackConfig, key)
        if getattr(sc.attack, key) != default:
            told.append((f"attack.{key}={shown(getattr(sc.attack, key))}", f"attack.{key}={shown(default)}"))
    if sc.topology.placement != "random":
        told.append((f"topology.placement={shown(sc.topology.placement)}", "topology.placement='random'"))
    if not told:
        return probe
    return [
        *probe,
        f"{' and '.join(w for w, _ in told)} not used: topology.byzantine=0, no Byzantine client runs an attack "
        f"(set {' and '.join(h for _, h in told)} to say so)",
    ]


def _aggregation(sc: Scenario) -> list[str]:
    """The TPM, CRS and assumed_byzantine settings when no client's rule reads them (a
    ``[peers.K.aggregation]`` config inherits what it does not set from ``[aggregation]``;
    each setting is named by the key that wrote it)."""
    configs = [sc.aggregation_for(k) for k in range(sc.num_clients)]
    top = sc.aggregation
    names = ", ".join(dict.fromkeys(repr(cfg.rule) for cfg in configs))
    scores = any(takes_tpm_and_crs(cfg.rule) for cfg in configs)
    told = any(
        KIND_REGISTRY["rule"].takes(cfg.rule, "num_byzantine") or (takes_tpm_and_crs(cfg.rule) and KIND_REGISTRY["crs"].takes(cfg.crs, "num_byzantine"))
        for cfg in configs
    )
    out = []
    for settings, unread, what in (
        (("tpm", "crs"), not scores, "takes a TPM or CRS"),
        (("assumed_byzantine",), not told, "is told a number of Byzantine neighbours"),
    ):
        if not unread:
            continue
        given: list[str] = []
        for k, cfg in enumerate(configs):
            written = sc.peers.get(k) or {}  # the keys client k's override wrote itself
            for setting in settings:
                value = getattr(cfg, setting)
                if value != getattr(AggregationConfig, setting):
                    prefix = cfg.prefix if setting in written else top.prefix
                    given.append(f"{prefix}.{setting}={shown(value)}")
                if setting in ("tpm", "crs"):
                    given += [cfg.key(setting, name, key) for name, table in cfg.tables(setting).items() for key in table]
        if given:
            out.append(f"{', '.join(dict.fromkeys(given))} not used: no client's rule ({names}) {what}")
    return out


def _train(sc: Scenario) -> list[str]:
    t, out = sc.train, []
    if t.hidden != TrainConfig.hidden and not KIND_REGISTRY["model"].takes(t.model, "hidden"):
        out.append(f"train.hidden={t.hidden} not used: train.model={shown(t.model)} has no hidden width")
    if t.local_epochs and t.local_steps != TrainConfig.local_steps:
        out.append(f"train.local_steps={t.local_steps} not used: train.local_epochs={shown(t.local_epochs)} sets the steps of a round")
    if t.lr_schedule != "step":
        given = [f"train.{k}={shown(getattr(t, k))}" for k in ("lr_gamma", "lr_step") if getattr(t, k) != getattr(TrainConfig, k)]
        if given:
            out.append(f"{', '.join(given)} not used: train.lr_schedule={shown(t.lr_schedule)} is not 'step'")
    return out


def _topology(sc: Scenario) -> list[str]:
    topo = sc.topology
    if topo.rho == TopologyConfig.rho or KIND_REGISTRY["topology"].takes(topo.kind, "rho"):
        return []
    if topo.schedule and KIND_REGISTRY["schedule"].takes(topo.schedule, "rho"):
        return []
    if topo.schedule:
        return [f"topology.rho={topo.rho} not used: neither topology.kind={shown(topo.kind)} nor topology.schedule={shown(topo.schedule)} reads it"]
    return [f"topology.rho={topo.rho} not used: topology.kind={shown(topo.kind)} does not read it"]


def _data(sc: Scenario) -> list[str]:
    data = sc.data
    if data.labelskew_assign != DataConfig.labelskew_assign and not data.partition.startswith("labelskew:"):
        return [f"data.labelskew_assign={shown(data.labelskew_assign)} not used: data.partition={shown(data.partition)} is not labelskew:H"]
    return []
