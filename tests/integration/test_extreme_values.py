"""Finite but extreme messages do not move an honest DFedAvg network.

Five messages with values near float32's largest (3.4e38) and one declaring 2^64 - 1 samples
are delivered to client 0 in its neighbours' names, for rounds in its window, before any
neighbour sent its own: had they been accepted they would have taken those neighbours' slots
and been averaged in. They are rejected, so the run is the run without them, to the last bit:
every client's model follows the same messages in the same rounds (each round waits for every
neighbour, training is seeded), so the accuracies are compared exactly.

A control (slow) with the bound raised (``network.max_abs_value = 3e38``) and values just
under it shows that the same injection, believed, does move the network.
"""

import pytest
import torch

from dfedrw.peer.results.records import read_rounds
from dfedrw.peer.transport.inproc import InprocHub, InprocTransport
from dfedrw.peer.transport.serde import encode
from tests.support.network import ClientThreads

U64 = 2**64 - 1


def run(scenario, out_dir, inject=None):
    hub = InprocHub()
    net = ClientThreads(scenario, out_dir, lambda k: InprocTransport(hub, f"inproc:{k}"))
    verdicts = inject(net.peers[0]) if inject else []
    net.start()
    net.join(timeout=300)
    net.check()
    return net.finals, verdicts


def injector(value):
    def inject(peer):
        d = sum(s.numel for s in peer.specs)
        a, b = peer.neighbours
        huge = torch.full((d,), value)
        extreme = [(a, 0), (a, 1), (a, 2), (b, 0), (b, 1)]
        verdicts = [peer.deliver(iter(encode(k, r, huge, peer.specs, num_samples=100)), k)[:2] for k, r in extreme]
        # A plausible model declaring every sample there could be, and then some.
        verdicts.append(peer.deliver(iter(encode(b, 2, torch.zeros(d), peer.specs, num_samples=U64)), b)[:2])
        return verdicts

    return inject


def train_losses(out_dir, k):
    """Client k's training loss in every round: the same to the last bit when its model is."""
    return [r["train_loss"] for r in read_rounds(out_dir, k)]


def accuracies(finals):
    return {k: (f["accuracy"], f["global_accuracy"]) for k, f in sorted(finals.items())}


SETTINGS = ("topology.kind=ring", "topology.honest=4", "topology.byzantine=0", "attack.name=none",
            "aggregation.rule=dfedavg", "aggregation.dfedavg_weighting=data_size", "rounds=30", "train.lr=0.2")


def test_extreme_values_and_sizes_do_not_move_honest_accuracy(small_scenario, tmp_path):
    # A generous deadline: no message may miss it on a busy machine, or the runs would differ.
    scenario = small_scenario(*SETTINGS, "network.round_timeout=30")
    clean, _ = run(scenario, tmp_path / "clean")
    attacked, verdicts = run(scenario, tmp_path / "attacked", injector(3.4e38))

    assert verdicts == [(False, "implausible")] * 5 + [(False, "implausible_samples")]
    assert attacked[0]["rejected_by_reason"] == {"implausible": 5, "implausible_samples": 1}
    print(f"\naccuracy (local %, global %) without injection {accuracies(clean)}\n"
          f"accuracy (local %, global %) with injection    {accuracies(attacked)}")
    assert accuracies(attacked) == accuracies(clean)
    assert min(a for a, _ in accuracies(clean).values()) > 50.0


@pytest.mark.slow
def test_the_same_injection_believed_moves_the_network(small_scenario, tmp_path):
    """The control: with the bound raised above the injected values they are accepted, client 0's
    model overflows, its neighbours reject what it sends as non-finite, and every client's
    training moves. (Its final accuracy need not: the network recovers within the 30 rounds, and
    a few hundred test samples can miss what is left of the difference.)"""
    clean, _ = run(small_scenario(*SETTINGS, "network.round_timeout=30"), tmp_path / "clean")
    loose = small_scenario(*SETTINGS, "network.round_timeout=2", "network.max_abs_value=3e38")
    believed, verdicts = run(loose, tmp_path / "believed", injector(2.9e38))
    print(f"\naccuracy (local %, global %) without injection {accuracies(clean)}\n"
          f"accuracy (local %, global %) when believed    {accuracies(believed)}")
    assert verdicts[:5] == [(True, "")] * 5
    assert sum(believed[k]["rejected_by_reason"].get("non_finite", 0) for k in believed) > 0
    assert all(train_losses(tmp_path / "believed", k) != train_losses(tmp_path / "clean", k) for k in clean)
