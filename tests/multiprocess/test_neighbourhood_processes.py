"""Shared scores as real processes over gRPC with mutual TLS: honest clients send what their
rule measured with each model, the Byzantine ones a framing lie (``attack.scores = "frame"``
or ``"frame_one"``, the rule with and without memory), every message passes the intake, each
Byzantine round record holds the lie it sent (and, striking when trusted, when it struck), and
the neighbourhood rule gives, round for round, the weights of the same scenario on
threads and in the batched engine (the in-process transport is bit-identical; the batched
engine within the parity tolerance of tests/integration/test_engine_parity.py), and as
torchrun workers."""

from __future__ import annotations

import json

import pytest

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_final, read_rounds
from dfedrw.peer.round.byzantine import FRAMED, reported_scores
from dfedrw.peer.wiring.assembly import scenario_plausible
from dfedrw.peer.wiring.plan import scenario_graphs
from tests.support.runs import quiet_console, three_ways, torchrun_scenario, weights_agree

pytestmark = pytest.mark.slow

ROUNDS = 12
SETTINGS = (
    "data.name=digits", "topology.honest=6", "topology.byzantine=2", f"rounds={ROUNDS}", "eval.every=0", "train.lr=0.1",
    "network.round_timeout=30", "data.partition=dirichlet:0.1", "attack.name=gaussian", "network.share_scores=true",
    "aggregation.rule=neighbourhood_reweighting", "aggregation.tpm=loss", "aggregation.crs=loss_drop_highest",
    "aggregation.crs_params.loss_drop_highest.weighting=inverse",
)


@pytest.mark.parametrize(
    ("lie", "extra", "caught"),
    [("frame", (), True), ("frame_one", (), True), ("frame_one", ("attack.name=label_flip", "aggregation.neighbourhood_reweighting.memory=0.75"), False)],
    ids=["frame", "frame_one", "frame_one-labelflip-memory"],
)
def test_framing_liars_against_the_neighbourhood_rule_as_processes(tmp_path, lie, extra, caught):
    # With memory, each process carries its rule's left-out rates from round to round as the
    # batched engine does. Against label flippers that frame one neighbour, the rates change
    # whom two of the 72 honest rounds leave out (measured against the same run without
    # memory), so a process that forgot them would not give the batched engine's weights. A
    # label flipper framing one honest neighbour has that neighbour left out in its place
    # (``caught``: whether the framers are left out in some round).
    settings = (*SETTINGS, f"attack.scores={lie}", *extra)
    scenario = load_scenario(None, list(settings))
    grpc, inproc, _ = three_ways(lambda *s: load_scenario(None, list(s)), settings, tmp_path)

    assert grpc["failed_peers"] == [] and grpc["tls"] == "mutual"
    byzantine = sorted(int(k) for k, p in grpc["peers"].items() if p["role"] == "byzantine")
    honest = sorted(int(k) for k, p in grpc["peers"].items() if p["role"] == "honest")
    graphs = scenario_graphs(scenario)
    most = scenario_plausible(scenario, graphs).max_scores
    # Each Byzantine round record holds the lie its messages carried, the same in every engine.
    for b in byzantine:
        sent = reported_scores(lie, b, graphs.possible(b), set(byzantine), graphs.num_clients, most)
        assert any(v == 100.0 for v in sent.values())
        for out in ("grpc", "inproc", "batched"):
            assert [r["reported"] for r in read_rounds(tmp_path / out, b)] == [{str(k): v for k, v in sorted(sent.items())}] * ROUNDS

    left_out = 0
    for k in honest:
        assert not read_final(tmp_path / "grpc", k)["rejected_by_reason"]  # every score passed the intake
        for p in weights_agree(tmp_path, k, ROUNDS):
            left_out += sum(1 for s in byzantine if p["weights"].get(str(s)) == 0.0)
    assert (left_out > 0) == caught, f"framing neighbours left out {left_out} times"
    for k in honest:
        assert grpc["peers"][str(k)]["accuracy"] == inproc["peers"][str(k)]["accuracy"]


def test_an_attacker_that_strikes_when_trusted_as_processes(tmp_path):
    """``attack.strike = "trusted"``: each Byzantine client reads its standing in the scores its
    honest neighbours send (the Gaussian attacker strikes once two steps in a row ranked it
    trusted, and behaves again once they stop), and decides the same in every engine: what its
    round records say of that (when it attacked, the trusted steps it decided on) is equal as
    processes, on threads and in the batched engine, and the honest clients' weights agree."""
    settings = (*SETTINGS, "attack.strike=trusted", "attack.trusted_rounds=2")
    grpc, _, _ = three_ways(lambda *s: load_scenario(None, list(s)), settings, tmp_path)
    assert grpc["failed_peers"] == [] and grpc["tls"] == "mutual"
    byzantine = sorted(int(k) for k, p in grpc["peers"].items() if p["role"] == "byzantine")
    for b in byzantine:
        notes = {
            out: [{k: v for k, v in r["attack"].items() if k in ("attacking", "trusted_for")} for r in read_rounds(tmp_path / out, b)]
            for out in ("grpc", "inproc", "batched")
        }
        assert notes["grpc"] == notes["inproc"] == notes["batched"]
        struck = [n.get("attacking", True) for n in notes["grpc"]]
        # No report names it in round 0 (nobody aggregated yet): it behaves until it earned two;
        # its Gaussian models are then scored worst, and it behaves again.
        assert struck[:3] == [False] * 3 and True in struck and False in struck[struck.index(True):], notes["grpc"]
        assert all(s == (n["trusted_for"] >= 2) for s, n in zip(struck, notes["grpc"]))
    for k, peer in grpc["peers"].items():
        if peer["role"] == "honest":
            weights_agree(tmp_path, int(k), ROUNDS)


def test_shared_scores_under_torchrun(tmp_path):
    """The same scenario (framing one honest neighbour) as torchrun workers: the scores ride in
    the model header on torch.distributed too, and the rule gives threads' weights bit for bit."""
    settings = [*SETTINGS, "attack.scores=frame_one"]
    rc, output = torchrun_scenario(load_scenario(None, settings), tmp_path / "torchrun")
    assert rc == 0, output[-4000:]
    _, threads = run_scenario(load_scenario(None, [*settings, "network.transport=inproc"]), tmp_path / "inproc", console=quiet_console())
    summary = json.loads((tmp_path / "torchrun" / "summary.json").read_text())
    assert summary["launcher"] == "torchrun" and summary["failed_peers"] == []
    for k, peer in summary["peers"].items():
        torch_rounds, thread_rounds = read_rounds(tmp_path / "torchrun", int(k)), read_rounds(tmp_path / "inproc", int(k))
        if peer["role"] == "byzantine":
            assert [r["reported"] for r in torch_rounds] == [r["reported"] for r in thread_rounds] and FRAMED in torch_rounds[0]["reported"].values()
            continue
        assert not read_final(tmp_path / "torchrun", int(k))["rejected_by_reason"]
        assert [r["weights"] for r in torch_rounds] == [r["weights"] for r in thread_rounds]
        assert peer["accuracy"] == threads["peers"][k]["accuracy"]
