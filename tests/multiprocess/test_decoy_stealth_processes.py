"""Colluding decoy + stealth as real processes over gRPC with mutual TLS: the two Byzantine
processes agree one plan every round (one decoy, one stealth model, the same plan digest, each
other's pool used), and DFedReweighting's loss clip keeps the stealth model beside the decoy,
while the same stealth model sent without the decoy (``send_decoy = false``) is clipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfedrw.launch.local import LocalRun
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_rounds
from tests.support.runs import quiet_console

pytestmark = pytest.mark.slow

ROUNDS = 12
SETTINGS = [
    "data.name=digits", "topology.honest=5", "topology.byzantine=2", f"rounds={ROUNDS}", "eval.every=0", "train.lr=0.1",
    "attack.name=decoy_stealth", "attack.colluding=true",
    "aggregation.rule=dfedreweighting", "aggregation.tpm=loss", "aggregation.crs=loss_clip_mean",
]


def run(out: Path, send_decoy: bool) -> tuple[dict, dict[int, str]]:
    # With the decoy sending, nobody is silent and a long deadline is never waited out (on a
    # busy machine a missed pool or model would change the plan). A silent decoy is waited for
    # until the deadline every round: there a short one keeps the run short.
    timeout = 30 if send_decoy else 2
    scenario = load_scenario(
        None, [*SETTINGS, f"network.round_timeout={timeout}", f"attack.decoy_stealth.send_decoy={'true' if send_decoy else 'false'}"]
    )
    summary = LocalRun(scenario, out, console=quiet_console()).run()
    assert summary["failed_peers"] == [] and summary["tls"] == "mutual"
    return summary, {int(k): p["role"] for k, p in summary["peers"].items()}


def weights_by_role(out: Path, roles: dict[int, str]) -> dict[str, list[float]]:
    """Every weight an honest client gave a Byzantine sender, by the role that sender played
    in that round (from the Byzantine clients' own records)."""
    byzantine = [k for k, r in roles.items() if r == "byzantine"]
    notes = {b: [r["attack"] for r in read_rounds(out, b)] for b in byzantine}
    found: dict[str, list[float]] = {"decoy": [], "stealth": []}
    for k, role in roles.items():
        if role != "honest":
            continue
        for record in read_rounds(out, k):
            for b in byzantine:
                if str(b) in record["weights"]:
                    found[notes[b][record["round"]]["role"]].append(record["weights"][str(b)])
    return found


def test_colluders_coordinate_and_the_decoy_lets_the_stealth_model_through(tmp_path):
    summary, roles = run(tmp_path / "decoy", send_decoy=True)
    byzantine = sorted(k for k, r in roles.items() if r == "byzantine")

    # They coordinated: each round one decoy and one stealth, one plan, both pools used.
    for r in range(ROUNDS):
        records = [read_rounds(tmp_path / "decoy", b)[r] for b in byzantine]
        assert sorted(rec["attack"]["role"] for rec in records) == ["decoy", "stealth"], records
        assert len({rec["attack"]["plan"] for rec in records}) == 1 and len({rec["attack"]["decoy"] for rec in records}) == 1
        assert all(rec["pooled_from"] == byzantine for rec in records)

    with_decoy = weights_by_role(tmp_path / "decoy", roles)
    assert with_decoy["decoy"] and max(with_decoy["decoy"]) == 0.0, "the decoy itself is clipped"
    assert any(w > 0 for w in with_decoy["stealth"]), "the stealth model should pass the clip the decoy raised"
    assert summary["byzantine_weight_share"] > 0

    # Control: the same plan, the decoy silent: the stealth model alone is clipped every time.
    control, control_roles = run(tmp_path / "alone", send_decoy=False)
    alone = weights_by_role(tmp_path / "alone", control_roles)
    assert alone["decoy"] == [] and alone["stealth"], alone
    assert max(alone["stealth"]) == 0.0, "sent alone, the stealth model should be clipped"
    assert control["byzantine_weight_share"] == 0.0
