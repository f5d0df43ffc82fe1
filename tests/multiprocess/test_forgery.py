"""Forged senders against mutual TLS, with real client processes (loopback only).

Before mutual TLS, an outside process that opened its own call to client 0 of a 4-client
network and sent models labelled "from client 1" was believed: the honest mean accuracy fell
from 94 % to 0 %. Here two forgers try the same during a run, with the run's certificates in
place, and the run is compared with the same scenario without them:

- an outsider holding a certificate of another run that names client 1 (it cannot finish a
  TLS handshake with any client of this run);
- a Byzantine member of the run, with its own valid certificate, that claims to be client 1
  (its messages reach the client and are rejected as ``impersonation``).
"""

import json
import threading
import time

import grpc
import pytest
import torch

from dfedrw.launch.local import LocalRun
from dfedrw.peer.transport.identity import load_identity, make_certificates
from dfedrw.peer.wiring.plan import scenario_topology
from dfedrw.peer.results.records import read_rounds
from dfedrw.peer.transport.grpc.tls import channel_credentials, identity_options
from dfedrw.peer.transport.pb import peer_pb2_grpc as pb_grpc
from dfedrw.peer.transport.serde import encode, model_specs
from dfedrw.peer.learning.models import build_model
from tests.support.runs import quiet_console, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROUNDS = 1000
SCENARIO = [
    f"rounds={ROUNDS}", "data.name=digits", "train.lr=0.2", "topology.kind=complete", "topology.honest=4", "topology.byzantine=1",
    "attack.name=gaussian", "network.round_timeout=10", "eval.every=250",
]
# Bounds on the forgers' loops: they stop at the end of the run, or at these.
MAX_ATTEMPTS = 20_000
MAX_SECONDS = 240.0


class Forger(threading.Thread):
    """Sends models labelled ``claim`` to ``address`` (the target client), one round ahead of
    the target as its replies tell, until ``stop`` is set or its bounds are reached."""

    def __init__(self, identity, address, target, claim, vector, specs, stop):
        super().__init__(daemon=True)
        self.identity, self.address, self.target, self.claim = identity, address, target, claim
        self.vector, self.specs, self.stop = vector, specs, stop
        self.replies: dict[str, int] = {}
        self.refused = 0  # attempts that never got a reply: the handshake failed
        self.attempts = 0

    def run(self):
        credentials = channel_credentials(self.identity)
        options = identity_options(self.identity, self.target)
        round_ = 0
        deadline = time.monotonic() + MAX_SECONDS
        with grpc.secure_channel(self.address, credentials, options=options) as channel:
            stub = pb_grpc.PeerStub(channel)
            while not self.stop.is_set() and self.attempts < MAX_ATTEMPTS and time.monotonic() < deadline:
                self.attempts += 1
                try:
                    reply = stub.Push(iter(encode(self.claim, round_ + 1, self.vector, self.specs)), timeout=5)
                except grpc.RpcError:
                    self.refused += 1
                    time.sleep(0.05)
                    continue
                self.replies[reply.reason or "accepted"] = self.replies.get(reply.reason or "accepted", 0) + 1
                round_ = max(round_, reply.round)


def run_network(tmp_path, forge: bool):
    from dfedrw.peer.config.scenario import load_scenario

    scenario = load_scenario(None, SCENARIO)
    topology = scenario_topology(scenario)
    target, claim = sorted(topology.honest())[:2]
    byzantine = min(topology.byzantine)
    certs = tmp_path / "certs"
    make_certificates(scenario.num_clients, certs)
    run = LocalRun(scenario, tmp_path / "run", console=quiet_console(), certs=certs)
    summary: dict = {}
    thread = threading.Thread(target=lambda: summary.update(run.run()), daemon=True)
    forgers = []
    stop = threading.Event()
    thread.start()
    try:
        if forge:
            wait_for(lambda: target in run.children and run.children[target].address, 120, "the target's address", step=0.1)
            address = run.children[target].address
            model = build_model("softmax_regression", 64, 10, seed=0)
            specs = model_specs(model)
            # A sign-flipped, scaled model: what took the unauthenticated network to 0 %.
            vector = -10.0 * torch.ones(sum(s.numel for s in specs))
            make_certificates(scenario.num_clients, tmp_path / "other-run")
            outsider = load_identity(tmp_path / "other-run", claim)
            member = load_identity(certs, byzantine)
            forgers = [Forger(ident, address, target, claim, vector, specs, stop) for ident in (outsider, member)]
            wait_for(lambda: len(read_rounds(tmp_path / "run", target)) >= 1, 120, "the first round", step=0.1)
            for f in forgers:
                f.start()
        thread.join(timeout=600)
        assert not thread.is_alive(), "the run did not finish"
    finally:
        stop.set()
        for f in forgers:
            f.join(timeout=30)
        run.stop_all()
    return summary, forgers, topology


def test_forged_senders_are_refused_and_the_run_is_unchanged(tmp_path):
    clean, _, topology = run_network(tmp_path / "clean", forge=False)
    forged, (outsider, member), _ = run_network(tmp_path / "forged", forge=True)
    target, claim = sorted(topology.honest())[:2]
    byzantine = min(topology.byzantine)

    # The outsider never got a reply: every attempt ended at the TLS handshake.
    assert outsider.attempts > 0 and outsider.refused == outsider.attempts and outsider.replies == {}
    # The member's messages arrived and every one was refused, under its reason.
    assert member.attempts > 0 and "accepted" not in member.replies
    assert sum(member.replies.values()) + member.refused == member.attempts
    final = json.loads((tmp_path / "forged" / "run" / "peers" / f"{target}.json").read_text())
    assert member.replies.get("impersonation", 0) > 0
    # A message is either rejected by the client (impersonation) or, past the sender's rate
    # bound, refused unread by its server (rate_limited): each counted under its reason.
    counted = {**final["refused_calls_by_reason"], **final["rejected_by_reason"]}
    # The client writes its counts when its last round ends; replies its server still gives
    # until it closes are not in them (a handful at most).
    for reason, count in member.replies.items():
        assert counted.get(reason, 0) >= count - 10, (reason, counted)
    # The real client `claim` was heard in every round, as in the run without forgers (before
    # TLS it counted in 21 of 1,500 rounds).
    rounds = read_rounds(tmp_path / "forged" / "run", target)
    assert len(rounds) == ROUNDS
    assert all(str(claim) in r["weights"] for r in rounds)
    # The member was shut out for flooding; the target stopped waiting for it but kept sending
    # to it, so no honest client spent a deadline on another: the forgers cost the network no
    # round (each once waited out every deadline, and the run took 70 times as long).
    log = (tmp_path / "forged" / "run" / "logs" / f"{target}.log").read_text()
    assert f"neighbour {byzantine} is shut out for sending past its rate bound" in log
    for k in sorted(topology.honest()):
        late = [(r["round"], r["missing"]) for r in read_rounds(tmp_path / "forged" / "run", k) if set(r.get("missing", ())) - {byzantine}]
        assert late == [], (k, late)
    assert forged["failed_peers"] == [] and forged["tls"] == "mutual"
    assert abs(forged["honest_mean_accuracy"] - clean["honest_mean_accuracy"]) <= 0.5
    print(
        f"outsider: {outsider.attempts} attempts, {outsider.refused} refused at the handshake; member: {member.attempts} "
        f"attempts, replies {member.replies}, {member.refused} calls ended without a reply (shut out, or client {target} had "
        f"finished); client {target} rejected {final['rejected_by_reason']}, refused {final['refused_calls_by_reason']}; honest "
        f"accuracy {forged['honest_mean_accuracy']:.2f} % with forgers, {clean['honest_mean_accuracy']:.2f} % without; client "
        f"{target}'s round loop {final['loop_seconds']:.1f} s with forgers"
    )
