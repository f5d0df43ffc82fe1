"""Acceptance E: malformed and unwanted messages over real gRPC (loopback) are rejected and
counted, and the receiver keeps training. Four clients run as threads in this process."""

import json
from collections import Counter

import grpc
import torch

from dfedrw.peer.transport.identity import load_identity
from dfedrw.peer.transport.grpc.tls import channel_credentials, identity_options
from dfedrw.peer.transport.pb import peer_pb2_grpc as pb_grpc
from dfedrw.peer.transport.serde import TensorSpec, encode
from tests.support.network import run_network


def test_bad_messages_are_rejected_counted_and_training_goes_on(small_scenario, tmp_path):
    # Ring 0-1-2-3-0: client 2 is known but not a neighbour of client 0.
    scenario = small_scenario("topology.kind=ring", "topology.honest=4", "topology.byzantine=0", "attack.name=none", "rounds=40")
    replies = []

    def meddle(peers, addresses):
        target = peers[0]
        specs = target.specs
        good = torch.zeros(sum(s.numel for s in specs))
        nan = good.clone()
        nan[0] = float("nan")
        wrong = tuple(TensorSpec(s.name, s.dtype, tuple(reversed(s.shape))) for s in specs)
        messages = {
            "shape_mismatch": encode(1, 0, good, wrong),
            "non_finite": encode(3, 0, nan, specs),
            "not_neighbour": encode(2, 0, good, specs),
            "future_round": encode(1, 10**6, good, specs),
        }
        for name, chunks in messages.items():
            # Each message sent by the client it names, with that client's own certificate.
            me = load_identity(tmp_path / "certs", chunks[0].header.sender)
            before = Counter(target.inbox.rejected)
            with grpc.secure_channel(addresses[0], channel_credentials(me), options=identity_options(me, 0)) as channel:
                reply = pb_grpc.PeerStub(channel).Push(iter(chunks), timeout=10)
            # The reply comes once the verdict is in: the message counted once, for its reason.
            replies.append((name, reply.accepted, reply.reason, Counter(target.inbox.rejected) - before))

    peers, finals = run_network(scenario, tmp_path, meddle)
    reasons = ("shape_mismatch", "non_finite", "not_neighbour", "future_round")
    assert replies == [(n, False, n, Counter({n: 1})) for n in reasons]
    final = finals[0]
    assert final["rejected_by_reason"] == dict.fromkeys(reasons, 1)
    assert final["rejected_messages"] == 4
    for k in (1, 2, 3):
        assert finals[k]["rejected_messages"] == 0 and finals[k]["rejected_by_reason"] == {}
    # It kept training: every round done, each weighing its own model and those of its
    # neighbours (1 and 3) that arrived in time, never one of the bad messages.
    assert all(f["completed"] for f in finals.values())
    rounds = [json.loads(line) for line in (tmp_path / "peers" / "0.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == list(range(40))
    for r in rounds:
        assert set(r["weights"]) == {"0", "1", "3"} - {str(k) for k in r["missing"]}, r
    assert sum(not r["missing"] for r in rounds) > len(rounds) // 2
