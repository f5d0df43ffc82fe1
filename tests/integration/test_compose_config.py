"""``docker-compose config`` (a subprocess; it needs no engine) reads the generated cluster
as ``dfedrw compose`` meant it."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dfedrw.launch.compose import write_compose
from dfedrw.launch.compose_plan import ATTACK_ENV, ComposeOptions, default_user
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.wiring.plan import scenario_topology
from tests.support.compose import peers_of


COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose is not on PATH (apt-get install -y --no-install-recommends docker-compose)"
)


def compose_config(folder: Path) -> dict:
    """The file as docker-compose reads it, as a dict (docker-compose v2 prints JSON; v1 only
    YAML, read with the YAML library its own interpreter carries)."""
    run = subprocess.run([COMPOSE, "config", "--format", "json"], cwd=folder, capture_output=True, text=True, timeout=60)
    if run.returncode == 0 and run.stdout.lstrip().startswith("{"):
        return json.loads(run.stdout)
    # v1 answers an unknown option with its usage text (and exit status 0).
    yaml_text = subprocess.run([COMPOSE, "config"], cwd=folder, capture_output=True, text=True, timeout=60, check=True).stdout
    shebang = Path(COMPOSE).read_text(errors="replace").splitlines()[0]
    interpreter = shebang[2:].split()
    to_json = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
    out = subprocess.run([*interpreter, "-c", to_json], input=yaml_text, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@needs_compose
def test_docker_compose_reads_the_file_as_generated(tmp_path):
    # Prepare
    scenario = load_scenario(None)
    topology = scenario_topology(scenario)
    write_compose(scenario, tmp_path, ComposeOptions(port=50100))

    # Execute
    config = compose_config(tmp_path)

    # Assert
    services = config["services"]
    assert set(services) == {f"client-{k}" for k in range(12)} | {"summarize"}
    for k in range(12):
        svc = services[f"client-{k}"]
        assert peers_of(svc["command"]) == {j: f"client-{j}:50100" for j in topology.neighbours(k)}
        assert "--listen-port 50100" in " ".join(svc["command"])
        assert svc["image"] == "dfedrw:latest"
        if k in topology.byzantine:
            assert svc["environment"] == {ATTACK_ENV: "gaussian"}
            assert svc["command"][:2] == ["sh", "-c"]
        else:
            assert "environment" not in svc
            assert svc["command"][:3] == ["python", "-m", "dfedrw.peer"]
    assert [k for k, s in services.items() if "build" in s] == ["client-0"]
    assert services["summarize"]["profiles"] == ["summarize"]
    assert config["networks"]["default"]["internal"] is True
    # Certificates as secrets: each client gets the CA's certificate and its own pair, nothing else.
    assert set(config["secrets"]) == {"ca"} | {f"client-{k}-{x}" for k in range(12) for x in ("cert", "key")}
    assert config["secrets"]["client-3-key"]["file"] == str(tmp_path / "certs" / "client-3.key")
    for k in range(12):
        svc = services[f"client-{k}"]
        got = sorted((s["source"], s["target"]) for s in svc["secrets"])
        assert got == [("ca", "ca.pem"), (f"client-{k}-cert", f"client-{k}.pem"), (f"client-{k}-key", f"client-{k}.key")]
        assert "--certs /run/secrets" in " ".join(svc["command"])
        assert svc["user"] == default_user() and not svc["user"].startswith("0:")
        # Its own results folder is the one thing it can write.
        writable = [v for v in svc["volumes"] if not (v.endswith(":ro") if isinstance(v, str) else v.get("read_only"))]
        assert writable == [f"{tmp_path}/results/clients/{k}:/results/peers:rw"], writable
    assert "secrets" not in services["summarize"]
    assert f"{tmp_path}/results:/results:rw" in services["summarize"]["volumes"]


@needs_compose
def test_a_cifar_cluster_of_resnet18_clients_mounts_the_data_folder(tmp_path):
    from tests.support.datafiles import write_cifar

    data = tmp_path / "cifar"
    write_cifar(data / "cifar-10-batches-bin", (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"), (10,))
    scenario = load_scenario(None, ["data.name=cifar10", f"data.dir={data}", "train.model=resnet18", "topology.honest=4", "topology.byzantine=1"])
    write_compose(scenario, tmp_path / "cluster", ComposeOptions(port=50100))
    services = compose_config(tmp_path / "cluster")["services"]
    written = load_scenario(tmp_path / "cluster" / "scenario.toml")
    assert written.train.model == "resnet18" and written.data.name == "cifar10"
    for k in range(5):
        mounts = [v if isinstance(v, str) else f"{v['source']}:{v['target']}:{'ro' if v.get('read_only') else 'rw'}" for v in services[f"client-{k}"]["volumes"]]
        assert f"{data.resolve()}:{written.data.dir}:ro" in mounts, mounts
