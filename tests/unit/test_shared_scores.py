"""Scores on the wire (``network.share_scores``): what a model message carries of its sender's
last aggregation, how a receiver checks it, and what it costs in bytes."""

from __future__ import annotations

import math

import pytest
import torch

from dfedrw.engines.network import message_bytes
from dfedrw.peer.client.client import Client
from dfedrw.peer.config.scenario import ScenarioError, load_scenario
from dfedrw.peer.transport.inproc import InprocHub, InprocTransport
from dfedrw.peer.transport.serde import Plausible, WireError, decode, encode, join_chunks, shareable
from dfedrw.peer.wiring.assembly import scenario_plausible
from dfedrw.peer.wiring.plan import scenario_graphs

ROUND = 5


@pytest.fixture
def client(small_scenario, tmp_path):
    """Client 0 of a 4-ring (neighbours 1 and 3) at round ROUND."""
    peer = Client(small_scenario("topology.kind=ring", "topology.honest=4", "topology.byzantine=0"), 0, tmp_path, transport=InprocTransport(InprocHub(), "inproc:0"))
    peer.inbox.advance(ROUND)
    try:
        yield peer
    finally:
        peer.close()


def _message(peer: Client, scores, sender: int = 1, r: int = ROUND):
    d = sum(s.numel for s in peer.specs)
    return encode(sender, r, torch.ones(d), peer.specs, num_samples=10, scores=scores, chunk_bytes=1024)


def test_a_message_carries_its_scores_under_its_checksum(client):
    chunks = _message(client, {3: 0.1, 0: -2.5, 1: 1e-3})
    header, payload, wire = join_chunks(iter(chunks), 1 << 20)
    message = decode(header, payload, client.specs, wire, client.plausible)
    # Ids ascending, values as float32.
    assert list(header.scored) == [0, 1, 3]
    assert message.scores == {0: -2.5, 1: pytest.approx(1e-3, rel=1e-7), 3: pytest.approx(0.1, rel=1e-7)}
    assert message.scores[1] == float(torch.tensor(1e-3, dtype=torch.float32))
    # A score changed on the way fails the checksum, as a payload byte would.
    header.scores[0] = -2.0
    with pytest.raises(WireError) as err:
        decode(header, payload, client.specs, wire, client.plausible)
    assert err.value.reason == "bad_checksum"
    # A message without scores decodes to none.
    header, payload, wire = join_chunks(iter(_message(client, None)), 1 << 20)
    assert decode(header, payload, client.specs, wire, client.plausible).scores == {}


def test_the_receiver_keeps_a_messages_scores(client):
    assert client.deliver(iter(_message(client, {0: 0.5, 1: 0.25, 2: 4.0})), 1) == (True, "", ROUND)
    got = client.inbox.wait(ROUND, [1], timeout=1.0)
    assert got[1].scores == {0: 0.5, 1: 0.25, 2: 4.0}


@pytest.mark.parametrize("ids, values, why", [
    ([0, 1], [0.5], "2 ids for 1 scores"),
    ([0, 1, 2, 3], [0.1] * 4, "4 scores, more than the 3 candidates"),
    ([1, 1], [0.1, 0.2], "an id scored twice"),
    ([0, 4], [0.1, 0.2], "scores id 4, not a client of 0..3"),
    ([0, 2**32 - 1], [0.1, 0.2], "not a client of 0..3"),
    ([0, 1], [0.5, math.nan], "NaN or Inf"),
    ([0], [math.inf], "NaN or Inf"),
    ([0], [-math.inf], "NaN or Inf"),
])
def test_implausible_scores_are_refused_and_counted(client, ids, values, why):
    chunks = _message(client, None)
    chunks[0].header.scored.extend(ids)
    chunks[0].header.scores.extend(values)
    before = client.inbox.rejected["implausible_scores"]
    assert client.deliver(iter(chunks), 1) == (False, "implausible_scores", ROUND)
    assert client.inbox.rejected["implausible_scores"] == before + 1 and client.inbox.accepted == 0
    assert why in str(Plausible(clients=4, max_scores=3).scores_error(ids, values))


def test_a_receiver_bounds_scores_by_the_most_candidates_a_client_has(small_scenario):
    for settings, clients, most in (
        (("topology.kind=ring", "topology.honest=6", "topology.byzantine=0"), 6, 3),
        (("topology.kind=complete", "topology.honest=5", "topology.byzantine=1"), 6, 6),
    ):
        sc = small_scenario(*settings)
        plausible = scenario_plausible(sc, scenario_graphs(sc))
        assert (plausible.clients, plausible.max_scores) == (clients, most)


def test_what_a_client_shares_of_its_scores():
    assert shareable(None) is None
    # Not finite, or not finite as float32 (a receiver would refuse the whole message): left out.
    assert shareable({0: 0.5, 1: math.nan, 2: 1e39, 3: -math.inf, 4: -3e38}) == {0: 0.5, 4: -3e38}


def test_scores_cost_eight_bytes_each_and_two_fields(client):
    # Two packed fields (a tag and a length byte each), 4 bytes per id and per value: the
    # first chunk's header grows by 8n + 4 (lengths below 128 bytes), and by one byte more
    # once the header passes 127 bytes (its own length then takes two).
    assert _message(client, None)[0].header.ByteSize() + 28 < 128 < _message(client, None)[0].header.ByteSize() + 124
    base = message_bytes(client.specs, 1024)
    assert [message_bytes(client.specs, 1024, n) - base for n in (1, 3, 15)] == [12, 28, 125]


def test_share_scores_is_a_flag(small_scenario):
    assert small_scenario("network.share_scores=true").network.share_scores is True
    with pytest.raises(ScenarioError, match="network.share_scores"):
        load_scenario(None, ["network.share_scores=1"])
