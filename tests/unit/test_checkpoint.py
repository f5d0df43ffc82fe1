"""Checkpoints: the file format (arrays and JSON, no pickle, atomic), its checks, and a client
that finds one of its own in its results folder."""

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dfedrw.peer.client.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
    memory_counters,
    memory_of,
    save_checkpoint,
    scenario_fingerprint,
)
from dfedrw.peer.config.scenario import ScenarioError, load_scenario, scenario_changes
from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import build_model, get_vector
from dfedrw.peer.client.asynchronous import run_async_byzantine
from dfedrw.peer.client.byzantine import run_byzantine
from dfedrw.peer.client.client import Client
from dfedrw.peer.client.rejoin import coordinate_median
from dfedrw.peer.wiring.plan import scenario_topology
from dfedrw.peer.results.records import RoundLog, read_rounds, summarize, write_json_atomic
from dfedrw.peer.learning.training import LocalTrainer
from dfedrw.peer.transport.inproc import InprocHub, InprocTransport


def _ckpt(client=3, round_=39, scenario="abc", size=10):
    return Checkpoint(
        client=client, round=round_, scenario=scenario, vector=np.arange(size, dtype=np.float32),
        generators={"batches": torch.Generator().manual_seed(5).get_state().numpy()},
        arrays={"order": np.arange(7, dtype=np.int64)}, counters={"trainer_pos": 4, "restarts": 1, "resumed_from": [{"checkpoint_round": 19}]},
    )


def test_round_trip(tmp_path):
    path = checkpoint_path(tmp_path, 3)
    save_checkpoint(path, _ckpt())
    got = load_checkpoint(path, client=3, scenario="abc", vector_size=10)
    assert got.round == 39 and got.client == 3
    assert got.vector.dtype == np.float32 and np.array_equal(got.vector, np.arange(10, dtype=np.float32))
    assert np.array_equal(got.generators["batches"], torch.Generator().manual_seed(5).get_state().numpy())
    assert np.array_equal(got.arrays["order"], np.arange(7))
    assert got.counters == {"trainer_pos": 4, "restarts": 1, "resumed_from": [{"checkpoint_round": 19}]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["3.ckpt.npz"]  # no temporary left behind


def test_a_torn_temporary_file_is_ignored(tmp_path):
    path = checkpoint_path(tmp_path, 3)
    save_checkpoint(path, _ckpt(round_=19))
    # A crash in the middle of writing the next one leaves a torn temporary file.
    path.with_name(path.name + ".tmp").write_bytes(b"PK\x03\x04 torn")
    assert load_checkpoint(path, client=3, scenario="abc", vector_size=10).round == 19
    save_checkpoint(path, _ckpt(round_=39))  # and the next save goes through
    assert load_checkpoint(path, client=3, scenario="abc", vector_size=10).round == 39


def test_wrong_scenario_client_or_model_refused(tmp_path):
    path = checkpoint_path(tmp_path, 3)
    save_checkpoint(path, _ckpt())
    with pytest.raises(CheckpointError, match="another scenario"):
        load_checkpoint(path, client=3, scenario="xyz", vector_size=10)
    with pytest.raises(CheckpointError, match="belongs to client 3"):
        load_checkpoint(path, client=4, scenario="abc", vector_size=10)
    with pytest.raises(CheckpointError, match="does not match this model"):
        load_checkpoint(path, client=3, scenario="abc", vector_size=11)


def test_a_pickled_object_array_is_refused(tmp_path):
    path = checkpoint_path(tmp_path, 3)
    path.parent.mkdir(parents=True)
    meta = {"format": 1, "client": 3, "round": 39, "scenario": "abc", "counters": {}}
    vector = np.empty(1, dtype=object)
    vector[0] = {"not": "an array"}
    np.savez(path, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), vector=vector)
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, client=3, scenario="abc", vector_size=10)
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, client=3, scenario="abc", vector_size=10)


def test_fingerprint_ignores_network_eval_and_checkpoint_settings():
    base = load_scenario(None)
    assert scenario_fingerprint(base) == scenario_fingerprint(
        load_scenario(None, ["network.round_timeout=3", "eval.every=7", "checkpoint.every=9", "network.host='::1'"])
    )
    assert scenario_fingerprint(base) != scenario_fingerprint(load_scenario(None, ["train.lr=0.5"]))
    assert scenario_fingerprint(base) != scenario_fingerprint(load_scenario(None, ["seed=1"]))


def test_checkpoint_setting_validated_and_default_leaves_identity_alone():
    assert load_scenario(None).checkpoint.every == 50
    assert load_scenario(None, ["checkpoint.every=0"]).checkpoint.every == 0
    for bad in ("checkpoint.every=-1", "checkpoint.every=10000001", "checkpoint.every=1.5"):
        with pytest.raises(ScenarioError, match="checkpoint.every"):
            load_scenario(None, [bad])
    assert "checkpoint" not in scenario_changes(load_scenario(None))
    assert scenario_changes(load_scenario(None, ["checkpoint.every=20"]))["checkpoint"] == {"every": 20}


def test_trainer_state_resumes_the_same_minibatches():
    torch.manual_seed(0)
    data = Dataset(x=torch.randn(50, 4), y=torch.randint(0, 3, (50,)), num_classes=3)

    def trainer(model):
        return LocalTrainer(model, data, lr=0.1, batch_size=8, local_steps=2, seed=11)

    a = trainer(build_model("softmax_regression", 4, 3, seed=1))
    for _ in range(5):
        a.step()
    gens, arrays, pos = a.state()
    saved = get_vector(a.model).clone()
    after = [a.step() for _ in range(6)]
    b_model = build_model("softmax_regression", 4, 3, seed=1)
    from dfedrw.peer.learning.models import set_vector

    set_vector(b_model, saved)
    b = trainer(b_model)
    b.load_state(gens, arrays, pos)
    assert [b.step() for _ in range(6)] == after
    assert torch.equal(get_vector(a.model), get_vector(b.model))
    with pytest.raises(ValueError):
        b.load_state(gens, {"order": np.array([0, 99])}, 0)


def test_round_log_continued_through_the_checkpoint_round(tmp_path):
    log = RoundLog(tmp_path, 1)
    for r in range(10):
        log.write({"round": r})
    log.close()
    with (tmp_path / "peers" / "1.jsonl").open("a") as f:
        f.write('{"round": 10, "torn')  # killed mid-line
    log = RoundLog(tmp_path, 1, keep_through=5)
    assert (log.dropped, log.last_logged) == (4, 9)
    log.write({"round": 8})
    log.close()
    assert [r["round"] for r in read_rounds(tmp_path, 1)] == [0, 1, 2, 3, 4, 5, 8]
    assert not list((tmp_path / "peers").glob("1.jsonl.*"))  # nothing moved aside


def test_a_client_resumes_from_its_checkpoint_and_refuses_another_scenarios(small_scenario, tmp_path):
    scenario = small_scenario("topology.kind=ring", "topology.honest=4", "topology.byzantine=0", "checkpoint.every=5")
    peer = Client(scenario, 1, tmp_path, transport=InprocTransport(InprocHub(), "inproc:1"))
    try:
        assert peer.resumed is None and peer.resume.restarts == 0
        peer.prepare()
        for r in range(7):
            peer.results.write({"round": r, "weights": {}, "missing": []})
        with torch.no_grad():
            for p in peer.model.parameters():
                p.fill_(0.25)
        gens, arrays, pos = peer.trainer.state()
        peer.resume.save(4, generators=gens, arrays=arrays, vector=get_vector(peer.model).numpy(), trainer_pos=pos, **memory_counters({0: 0.1, 2: 0.75}))
        peer.results.close()
    finally:
        peer.close()
    # Started again: its model, round and minibatch order come back, and its log continues.
    again = Client(scenario, 1, tmp_path, transport=InprocTransport(InprocHub(), "inproc:1"))
    try:
        assert again.resumed.round == 4 and again.resume.restarts == 1
        assert torch.all(get_vector(again.model) == 0.25)
        assert [r["round"] for r in read_rounds(tmp_path, 1)] == [0, 1, 2, 3, 4]
        assert again.results.last_logged == 6
        again.prepare()
        assert again.trainer.state()[2] == pos
        assert again.memory == {0: 0.1, 2: 0.75}  # its rule's memory, as it was
        again.results.close()
    finally:
        again.close()
    other = small_scenario("topology.kind=ring", "topology.honest=4", "topology.byzantine=0", "checkpoint.every=5", "train.lr=0.3")
    with pytest.raises(CheckpointError, match="another scenario"):
        Client(other, 1, tmp_path, transport=InprocTransport(InprocHub(), "inproc:1"))
    # checkpoint.every = 0: no checkpoints, and a client started again starts over.
    off = small_scenario("topology.kind=ring", "topology.honest=4", "topology.byzantine=0", "checkpoint.every=0")
    fresh = Client(off, 1, tmp_path, transport=InprocTransport(InprocHub(), "inproc:1"))
    try:
        assert fresh.resumed is None and read_rounds(tmp_path, 1) == []
        fresh.results.close()
    finally:
        fresh.close()


def test_a_rules_memory_round_trips_and_a_bad_one_is_refused(tmp_path):
    path = checkpoint_path(tmp_path, 3)
    kept = {1: 0.1 + 0.2, 4: 1 / 3}
    save_checkpoint(path, dataclasses.replace(_ckpt(), counters=memory_counters(kept)))
    assert memory_of(load_checkpoint(path, client=3, scenario="abc", vector_size=10), path) == kept  # to the last bit
    assert memory_counters(None) == {} and memory_of(_ckpt(), path) is None
    for bad in ({"x": 0.5}, {"1": "NaN"}, {"1": None}, [1, 2]):
        with pytest.raises(CheckpointError, match="rule_memory"):
            memory_of(Checkpoint(client=3, round=1, scenario="abc", counters={"rule_memory": bad}), path)


def test_summary_counts_restarts_and_rounds_lost(tmp_path):
    for k, final in ((0, {"restarts": 0}), (1, {"restarts": 2, "rounds_lost": 37})):
        log = RoundLog(tmp_path, k)
        log.write({"round": 0, "weights": {str(k): 1.0}})
        log.close()
        write_json_atomic(tmp_path / "peers" / f"{k}.json", {"completed": True, "accuracy": 90.0, "global_accuracy": 90.0, **final})
    s = summarize(tmp_path, roles={0: "honest", 1: "honest"}, pids={}, exit_codes={}, rounds=1, wall_seconds=1.0)
    assert s["restarted_peers"] == [1]
    assert (s["peers"]["1"]["restarts"], s["peers"]["1"]["rounds_lost"]) == (2, 37)
    assert (s["peers"]["0"]["restarts"], s["peers"]["0"]["rounds_lost"]) == (0, 0)


def test_coordinate_median():
    v = torch.tensor([[1.0, 5.0], [3.0, -1.0]])
    assert torch.equal(coordinate_median(v), torch.tensor([2.0, 2.0]))
    v = torch.tensor([[1.0, 5.0], [3.0, -1.0], [100.0, 0.0]])
    assert torch.equal(coordinate_median(v), torch.tensor([3.0, 0.0]))


def test_a_byzantine_client_checkpoints_its_round_and_attack_generator(small_scenario, tmp_path):
    scenario = small_scenario("topology.kind=complete", "topology.honest=3", "topology.byzantine=1", "attack.name=gaussian", "checkpoint.every=5")
    bad = max(scenario_topology(scenario).byzantine)
    peer = Client(scenario, bad, tmp_path, transport=InprocTransport(InprocHub(), "inproc:b"))
    try:
        assert peer.role == "byzantine"
        state = torch.Generator().manual_seed(9).get_state().numpy()
        peer.resume.save(9, generators={"attack": state})
        peer.results.close()
    finally:
        peer.close()
    again = Client(scenario, bad, tmp_path, transport=InprocTransport(InprocHub(), "inproc:b"))
    try:
        assert again.resumed.round == 9 and again.resumed.vector is None
        assert np.array_equal(again.resumed.generators["attack"], state)
        again.results.close()
    finally:
        again.close()


def _restarted_attacker(small_scenario, tmp_path, *settings, kept):
    """A Byzantine client (of 3 honest ones) whose checkpoint of round 9 kept ``kept(honest
    ids)`` besides its generator, built again as it starts after a restart."""
    scenario = small_scenario(
        "topology.kind=complete", "topology.honest=3", "topology.byzantine=1", "attack.name=gaussian", "checkpoint.every=5", *settings,
    )
    bad = max(scenario_topology(scenario).byzantine)
    peer = Client(scenario, bad, tmp_path, transport=InprocTransport(InprocHub(), "inproc:b"))
    try:
        peer.resume.save(9, generators={"attack": torch.Generator().get_state().numpy()}, **kept(sorted(scenario_topology(scenario).honest())))
        peer.results.close()
    finally:
        peer.close()
    return Client(scenario, bad, tmp_path, transport=InprocTransport(InprocHub(), "inproc:b"))


def _refused_at_resume(again, run, match):
    """``run(again)`` refuses the restarted client's checkpoint with a CheckpointError matching ``match``."""
    try:
        again.prepare()
        with pytest.raises(CheckpointError, match=match):
            run(again)
    finally:
        again.results.close()
        again.close()


def test_a_byzantine_client_resumes_no_standing_it_cannot_read(small_scenario, tmp_path):
    # Prepare: an attacker that strikes when trusted, its checkpoint holding no standing
    again = _restarted_attacker(
        small_scenario, tmp_path, "network.share_scores=true", "attack.strike=trusted", kept=lambda honest: {"standing": {"streak": "many"}},
    )

    # Execute / Assert: refused before it waits for anyone, naming the file
    _refused_at_resume(again, run_byzantine, r"\.ckpt\.npz: its attack's standing is unusable \(not a standing")


def test_a_resumed_trainer_continues_the_same_momentum_and_augmentation_trajectory(tmp_path):
    from dfedrw.peer.learning.training import Augmentation

    torch.manual_seed(0)
    data = Dataset(x=torch.randn(40, 144), y=torch.randint(0, 3, (40,)), num_classes=3)

    def trainer(model):
        return LocalTrainer(
            model, data, lr=0.05, batch_size=8, local_steps=2, seed=5, momentum=0.9, weight_decay=0.01,
            augment=Augmentation("crop_flip", 2, (1, 12, 12), 9),
        )

    a = trainer(build_model("lenet5", 144, 3, input_shape=(1, 12, 12), seed=1))
    for _ in range(3):
        a.step()
    gens, arrays, pos = a.state()
    assert "augment" in gens
    assert arrays["momentum"].dtype == np.float32 and arrays["momentum"].shape == (sum(p.numel() for p in a.model.parameters()),)
    # Through a checkpoint file, as a client saves and loads it.
    path = tmp_path / "c.ckpt.npz"
    save_checkpoint(path, Checkpoint(client=0, round=2, scenario="s", vector=get_vector(a.model).numpy(), generators=gens, arrays=arrays))
    ckpt = load_checkpoint(path, client=0, scenario="s", vector_size=len(get_vector(a.model)))
    after = [a.step() for _ in range(4)]
    from dfedrw.peer.learning.models import set_vector

    b_model = build_model("lenet5", 144, 3, input_shape=(1, 12, 12), seed=1)
    set_vector(b_model, torch.from_numpy(ckpt.vector))
    b = trainer(b_model)
    b.load_state(ckpt.generators, ckpt.arrays, pos)
    assert [b.step() for _ in range(4)] == after
    assert torch.equal(get_vector(a.model), get_vector(b.model))
    # Without its buffer the checkpoint cannot continue a momentum run.
    c = trainer(build_model("lenet5", 144, 3, input_shape=(1, 12, 12), seed=1))
    with pytest.raises(ValueError, match="no momentum buffer"):
        c.load_state(gens, {"order": arrays["order"]}, pos)
    with pytest.raises(ValueError, match="does not fit this model"):
        c.load_state(gens, {"order": arrays["order"], "momentum": arrays["momentum"][:-1]}, pos)


class _HeldInbox:
    """The newest model held of each neighbour (label, vector), as a LatestInbox gives them."""

    def __init__(self, held):
        self.held, self.waited = held, []

    def wait_for_step(self, senders, step, timeout):
        self.waited.append((tuple(senders), step, timeout))
        return all(k in self.held for k in senders)

    def held_models(self, max_staleness=0):
        return {k: (SimpleNamespace(round=r, vector=v), 0) for k, (r, v) in self.held.items()}


def _resume_async(held, *, checkpoint=49, rounds=1000, role="honest"):
    from dfedrw.peer.client.rejoin import Resume

    inbox = _HeldInbox(held)
    scenario = SimpleNamespace(rounds=rounds, network=SimpleNamespace(round_timeout=2.0))
    resume = Resume(
        1, role, scenario, graphs=None, byzantine=frozenset(), transport=None, inbox=inbox, specs=None, presence=None,
        results=SimpleNamespace(last_logged=checkpoint + 6), checkpoint_file=None, fingerprint="x", resumed=SimpleNamespace(round=checkpoint, counters={}),
    )
    return resume, inbox


def test_an_asynchronous_client_restarted_far_behind_goes_on_at_its_neighbours_steps_with_their_median():
    a, b = torch.tensor([1.0, 5.0]), torch.tensor([3.0, -1.0])
    resume, inbox = _resume_async({0: (300, a), 2: (302, b)})
    step, model = resume.resume_steps([0, 2])
    # One past the upper median of the steps they are at; 253 steps skipped (more than
    # STALE_AFTER): its checkpointed model is stale, the median of theirs goes in its place.
    assert step == 303 and torch.equal(model, torch.tensor([2.0, 2.0]))
    assert inbox.waited == [((0, 2), 0, 2.0)]
    (entry,) = resume.resumed_from
    assert entry == {
        "checkpoint_round": 49, "last_logged": 55, "resumed_at": 303, "neighbour_rounds": {"0": 300, "2": 302},
        "skipped": 253, "redone": 0, "took_neighbours_model": True,
    }
    assert resume.rounds_lost() == 253


def test_an_asynchronous_client_restarted_close_behind_keeps_its_model_and_redoes_its_steps():
    # Neighbours a few steps on: it goes on one past them with its own model.
    resume, _ = _resume_async({0: (52, torch.zeros(2)), 2: (51, torch.zeros(2))})
    assert resume.resume_steps([0, 2]) == (53, None)
    assert resume.resumed_from[-1]["skipped"] == 3 and not resume.resumed_from[-1]["took_neighbours_model"]
    # Neighbours no further than its checkpoint (they hold back, or sent nothing: a network that
    # finished): one past its checkpoint, and the steps it logged before are counted as redone.
    for held in ({0: (40, torch.zeros(2))}, {}):
        resume, _ = _resume_async(held)
        assert resume.resume_steps([0, 2]) == (50, None)
        for t in range(50, 60):
            resume.note_round(t)
        assert resume.resumed_from[-1]["redone"] == 6 and resume.rounds_lost() == 6
    # Never past the run's last step, whatever the neighbours' labels say.
    resume, _ = _resume_async({0: (999, torch.zeros(2)), 2: (999, torch.ones(2))}, rounds=1000)
    assert resume.resume_steps([0, 2])[0] == 999
    # No one to wait for: nothing waited.
    resume, inbox = _resume_async({})
    assert resume.resume_steps([]) == (50, None) and inbox.waited == []


def _async_attacker(small_scenario, tmp_path, answered):
    """A Byzantine client under asynchronous gossip whose checkpoint kept the labels
    ``answered(honest ids)``, built again as it starts after a restart."""
    return _restarted_attacker(small_scenario, tmp_path, "network.protocol=async", "rounds=12", kept=lambda honest: {"answered": answered(honest)})


def test_a_byzantine_client_under_gossip_goes_on_from_whom_it_had_answered(small_scenario, tmp_path):
    # Prepare: its checkpoint says it answered every honest neighbour's last step already
    again = _async_attacker(small_scenario, tmp_path, lambda honest: {str(k): 11 for k in honest})

    waits = []

    def wait_news(seen, timeout):
        waits.append(seen)
        return seen  # nothing new: a client still owing an answer would wait on

    # Execute
    try:
        again.prepare()
        again.inbox.wait_news = wait_news
        final = run_async_byzantine(again)
    finally:
        again.results.close()
        again.close()

    # Assert: nothing was due, so it never waited for a model (a fresh start would wait to answer
    # each neighbour), and the resume is noted
    assert waits == [] and final["gossip"]["crafts"] == 0
    assert again.resume.restarts == 1
    assert [e["checkpoint_round"] for e in again.resume.resumed_from] == [9]


@pytest.mark.parametrize(
    "answered",
    [
        lambda honest: [1, 2],
        lambda honest: {"x": 3},
        lambda honest: {str(honest[0]): "3"},
        lambda honest: {str(honest[0]): True},
        lambda honest: {str(honest[0]): -2},
        lambda honest: {"99": 4},  # no neighbour of it
    ],
)
def test_a_byzantine_client_under_gossip_resumes_no_labels_it_cannot_read(small_scenario, tmp_path, answered):
    # Prepare: a checkpoint whose answered labels are not a neighbour -> label table
    again = _async_attacker(small_scenario, tmp_path, answered)

    # Execute / Assert: refused before it waits for anyone, naming the file
    _refused_at_resume(again, run_async_byzantine, r"\.ckpt\.npz: its answered labels are unusable")
