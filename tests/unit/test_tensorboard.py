"""TensorBoard event files: round records as scalars, the honest mean, the round log writing
them, and the checks made before a run (peer/results/tensorboard.py)."""

import importlib.util
import sys

import pytest

from dfedrw.peer.results.records import RoundLog
from dfedrw.peer.results.tensorboard import (
    MEAN_DIR, TensorBoardUnavailable, check_fresh_event_dir, honest_mean, record_scalars, require_tensorboard, write_honest_mean,
)
from tests.support.tensorboard import read_scalars

needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="the tensorboard extra is not installed")

# Client 0 of a graph where 3 is Byzantine: round 0 without evaluation, round 1 with.
RECORDS = [
    {"round": 0, "train_loss": 2.5, "weights": {"0": 0.5, "1": 0.25, "3": 0.25}, "scores": {"0": 1.0}},
    {"round": 1, "train_loss": 2.0, "weights": {"0": 0.6, "1": 0.3, "3": 0.1}, "accuracy": 40.0, "global_accuracy": 30.0},
]


def test_a_record_gives_its_loss_accuracies_byzantine_share_and_weight_per_candidate():
    # Execute
    first, second = (record_scalars(r, {3}) for r in RECORDS)

    # Assert
    assert first == {"train_loss": 2.5, "byzantine_weight_share": 0.25, "weight/0": 0.5, "weight/1": 0.25, "weight/3": 0.25}
    assert second["accuracy"] == 40.0 and second["global_accuracy"] == 30.0
    assert second["byzantine_weight_share"] == pytest.approx(0.1)


def test_a_backdoor_success_rate_is_a_scalar_and_averaged_over_the_clients():
    backdoored = [{**r, "attack_success": 90.0} if "accuracy" in r else r for r in RECORDS]
    other = [{"round": 1, "train_loss": 1.0, "weights": {"1": 1.0}, "accuracy": 50.0, "global_accuracy": 40.0, "attack_success": 70.0}]
    assert record_scalars(backdoored[1], {3})["attack_success"] == 90.0
    assert "attack_success" not in record_scalars(RECORDS[1], {3})
    assert honest_mean([backdoored, other], {3})[1]["attack_success"] == pytest.approx(80.0)


def test_no_byzantine_share_without_byzantine_clients():
    assert "byzantine_weight_share" not in record_scalars(RECORDS[0], ())


def test_the_honest_mean_averages_each_round_over_the_clients_that_hold_the_value():
    # Prepare: client 1 stopped after round 0; only client 0 evaluated in round 1
    other = [{"round": 0, "train_loss": 1.5, "weights": {"1": 1.0}}]

    # Execute
    mean = honest_mean([RECORDS, other], {3})

    # Assert
    assert mean[0] == {"train_loss": 2.0, "byzantine_weight_share": 0.125}
    assert mean[1] == pytest.approx({"train_loss": 2.0, "byzantine_weight_share": 0.1, "accuracy": 40.0, "global_accuracy": 30.0})


@needs_tensorboard
def test_a_round_log_given_a_folder_writes_each_record_as_scalars(tmp_path):
    # Execute
    log = RoundLog(tmp_path / "out", 0, tensorboard=tmp_path / "tb", byzantine={3})
    for record in RECORDS:
        log.write(record)
    log.close()

    # Assert: read back with TensorBoard's loader, float32 values
    got = read_scalars(tmp_path / "tb" / "client-0")
    assert got["train_loss"] == {0: 2.5, 1: 2.0}
    assert got["accuracy"] == {1: 40.0} and got["global_accuracy"] == {1: 30.0}
    assert got["byzantine_weight_share"] == pytest.approx({0: 0.25, 1: 0.1})
    assert got["weight/1"] == pytest.approx({0: 0.25, 1: 0.3})


def test_a_byzantine_client_and_a_log_without_a_folder_write_no_event_file(tmp_path):
    # Execute
    for log in (RoundLog(tmp_path / "out", 3, tensorboard=tmp_path / "tb", byzantine={3}), RoundLog(tmp_path / "out", 0)):
        log.write({"round": 0, "train_loss": None, "weights": {}})
        log.close()

    # Assert
    assert not (tmp_path / "tb").exists()
    assert not list(tmp_path.rglob("*tfevents*"))


@needs_tensorboard
def test_a_resumed_log_drops_the_rounds_after_its_checkpoint_in_tensorboard_too(tmp_path):
    # Prepare: rounds 0..3 logged, then the client is killed and resumes from round 1
    log = RoundLog(tmp_path / "out", 0, tensorboard=tmp_path / "tb")
    for r in range(4):
        log.write({"round": r, "train_loss": float(r), "weights": {"0": 1.0}})
    log.close()

    # Execute
    log = RoundLog(tmp_path / "out", 0, keep_through=1, tensorboard=tmp_path / "tb")
    log.write({"round": 2, "train_loss": 20.0, "weights": {"0": 1.0}})
    log.close()

    # Assert: rounds 0, 1 from before, round 2 anew, round 3 gone as from the round log
    assert read_scalars(tmp_path / "tb" / "client-0")["train_loss"] == {0: 0.0, 1: 1.0, 2: 20.0}


@needs_tensorboard
def test_the_honest_mean_is_written_to_its_folder(tmp_path):
    # Execute
    folder = write_honest_mean(tmp_path, [RECORDS], {3})

    # Assert
    assert folder == tmp_path / MEAN_DIR
    assert read_scalars(folder)["train_loss"] == {0: 2.5, 1: 2.0}


@needs_tensorboard
def test_a_folder_with_event_files_of_an_earlier_run_is_refused(tmp_path):
    # Prepare
    check_fresh_event_dir(tmp_path, range(4))  # nothing there yet
    write_honest_mean(tmp_path, [RECORDS], {3})

    # Execute / Assert
    with pytest.raises(FileExistsError, match="earlier run.*honest-mean.*choose another --tensorboard"):
        check_fresh_event_dir(tmp_path, range(4))
    check_fresh_event_dir(tmp_path, range(4), mean=False)  # a torchrun rank other than 0 writes no mean
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match="--tensorboard .*afile is not a folder"):
        check_fresh_event_dir(tmp_path / "afile", range(4))


def test_without_the_package_the_error_names_the_extra(monkeypatch):
    # Prepare: an import of tensorboard fails
    monkeypatch.setitem(sys.modules, "tensorboard", None)

    # Execute / Assert
    with pytest.raises(TensorBoardUnavailable, match=r"pip install 'dfedrw\[tensorboard\]'"):
        require_tensorboard()
