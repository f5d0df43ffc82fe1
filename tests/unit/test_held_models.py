"""The models a client holds: the inbox's bound (beyond it a message is rejected, counted), a
round let go once the client is done with it, a message still arriving for a round passed
letting go of its buffer; the bound in bytes per client (peer/wiring/memory.py) and the launcher's
refusal of a run that would not fit (launch/preflight.py)."""

from __future__ import annotations

import pytest
import torch

from dfedrw.launch import preflight
from dfedrw.launch.preflight import NotEnoughMemory, available_memory, check_memory
from dfedrw.peer.config.scenario import ScenarioError
from dfedrw.peer.transport.intake import ModelIntake
from dfedrw.peer.wiring.memory import CLIENT_BASELINE, HONEST_WORK, LAUNCHER_BASELINE, held_models, run_needs
from dfedrw.peer.transport.inbox import Inbox, Slot
from dfedrw.peer.transport.serde import ModelMessage, Plausible, TensorSpec, encode
from dfedrw.peer.wiring.build import scenario_model_specs

SPECS = (TensorSpec("w", "float32", (20,)),)


def msg(sender, round_):
    return ModelMessage(sender, round_, torch.zeros(20), num_samples=1, nbytes=100)


def test_the_inbox_holds_one_model_per_neighbour_and_round_of_its_window_by_default():
    inbox = Inbox(0, [1, 2, 3], 4, window=2, model_size=20)
    assert inbox.capacity == 9
    for r in range(3):
        for k in (1, 2, 3):
            assert inbox.offer(msg(k, r)) == (True, "")
    assert inbox.held() == 9 and inbox.offer(msg(1, 3)) == (False, "future_round")


def test_a_message_beyond_the_inbox_bound_is_rejected_and_counted():
    # Prepare: room for two models
    inbox = Inbox(0, [1, 2, 3], 4, window=2, model_size=20, capacity=2)

    # Execute: two taken whole, a third whole, a fourth as it arrives in chunks
    first = [inbox.offer(msg(1, 0)), inbox.offer(msg(2, 0))]
    third = inbox.offer(msg(3, 0))
    fourth = inbox.reserve(3, 1)

    # Assert
    assert first == [(True, ""), (True, "")]
    assert third == (False, "inbox_full")
    assert fourth == "inbox_full" and inbox.settle(fourth, 3, 1) == (False, "inbox_full")
    assert inbox.rejected["inbox_full"] == 2 and inbox.accepted == 2 and inbox.held() == 2


def test_a_message_being_received_counts_against_the_bound():
    inbox = Inbox(0, [1, 2], 3, window=0, model_size=20, capacity=1)
    slot = inbox.reserve(1, 0)
    assert isinstance(slot, Slot) and slot.buffer is not None and inbox.held() == 1
    assert inbox.reserve(2, 0) == "inbox_full"
    inbox.release(slot)  # the message failed a check
    assert inbox.held() == 0 and isinstance(inbox.reserve(2, 0), Slot)


def test_a_round_the_client_is_done_with_is_let_go_and_what_comes_later_counted_not_kept():
    inbox = Inbox(0, [1, 2], 3, window=2, model_size=20)
    intake = ModelIntake(inbox, SPECS, Plausible(), 81)
    assert intake(encode(1, 0, torch.ones(20), SPECS, chunk_bytes=16), 1) == (True, "", 0)
    inbox.close(0)
    assert inbox.held() == 0
    assert intake(encode(2, 0, torch.ones(20), SPECS, chunk_bytes=16), 2) == (True, "", 0)  # late, counted
    assert intake(encode(1, 0, torch.ones(20), SPECS, chunk_bytes=16), 1) == (False, "duplicate", 0)
    assert inbox.held() == 0 and inbox.accepted == 2


def test_a_message_still_arriving_for_a_round_passed_lets_go_of_its_buffer_and_ends_stale():
    inbox = Inbox(0, [1], 2, window=2, model_size=20)
    intake = ModelIntake(inbox, SPECS, Plausible(), 81)
    chunks = encode(1, 0, torch.ones(20), SPECS, chunk_bytes=16)
    message = intake.begin(chunks[0], 1)
    message.add(chunks[1])
    assert inbox.held() == 1
    inbox.advance(1)
    assert inbox.held() == 0 and message.decoder.tensor is None
    for chunk in chunks[2:]:
        message.add(chunk)
    assert message.end() == (False, "stale_round", 1) and inbox.stale == 1


def test_a_large_message_for_a_later_round_waits_while_the_inbox_holds_a_round(monkeypatch):
    from dfedrw.peer.transport import intake as intake_module
    monkeypatch.setattr(intake_module, "LARGE_MESSAGE", 10)
    inbox = Inbox(0, [1, 2], 3, window=2, model_size=20)
    intake = ModelIntake(inbox, SPECS, Plausible(), 81)
    later = encode(1, 1, torch.ones(20), SPECS)[0].header
    assert intake.has_room(later)
    for k in (1, 2):
        intake(encode(k, 0, torch.ones(20), SPECS), k)
    assert not intake.has_room(later)  # a whole round held: the next one waits
    assert intake.has_room(encode(1, 0, torch.ones(20), SPECS)[0].header)  # its own round never does
    inbox.advance(1)
    assert intake.has_room(later)


# ------------------------------------------------------------------ the bound in bytes


@pytest.fixture
def ring(small_scenario):
    return small_scenario("topology.kind=ring", "topology.honest=5", "topology.byzantine=1", "attack.name=gaussian")


def test_each_clients_bound_is_its_inbox_its_outbox_and_its_work(ring):
    held = held_models(ring)
    byzantine = [h for h in held if h.role == "byzantine"]
    honest = [h for h in held if h.role == "honest"]
    # A ring: two neighbours each, window 2.
    assert [h.models for h in honest] == [3 * 2 + HONEST_WORK] * 5
    assert [(h.received, h.sending) for h in byzantine] == [(6, 4)]


def test_a_run_that_needs_more_than_is_available_is_refused_in_one_line_with_the_estimate(ring):
    needs = run_needs(ring, scenario_model_specs(ring))
    assert needs.total == sum(h.models for h in needs.held) * needs.model + 6 * CLIENT_BASELINE + LAUNCHER_BASELINE
    with pytest.raises(NotEnoughMemory) as refused:
        check_memory(ring, available=needs.total - 1)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("this run needs about") and "available" in line
    assert isinstance(refused.value, ScenarioError)  # the command line's one line and exit status 2
    check_memory(ring, available=needs.total)  # fits: nothing said


def test_available_memory_is_read_from_meminfo(tmp_path, monkeypatch, ring):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683540 kB\nMemFree:         1000 kB\nMemAvailable:     2048 kB\n")
    monkeypatch.setattr(preflight, "MEMINFO", meminfo)
    assert available_memory() == 2048 * 1024
    with pytest.raises(NotEnoughMemory, match="this machine has 0.0 GB available"):
        check_memory(ring)
    meminfo.write_text("MemTotal: 1 kB\n")  # says nothing of what is available: not checked
    check_memory(ring)


# ------------------------------------------------------------------ the batched engine's needs

THOUSAND = ("engine.name=batched", "topology.honest=1000", "topology.byzantine=0", "attack.name=none", "topology.rho=0.01")


def test_the_batched_engine_is_checked_by_what_its_one_process_holds(small_scenario):
    from dfedrw.peer.wiring.memory import BATCHED_BASELINE, BATCHED_CLIENT, batched_needs

    sc = small_scenario(*THOUSAND)
    needs = batched_needs([sc], [scenario_model_specs(sc)])
    # Client processes would need 160 MB each; the batched engine holds rows and objects.
    assert run_needs(sc, scenario_model_specs(sc)).total > 100e9
    assert BATCHED_BASELINE + 1000 * BATCHED_CLIENT < needs.total < 1e9
    check_memory(sc, available=int(1e9))  # fits: nothing said
    with pytest.raises(NotEnoughMemory) as refused:
        check_memory(sc, available=needs.total - 1)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"this run needs about {needs.total / 1e9:.1f} GB in the batched engine (1_000 clients")
    assert "available: use fewer clients, a smaller model or fewer neighbours (topology.rho)" in line


def test_the_batched_estimate_counts_rows_by_clients_neighbours_and_rule(small_scenario):
    from dfedrw.peer.wiring.memory import BATCHED_ROWS, POOL_ROWS, batched_rows

    ring = small_scenario("engine.name=batched", "topology.kind=ring", "topology.honest=6", "topology.byzantine=0", "attack.name=none")
    assert batched_rows(ring) == (6, 6, 6 * BATCHED_ROWS + POOL_ROWS * 6)  # DFedReweighting weighs the pool as it is
    median = small_scenario("engine.name=batched", "topology.kind=ring", "topology.honest=6", "topology.byzantine=0", "attack.name=none", "aggregation.rule=median")
    assert batched_rows(median)[2] == batched_rows(ring)[2] + 6 * 3  # each client's candidates gathered: itself and 2 neighbours
    attacked = small_scenario("engine.name=batched", "topology.kind=ring", "topology.honest=5", "topology.byzantine=1", "attack.name=gaussian")
    assert batched_rows(attacked) == (6, 5, 5 * BATCHED_ROWS + POOL_ROWS * (5 + 2))  # a message to each honest neighbour


def test_a_batch_of_runs_holds_the_data_once_and_every_runs_rows(small_scenario):
    from dfedrw.launch.preflight import check_batch_memory
    from dfedrw.peer.wiring.memory import batched_needs

    runs = [small_scenario(*THOUSAND, f"seed={s}") for s in (1, 2, 3)]
    one = batched_needs(runs[:1], [scenario_model_specs(runs[0])])
    three = batched_needs(runs, [scenario_model_specs(s) for s in runs])
    assert three.data == one.data and three.matrix == one.matrix
    assert three.total - one.total == 2 * one.run_bytes(one.runs[0])
    with pytest.raises(NotEnoughMemory, match=r"3 runs as one batch, 3_000 clients.* or a smaller batch \(dfedrw sweep --batch\)$"):
        check_batch_memory(runs, available=three.total - 1)


def test_preflight_builds_a_rule_once_for_each_setting_not_once_per_client(small_scenario, monkeypatch):
    from dfedrw.peer.wiring import assembly

    built = []
    real = assembly.build_client_rule
    monkeypatch.setattr(assembly, "build_client_rule", lambda scenario, client, *a: built.append(client) or real(scenario, client, *a))
    # 200 honest clients and 2 Byzantine on a sparse graph, one [peers.K] override: a rule for
    # each number of Byzantine neighbours a client is told of (0, 1 or 2), and the override's.
    scenario = small_scenario(
        "topology.honest=200", "topology.byzantine=2", "topology.rho=0.05", "aggregation.rule=trimmed_mean", "peers.7.aggregation.rule=median",
    )
    preflight.preflight(scenario, memory=False)
    from dfedrw.peer.wiring.plan import scenario_topology, told_byzantine

    topology = scenario_topology(scenario)
    told = {told_byzantine(scenario.aggregation, topology, k) for k in range(202) if k not in topology.byzantine and k != 7}
    assert 7 in built and len(built) == len(told) + 1 < 10
    # A bad override still fails, with its key named, though its client is one of 200.
    with pytest.raises(ScenarioError, match="peers"):
        preflight.preflight(small_scenario("topology.honest=200", "topology.byzantine=2", "topology.rho=0.05", "peers.150.aggregation.rule=nope"), memory=False)
