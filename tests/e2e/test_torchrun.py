"""Scenarios under ``torchrun --standalone`` (one rank = one client), on loopback.

The CPU runs use gloo for torchrun's own process group; the clients talk over gRPC (mutual
TLS, with the certificates rank 0 makes in the results folder) or over the torch transport. Their results folders must look like those of ``dfedrw run``, and the two
transports must compute the same thing: the same bytes go through the same validation, every
client is single-threaded and seeded, and no deadline is missed at a 10 s round timeout.
"""

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from dfedrw.launch.runner import run_scenario
from dfedrw.peer.config.scenario import load_scenario
from tests.support.runs import quiet_console, run_job

pytestmark = pytest.mark.slow

TORCHRUN = Path(sys.executable).with_name("torchrun")
REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 240  # seconds for one torchrun job; a 20-round run takes well under a minute

SCENARIO = """\
seed = 43
rounds = 20

[data]
name = "digits"

[topology]
honest = {honest}
byzantine = {byzantine}

[attack]
name = "{attack}"

[eval]
every = 0

[network]
round_timeout = 10
transport = "{transport}"
"""


def write_scenario(path, *, transport, honest=4, byzantine=1, attack="gaussian", kind=None):
    text = SCENARIO.format(honest=honest, byzantine=byzantine, attack=attack, transport=transport)
    if kind:
        text = text.replace("[topology]\n", f'[topology]\nkind = "{kind}"\n')
    path.write_text(text)
    return path


def torchrun(scenario_file, out, nproc, env=None):
    """Run one torchrun job to completion (bounded); returns (exit code, output, seconds). The
    ranks see no GPU unless ``env`` names some (CUDA_VISIBLE_DEVICES): a rank takes a GPU when
    it sees one, and the CPU runs here are compared with in-process runs on the CPU."""
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    child_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        # gloo binds to the address the host name resolves to unless told otherwise: keep it on loopback.
        "GLOO_SOCKET_IFNAME": "lo",
        "CUDA_VISIBLE_DEVICES": "",
        **(env or {}),
    }
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), "-m", "dfedrw.launch.torchrun", "--scenario", str(scenario_file), "--out", str(out)]
    start = time.monotonic()
    rc, output = run_job(cmd, cwd=REPO, timeout=RUN_TIMEOUT, env=child_env)
    return rc, output, time.monotonic() - start


def read_summary(out):
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Results folders of the scenario run under torchrun per transport, made on first use."""
    made = {}

    def get(transport):
        if transport not in made:
            base = tmp_path_factory.mktemp(f"torchrun-{transport}")
            scenario = write_scenario(base / "scenario.toml", transport=transport)
            rc, output, _ = torchrun(scenario, base / "out", 5)
            assert rc == 0, output[-4000:]
            made[transport] = base / "out"
        return made[transport]

    return get


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same scenario through the ``dfedrw run`` entry point (in-process transport)."""
    base = tmp_path_factory.mktemp("inproc")
    scenario = load_scenario(write_scenario(base / "scenario.toml", transport="inproc"))
    _, summary = run_scenario(scenario, base / "out", console=quiet_console())
    return base / "out", summary


@pytest.mark.parametrize("transport", ["grpc", "torch"])
def test_torchrun_results_have_the_format_of_dfedrw_run(runs, reference, transport):
    out = runs(transport)
    ref_out, ref = reference

    summary = read_summary(out)

    # Same keys as a `dfedrw run` summary, plus what says who collected it.
    assert set(summary) - set(ref) == {"launcher", "collected_at"}
    assert set(ref) <= set(summary)
    assert summary["launcher"] == "torchrun" and summary["transport"] == transport
    assert {k: set(p) for k, p in summary["peers"].items()} == {k: set(p) for k, p in ref["peers"].items()}
    assert summary["failed_peers"] == []
    assert all(p["completed"] and p["rounds_done"] == 20 for p in summary["peers"].values())
    assert [p["role"] for p in summary["peers"].values()].count("byzantine") == 1
    assert summary["byzantine_weight_share"] < 0.01
    pids = [p["pid"] for p in summary["peers"].values()]
    assert len(set(pids)) == 5 and os.getpid() not in pids
    # The results folder holds what `dfedrw run` writes.
    for k in range(5):
        assert (out / "peers" / f"{k}.json").exists()
        records = [json.loads(line) for line in (out / "peers" / f"{k}.jsonl").read_text().splitlines()]
        ref_records = [json.loads(line) for line in (ref_out / "peers" / f"{k}.jsonl").read_text().splitlines()]
        assert len(records) == 20 and set(records[0]) == set(ref_records[0])
    assert (out / "scenario.toml").read_text() == (ref_out / "scenario.toml").read_text().replace('"inproc"', f'"{transport}"')


def test_grpc_under_torchrun_runs_with_mutual_tls(runs):
    out = runs("grpc")

    summary = read_summary(out)

    # No certificate folder was given: rank 0 made one in the results folder for every rank.
    assert summary["tls"] == "mutual"
    assert sorted(p.name for p in (out / "certs").iterdir()) == sorted(
        ["ca.pem"] + [f"client-{k}.{ext}" for k in range(5) for ext in ("pem", "key")]
    )
    assert all((out / "certs" / f"client-{k}.key").stat().st_mode & 0o777 == 0o600 for k in range(5))
    for k in range(5):
        assert json.loads((out / "peers" / f"{k}.json").read_text())["tls"] == "mutual", f"client {k}"
    # The torch transport has no TLS of its own; the summary says so rather than "off".
    assert read_summary(runs("torch"))["tls"] == "n/a (torch transport)"


def test_grpc_and_torch_transports_give_the_same_accuracies(runs, reference):
    grpc, torch_ = read_summary(runs("grpc")), read_summary(runs("torch"))
    _, inproc = reference

    for k, p in grpc["peers"].items():
        expected = (p["accuracy"], p["global_accuracy"])
        assert (torch_["peers"][k]["accuracy"], torch_["peers"][k]["global_accuracy"]) == expected
        assert (inproc["peers"][k]["accuracy"], inproc["peers"][k]["global_accuracy"]) == expected
    assert grpc["honest_mean_accuracy"] == torch_["honest_mean_accuracy"] == inproc["honest_mean_accuracy"] is not None


def test_an_epidemic_schedule_runs_over_the_torch_transport_as_in_process(tmp_path):
    """Every pair that may meet has its process groups; each round's models go to that round's
    receivers only, and the run computes what the in-process transport does."""
    schedule = '[topology.schedule_params.epidemic]\nfanout = 2\n'
    base = write_scenario(tmp_path / "scenario.toml", transport="torch").read_text()
    scenario_file = tmp_path / "scenario.toml"
    scenario_file.write_text(base.replace("[topology]\n", '[topology]\nschedule = "epidemic"\n') + schedule)
    rc, output, _ = torchrun(scenario_file, tmp_path / "out", 5)
    assert rc == 0, output[-4000:]
    reference = load_scenario(scenario_file, ["network.transport=inproc"])
    _, inproc = run_scenario(reference, tmp_path / "inproc", console=quiet_console())

    summary = read_summary(tmp_path / "out")
    assert summary["failed_peers"] == [] and summary["schedule"] == "epidemic" and summary["mean_degree"] == 2.0
    for k in range(5):
        records = [json.loads(line) for line in (tmp_path / "out" / "peers" / f"{k}.jsonl").read_text().splitlines()]
        ref_records = [json.loads(line) for line in (tmp_path / "inproc" / "peers" / f"{k}.jsonl").read_text().splitlines()]
        assert [(r["neighbours"], r["sent_to"], sorted(r["weights"])) for r in records] == [
            (r["neighbours"], r["sent_to"], sorted(r["weights"])) for r in ref_records
        ]
        assert all(r.get("missing", []) == [] for r in records)  # a Byzantine record has none
    for k, p in summary["peers"].items():
        assert (p["accuracy"], p["global_accuracy"]) == (inproc["peers"][k]["accuracy"], inproc["peers"][k]["global_accuracy"])


def test_colluding_twins_against_the_screened_rule_under_torchrun(tmp_path):
    """Two colluding Byzantine ranks pool over their own mutual-TLS calls and play the screened
    rule whole; the run computes what the in-process transport does."""
    base = write_scenario(tmp_path / "scenario.toml", transport="grpc", byzantine=2, attack="colluding_twins").read_text()
    scenario_file = tmp_path / "scenario.toml"
    scenario_file.write_text(
        base.replace('[attack]\n', '[attack]\ncolluding = true\n')
        + '\n[aggregation]\nrule = "screened_reweighting"\ntpm = "loss"\ncrs = "loss_drop_highest"\n'
    )
    rc, output, _ = torchrun(scenario_file, tmp_path / "out", 6)
    assert rc == 0, output[-4000:]
    _, inproc = run_scenario(load_scenario(scenario_file, ["network.transport=inproc"]), tmp_path / "inproc", console=quiet_console())

    summary = read_summary(tmp_path / "out")
    assert summary["failed_peers"] == [] and summary["tls"] == "mutual"
    byzantine = sorted(int(k) for k, p in summary["peers"].items() if p["role"] == "byzantine")
    assert len(byzantine) == 2
    for b in byzantine:
        records = [json.loads(line) for line in (tmp_path / "out" / "peers" / f"{b}.jsonl").read_text().splitlines()]
        assert {r["attack"]["role"] for r in records} == {"twin"} and all(r["pooled_from"] == byzantine for r in records)
    for k, p in summary["peers"].items():
        assert (p["accuracy"], p["global_accuracy"]) == (inproc["peers"][k]["accuracy"], inproc["peers"][k]["global_accuracy"])


def test_world_size_other_than_the_clients_fails_with_both_numbers(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", transport="grpc")

    rc, output, _ = torchrun(scenario, tmp_path / "out", 2)

    assert rc != 0
    assert "WORLD_SIZE=2" in output and "5 clients" in output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; torch.cuda.is_available() is False")
def test_four_clients_share_one_gpu_over_grpc(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", transport="grpc", honest=3, byzantine=1)

    rc, output, _ = torchrun(scenario, tmp_path / "out", 4, env={"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]})

    assert rc == 0, output[-4000:]
    summary = read_summary(tmp_path / "out")
    assert summary["failed_peers"] == [] and summary["byzantine_weight_share"] < 0.01
    devices = {json.loads((tmp_path / "out" / "peers" / f"{k}.json").read_text())["device"] for k in range(4)}
    assert devices == {"cuda:0"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; torch.cuda.is_available() is False")
def test_torch_transport_with_four_ranks_on_one_gpu_goes_through_gloo_and_says_so(tmp_path):
    """NCCL needs a GPU per rank: with four ranks on one GPU the messages go through gloo on the
    CPU while each model trains on the GPU, and every client's final record says why."""
    scenario = write_scenario(tmp_path / "s.toml", transport="torch", honest=3, byzantine=1)

    rc, output, _ = torchrun(scenario, tmp_path / "out", 4, env={"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]})

    assert rc == 0, output[-4000:]
    assert "NCCL needs one GPU per rank" in (tmp_path / "out" / "logs" / "0.log").read_text()
    summary = read_summary(tmp_path / "out")
    assert summary["failed_peers"] == [] and summary["transport"] == "torch"
    finals = [json.loads((tmp_path / "out" / "peers" / f"{k}.json").read_text()) for k in range(4)]
    assert {f["device"] for f in finals} == {"cuda:0"} and {f["transport_backend"] for f in finals} == {"gloo"}
    assert all("4 ranks share 1 GPU(s)" in f["transport_backend_note"] for f in finals)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL refuses two ranks on one GPU; needs >= 2 GPUs")
def test_torch_transport_over_nccl_one_gpu_per_rank(tmp_path):
    n = min(torch.cuda.device_count(), 4)
    scenario = write_scenario(tmp_path / "s.toml", transport="torch", honest=n, byzantine=0, attack="none", kind="complete")

    rc, output, _ = torchrun(scenario, tmp_path / "out", n, env={"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n))})

    assert rc == 0, output[-4000:]
    summary = read_summary(tmp_path / "out")
    assert summary["failed_peers"] == [] and summary["transport"] == "torch"
    finals = [json.loads((tmp_path / "out" / "peers" / f"{k}.json").read_text()) for k in range(n)]
    assert [f["device"] for f in finals] == [f"cuda:{k}" for k in range(n)]
    assert {f["transport_backend"] for f in finals} == {"nccl"} and not any("transport_backend_note" in f for f in finals)

