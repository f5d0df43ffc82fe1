"""``dfedrw slurm`` writes its job without a cluster: the script's tasks, steps and GPUs, and
its one-line refusals."""

from __future__ import annotations

import pytest

from dfedrw.launch.slurm import SlurmError, job_script, write_job
from dfedrw.peer.config.scenario import load_scenario


def test_one_task_and_one_step_per_client_and_a_gpu_each_only_where_the_scenario_names_one(tmp_path):
    cpu = job_script(load_scenario(None, []), tmp_path, python="/opt/py/bin/python")
    assert "#SBATCH --ntasks=12" in cpu and "CLIENTS=12" in cpu and "gpus" not in cpu
    assert 'srun --ntasks=1 --nodes=1 --cpus-per-task=1 --job-name="client-$k"' in cpu and "RANK=$k,WORLD_SIZE=$CLIENTS" in cpu
    assert "PYTHON=/opt/py/bin/python" in cpu and '-m dfedrw.launch.torchrun --scenario "$DIR/scenario.toml"' in cpu
    gpu = job_script(load_scenario(None, ["engine.device=cuda"]), tmp_path, python="python", partition="gpu", time_limit="1:00:00")
    assert "#SBATCH --gpus-per-task=1" in gpu and "--gpus-per-task=1 --job-name" in gpu
    assert "#SBATCH --partition=gpu" in gpu and "#SBATCH --time=1:00:00" in gpu


def test_the_job_folder_holds_the_scenario_the_certificates_and_the_script(tmp_path):
    script = write_job(load_scenario(None, ["topology.honest=3", "topology.byzantine=1"]), tmp_path / "job")
    names = sorted(p.name for p in (tmp_path / "job").iterdir())
    assert names == ["certs", "job.sbatch", "logs", "scenario.toml"] and script.stat().st_mode & 0o111
    assert sorted(p.name for p in (tmp_path / "job" / "certs").glob("*.key")) == [f"client-{k}.key" for k in range(4)]
    assert "#SBATCH --ntasks=4" in script.read_text()
    with pytest.raises(SlurmError, match="must be a new or empty folder"):
        write_job(load_scenario(None, []), tmp_path / "job")


@pytest.mark.parametrize(("sets", "ntasks", "message"), [
    ([], 5, "--ntasks 5 is fewer than the scenario's 12 clients"),
    ([], 13, "--ntasks 13 is more than the scenario's 12 clients"),
    (["engine.name=batched"], None, "a peer network on Slurm runs client processes"),
    (["network.transport=inproc"], None, "network.transport = 'inproc' runs its clients as threads"),
])
def test_a_job_that_cannot_run_is_refused(tmp_path, sets, ntasks, message):
    with pytest.raises(SlurmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_job(load_scenario(None, sets), tmp_path / "job", ntasks=ntasks)
    assert not (tmp_path / "job").exists()

