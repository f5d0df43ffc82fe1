"""Asynchronous gossip's inbox: the newest model of each neighbour, kept until a newer one comes
(LatestInbox), each with the receiver's own step it arrived in; what it refuses and counts."""

from __future__ import annotations

import threading

import pytest
import torch

from dfedrw.peer.transport.intake import ModelIntake
from dfedrw.peer.transport.latest import LatestInbox
from dfedrw.peer.transport.serde import ModelMessage, Plausible, TensorSpec, encode

SPECS = (TensorSpec("w", "float32", (4, 5)),)


def msg(sender, step, value=0.0):
    return ModelMessage(sender=sender, round=step, vector=torch.full((20,), float(value)), nbytes=10)


def test_the_newest_model_of_each_neighbour_is_kept_and_older_or_repeated_ones_are_not():
    inbox = LatestInbox(0, [1, 2], 4, last_step=9, model_size=20)
    assert inbox.offer(msg(1, 3, 3.0)) == (True, "")
    assert inbox.offer(msg(1, 5, 5.0)) == (True, "")  # a later step replaces it
    assert inbox.offer(msg(1, 4)) == (False, "stale_round")  # overtaken on the way
    assert inbox.offer(msg(1, 5)) == (False, "duplicate")
    assert inbox.offer(msg(2, 10)) == (False, "future_round")  # past the run's last step
    assert inbox.offer(msg(3, 0)) == (False, "not_neighbour")
    assert inbox.offer(msg(7, 0)) == (False, "unknown_sender")
    held = inbox.held_models()
    assert list(held) == [1] and held[1][0].round == 5 and float(held[1][0].vector[0]) == 5.0
    assert inbox.accepted == 2 and inbox.stale == 1 and dict(inbox.rejected) == {"duplicate": 1, "future_round": 1, "not_neighbour": 1, "unknown_sender": 1}
    assert inbox.held() == 1  # one model per neighbour, however many came


def test_staleness_counts_the_receivers_own_steps_since_a_model_arrived():
    inbox = LatestInbox(0, [1, 2], 3, last_step=99, model_size=20)
    inbox.advance(4)
    inbox.offer(msg(1, 40))  # the sender's label says nothing of it: a fast sender's model is fresh
    inbox.advance(6)
    inbox.offer(msg(2, 1))
    assert {k: s for k, (_, s) in inbox.held_models().items()} == {1: 2, 2: 0}
    inbox.advance(9)
    assert {k: s for k, (_, s) in inbox.held_models().items()} == {1: 5, 2: 3}
    assert list(inbox.held_models(max_staleness=4)) == [2]  # older ones left out
    inbox.offer(msg(1, 41))
    assert {k: s for k, (_, s) in inbox.held_models(max_staleness=4).items()} == {1: 0, 2: 3}


def test_a_reply_names_the_label_held_of_its_sender_not_the_receivers_step():
    # A sender drops its queued messages labelled below the round a reply carries: under
    # asynchronous gossip a slow sender's labels lag the receiver's steps, and are news all the
    # same; only those at or below the label held of it would arrive stale.
    inbox = LatestInbox(0, [1, 2], 3, last_step=99, model_size=20)
    inbox.advance(50)
    intake = ModelIntake(inbox, SPECS, Plausible(), 81)
    assert intake(encode(1, 3, torch.ones(20), SPECS, chunk_bytes=16), 1) == (True, "", 3)
    assert intake(encode(1, 2, torch.ones(20), SPECS, chunk_bytes=16), 1) == (False, "stale_round", 3)
    assert intake(encode(2, 0, torch.ones(20), SPECS, chunk_bytes=16), 2) == (True, "", 0)
    assert intake.progress() == 0  # no round of the receiver's moves on for the senders' buckets


def test_through_the_intake_in_chunks_a_model_overtaken_while_arriving_ends_stale():
    inbox = LatestInbox(0, [1], 2, last_step=9, model_size=20)
    intake = ModelIntake(inbox, SPECS, Plausible(), 81)
    old = encode(1, 2, torch.full((20,), 2.0), SPECS, chunk_bytes=16)
    arriving = intake.begin(old[0], 1)  # its header taken: a buffer of its own
    assert inbox.held() == 1 and inbox.room_for(5)
    assert intake(encode(1, 3, torch.full((20,), 3.0), SPECS, chunk_bytes=16), 1) == (True, "", 3)
    for chunk in old[1:]:
        arriving.add(chunk)
    assert arriving.end() == (False, "stale_round", 3)
    message, staleness = inbox.held_models()[1]
    assert message.round == 3 and torch.equal(message.vector, torch.full((20,), 3.0)) and staleness == 0
    assert inbox.held() == 1


def test_a_second_copy_of_a_model_still_arriving_is_a_duplicate_and_the_inbox_holds_two_per_neighbour():
    inbox = LatestInbox(0, [1], 2, last_step=9, model_size=20)
    first = inbox.reserve(1, 4)
    assert inbox.reserve(1, 4) == "duplicate" and inbox.reserve(1, 3) == "stale"
    second = inbox.reserve(1, 5)  # a newer one may arrive beside it
    assert inbox.reserve(1, 6) == "inbox_full"
    inbox.release(first)
    inbox.release(second)
    assert inbox.held() == 0


def test_waiting_for_news_returns_once_a_model_was_kept_and_at_the_timeout_otherwise():
    inbox = LatestInbox(0, [1], 2, last_step=9, model_size=20)
    seen = inbox.versions()
    assert inbox.wait_news(seen, 0.01) == seen  # nothing came
    inbox.offer(msg(1, 0))
    assert inbox.wait_news(seen, 10.0) == seen + 1  # at once: it came already
    inbox.offer(msg(1, 0))  # a duplicate is no news
    assert inbox.versions() == seen + 1


def test_a_step_waits_for_the_next_model_of_each_neighbour_stepping_with_it_and_not_for_a_straggler():
    from dfedrw.peer.client.asynchronous import Freshness

    inbox = LatestInbox(0, [1, 2, 3, 4], 5, last_step=99, model_size=20)
    intake = ModelIntake(inbox, SPECS, Plausible(), 81)

    def send(sender, label):
        assert intake(encode(sender, label, torch.ones(20), SPECS, chunk_bytes=16), sender)[0]

    for sender, label in ((1, 4), (2, 3), (3, 1), (4, 9)):  # at step 5: 1 keeps pace, 2 and 3 behind, 4 ahead
        send(sender, label)
    took = [0.5]  # what a message takes: a grace of 3 s while the test sends, then 0.06 s
    fresh = Freshness(timeout=5.0, message_seconds=lambda: took[0])
    assert fresh.grace() == pytest.approx(Freshness.FACTOR * 0.5)

    # Step 5: 1's step-5 model, and the model after the one it holds of each neighbour behind
    # (2's step 4, 3's step 2): a client ahead waits as one behind does. Not 4: it holds a
    # newer model of it than step 5 already.
    waiter = threading.Thread(target=fresh.wait, args=(inbox, [1, 2, 3, 4], 5, False))
    waiter.start()
    for sender, label in ((1, 5), (2, 4), (3, 2)):
        send(sender, label)
    waiter.join(5.0)
    assert not waiter.is_alive()
    # Then 1 keeps pace, 2 stays two steps behind but steps as this client does, 3 stays at
    # step 2 (a straggler) and 4 ahead. Once the window has passed, 3 is told apart: not waited
    # for; 2 still is (waiting for it is what keeps a client ahead from running away).
    took[0] = 0.001
    for t in range(7, 7 + Freshness.WINDOW):
        send(1, t)
        send(2, t - 2)
        send(4, t + 9)
        fresh.wait(inbox, [1, 2, 3, 4], t, False)
    t = 7 + Freshness.WINDOW
    assert fresh.stragglers(inbox.labels(), t) == {3}
    send(1, t)
    before = fresh.seconds
    fresh.wait(inbox, [1, 2, 3, 4], t, False)  # 2's next does not come: it waited the grace for it
    assert fresh.seconds - before >= fresh.grace()
    assert Freshness(1.0).stragglers({1: 0}, 5) == set()  # no steps measured yet: none
    # As it starts: a first model of each, whatever its step.
    fresh.wait(inbox, [1, 2, 3, 4], 0, True)
    assert Freshness(1.0).grace() == Freshness.FLOOR  # a transport that does not say: the floor
