"""``network.share_scores`` in the client engine (threads) and the batched engine: each honest
message after a client's first aggregation carries the scores its rule gave, every receiver
takes it, and both engines count the same bytes for them."""

from __future__ import annotations

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.results.records import read_final, read_rounds
from tests.support.runs import quiet_console

ROUNDS = 6
BASE = (
    "data.name=digits", "topology.honest=5", "topology.byzantine=0", "attack.name=none", f"rounds={ROUNDS}", f"eval.every={ROUNDS}",
    "aggregation.rule=dfedreweighting", "network.round_timeout=30",
    # A clock, so that the batched engine counts each link's bytes.
    "links.latency=0.001",
)
ENGINES = {"clients": ("engine.name=clients", "network.transport=inproc"), "batched": ("engine.name=batched",)}


def _bytes(out, k):
    return [r["bytes_sent"] for r in read_rounds(out, k)]


def test_scores_ride_with_the_models_and_both_engines_count_them(tmp_path):
    runs = {}
    for engine, settings in ENGINES.items():
        for share in (False, True):
            sc = load_scenario(None, [*BASE, *settings, f"network.share_scores={str(share).lower()}"])
            runs[engine, share], _ = run_scenario(sc, tmp_path / f"{engine}-{share}", console=quiet_console())
    out = runs["clients", True]
    for k in range(5):
        rounds = read_rounds(out, k)
        receivers = len(rounds[0]["weights"]) - 1  # a fixed graph, nobody missing: its neighbours
        # Round 0 carries no scores; round r those of round r - 1's aggregation: 8 bytes a
        # score and 4 for the two fields, on each link.
        extra = [0] + [receivers * (8 * len(r["scores"]) + 4) for r in rounds[:-1]]
        for engine in ENGINES:
            grown = [a - b for a, b in zip(_bytes(runs[engine, True], k), _bytes(runs[engine, False], k), strict=True)]
            assert grown == extra, (engine, k)
        assert not read_final(out, k)["rejected_by_reason"]
        assert all(r["missing"] == [] for r in rounds)
    # The scores change what is sent, not what is learnt.
    for k in range(5):
        assert [r["weights"] for r in read_rounds(out, k)] == [r["weights"] for r in read_rounds(runs["clients", False], k)]
