"""Settings a scenario gives that its run will not use (peer/config/unused.py): each named in one line,
by ``dfedrw run`` and ``dfedrw compose`` on stderr and by ``dfedrw sweep`` with its count of
runs; a scenario that uses what it sets gives none."""

import pytest

from dfedrw.experiments.cli import main as sweep_main
from dfedrw.launch.cli import load_told
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.config.unused import unused_settings
from tests.support.sweeps import FAST, write_grid


def unused(*sets: str) -> list[str]:
    return unused_settings(load_scenario(None, list(sets)))


@pytest.mark.parametrize("sets", [
    (),  # the built-in scenario: 2 Byzantine clients and an attack, DFedReweighting
    ("topology.byzantine=0", "attack.name=none"),
    # median is told no count, but client 1's Krum is
    ("aggregation.rule=median", "aggregation.assumed_byzantine=1", "peers.1.aggregation.rule=krum"),
    ("train.model=mlp", "train.hidden=8"),
    ("train.lr_schedule=step", "train.lr_gamma=0.5", "train.lr_step=10", "train.local_epochs=1.0", "train.momentum=0.9"),
    ("topology.rho=0.5",),
    ("topology.kind=ring", "topology.schedule=redraw", "topology.schedule_params.redraw.graph=erdos_renyi", "topology.rho=0.5"),
    ("data.partition='labelskew:4'", "data.labelskew_assign=random"),
    ("aggregation.rule=trimmed_mean", "aggregation.assumed_byzantine=1"),
    # one client scores its neighbours: the [aggregation] TPM is read (client 0 inherits it)
    ("aggregation.rule=median", "aggregation.tpm=accuracy", "peers.0.aggregation.rule=dfedreweighting"),
])
def test_a_scenario_that_uses_what_it_sets_gives_no_line(sets):
    assert unused(*sets) == []


def test_an_attack_without_byzantine_clients_is_named_with_what_to_set():
    assert unused("topology.byzantine=0") == [
        "attack.name='gaussian' not used: topology.byzantine=0, no Byzantine client runs an attack (set attack.name='none' to say so)"
    ]
    assert unused("topology.byzantine=0", "attack.name=decoy_stealth", "attack.colluding=true") == [
        "attack.name='decoy_stealth' and attack.colluding=true not used: topology.byzantine=0, no Byzantine client "
        "runs an attack (set attack.name='none' and attack.colluding=false to say so)"
    ]
    # the attack is already none: only colluding is left to unset
    assert unused("topology.byzantine=0", "attack.name=none", "attack.colluding=true") == [
        "attack.colluding=true not used: topology.byzantine=0, no Byzantine client runs an attack (set attack.colluding=false to say so)"
    ]
    # the attack window and where the attackers sit mean nothing without attackers either
    assert unused("topology.byzantine=0", "attack.name=none", "attack.start=2", "attack.stop=5", "topology.placement=degree") == [
        "attack.start=2 and attack.stop=5 and topology.placement='degree' not used: topology.byzantine=0, no Byzantine client "
        "runs an attack (set attack.start=0 and attack.stop=0 and topology.placement='random' to say so)"
    ]
    # nor when an attacker would strike
    assert unused(
        "topology.byzantine=0", "attack.name=none", "network.share_scores=true", "attack.strike=trusted", "attack.trusted_rounds=3",
    ) == [
        "attack.strike='trusted' and attack.trusted_rounds=3 not used: topology.byzantine=0, no Byzantine client "
        "runs an attack (set attack.strike='schedule' and attack.trusted_rounds=5 to say so)"
    ]


def test_a_backdoor_attack_without_byzantine_clients_is_said_to_measure_only_its_trigger():
    # Not "set attack.name='none'": the trigger still gives the base rate of attack_success.
    assert unused("topology.byzantine=0", "attack.name=badnets") == [
        "attack.name='badnets' plants no backdoor: topology.byzantine=0; its trigger is only measured on the honest "
        "models (attack_success is the base rate: triggered inputs a clean model puts in the target class)"
    ]
    lines = unused("topology.byzantine=0", "attack.name=dba", "attack.colluding=true")
    assert lines[0].startswith("attack.name='dba' plants no backdoor") and lines[1] == (
        "attack.colluding=true not used: topology.byzantine=0, no Byzantine client runs an attack (set attack.colluding=false to say so)"
    )


def test_tpm_and_crs_settings_for_rules_that_score_no_neighbour_are_named_in_one_line():
    lines = unused(
        "aggregation.rule=median", "aggregation.crs=softmax", "aggregation.crs_params.softmax.temperature=0.5",
        "aggregation.tpm_params.combined.loss=0.3",
    )
    assert lines == [
        "aggregation.tpm_params.combined.loss, aggregation.crs='softmax', aggregation.crs_params.softmax.temperature not used: "
        "no client's rule ('median') takes a TPM or CRS"
    ]


def test_a_client_override_is_named_by_its_own_key():
    assert unused("aggregation.rule=dfedavg", "peers.3.aggregation.rule=median", "peers.3.aggregation.tpm=accuracy") == [
        "peers.3.aggregation.tpm='accuracy' not used: no client's rule ('dfedavg', 'median') takes a TPM or CRS"
    ]


def test_a_client_override_equal_to_the_top_value_is_named_by_both_keys():
    # client 3's config equals [aggregation]'s, but both keys were written
    assert unused("aggregation.rule=median", "aggregation.tpm=accuracy", "peers.3.aggregation.tpm=accuracy") == [
        "aggregation.tpm='accuracy', peers.3.aggregation.tpm='accuracy' not used: no client's rule ('median') takes a TPM or CRS"
    ]


def test_an_inherited_table_a_client_overrides_is_named_by_each_key():
    lines = unused(
        "aggregation.rule=median", "aggregation.crs_params.softmax.temperature=0.5", "peers.1.aggregation.crs_params.softmax.temperature=0.5",
    )
    assert lines == [
        "aggregation.crs_params.softmax.temperature, peers.1.aggregation.crs_params.softmax.temperature not used: "
        "no client's rule ('median') takes a TPM or CRS"
    ]


def test_a_tpm_table_of_a_class_not_in_use_is_listed_when_no_rule_scores():
    assert unused("aggregation.rule=median", "aggregation.tpm_params.combined.loss=0.3") == [
        "aggregation.tpm_params.combined.loss not used: no client's rule ('median') takes a TPM or CRS"
    ]


def test_an_inherited_table_and_a_flat_key_are_named_by_the_key_that_wrote_them():
    # client 2 inherits [aggregation]'s softmax table: it is named where it was written
    lines = unused("aggregation.rule=median", "aggregation.crs_params.softmax.temperature=0.5", "peers.2.aggregation.rule=krum")
    assert lines == ["aggregation.crs_params.softmax.temperature not used: no client's rule ('median', 'krum') takes a TPM or CRS"]
    # an earlier version's flat key is named as written
    lines = unused("aggregation.rule=median", "aggregation.temperature=0.5")
    assert lines == ["aggregation.temperature not used: no client's rule ('median') takes a TPM or CRS"]


def test_the_other_settings_a_run_would_not_read():
    assert unused("aggregation.rule=dfedavg", "aggregation.assumed_byzantine=1") == [
        "aggregation.assumed_byzantine=1 not used: no client's rule ('dfedavg') is told a number of Byzantine neighbours"
    ]
    assert unused("train.hidden=8") == ["train.hidden=8 not used: train.model='softmax_regression' has no hidden width"]
    assert unused("topology.kind=ring", "topology.rho=0.5") == ["topology.rho=0.5 not used: topology.kind='ring' does not read it"]
    assert unused("topology.kind=ring", "topology.schedule=edge_failures", "topology.rho=0.5") == [
        "topology.rho=0.5 not used: neither topology.kind='ring' nor topology.schedule='edge_failures' reads it"
    ]
    assert unused("data.labelskew_assign=random") == ["data.labelskew_assign='random' not used: data.partition='iid' is not labelskew:H"]
    assert unused("train.local_epochs=1.0", "train.local_steps=5") == [
        "train.local_steps=5 not used: train.local_epochs=1.0 sets the steps of a round"
    ]
    assert unused("train.lr_schedule=cosine", "train.lr_gamma=0.5", "train.lr_step=10") == [
        "train.lr_gamma=0.5, train.lr_step=10 not used: train.lr_schedule='cosine' is not 'step'"
    ]


def test_the_launchers_print_each_line_as_a_warning_on_stderr(capsys):
    scenario = load_told(None, ["topology.byzantine=0", "train.hidden=8"])

    captured = capsys.readouterr()
    assert scenario.topology.byzantine == 0 and captured.out == ""
    assert captured.err.splitlines() == [f"warning: {line}" for line in unused_settings(scenario)] and len(captured.err.splitlines()) == 2


def test_a_sweep_names_each_line_once_with_its_count_of_runs(tmp_path, capsys):
    grid = write_grid(tmp_path, FAST + """
[axes]
seed = [43, 44]

[[variants.method]]
label = "DFedAvg"
set = ["aggregation.rule=dfedavg", "train.hidden=8"]

[[variants.method]]
label = "Ours"
set = ["aggregation.rule=dfedreweighting"]
""")

    rc = sweep_main(["sweep", str(grid), "--out", str(tmp_path / "out"), "--dry-run"])

    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert rc == 0
    assert warnings == ["warning: 2 of 4 runs: train.hidden=8 not used: train.model='softmax_regression' has no hidden width"]
