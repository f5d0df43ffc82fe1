"""``dfedrw compose``: the generated cluster matches the scenario's graph, each client gets only
its own certificates and results folder and runs as a non-root user, and the files are valid
for docker-compose (``docker-compose config`` reads them in
tests/integration/test_compose_config.py)."""

import json
import os
import re
from pathlib import Path

import pytest

from dfedrw.experiments.cli import main
from dfedrw.launch.compose import write_compose
from dfedrw.launch.compose_files import render_dockerfile
from dfedrw.launch.compose_plan import ATTACK_ENV, CONTAINER_UID, ComposeOptions, container_scenario, plan_services, plugin_sources
from dfedrw.peer.config.scenario import load_scenario
from dfedrw.peer.transport.identity import load_identity, make_certificates, run_id_of
from dfedrw.peer.wiring.plan import scenario_topology
from dfedrw.peer.results.records import write_json_atomic
from tests.support.compose import peers_of


def test_default_scenario_gives_a_service_per_client_talking_to_its_neighbours(tmp_path):
    # Prepare
    scenario = load_scenario(None)
    topology = scenario_topology(scenario)

    # Execute
    folder = write_compose(scenario, tmp_path)

    # Assert
    assert [s.name for s in folder.services] == [f"client-{k}" for k in range(12)]
    assert {s.id for s in folder.services if s.byzantine} == set(topology.byzantine)
    assert len(topology.byzantine) == 2
    text = (tmp_path / "docker-compose.yml").read_text()
    for k in range(12):
        assert f"  client-{k}:" in text
    for svc in folder.services:
        assert svc.neighbours == topology.neighbours(svc.id)


def test_byzantine_service_reads_its_attack_from_its_own_environment(tmp_path):
    # Prepare
    scenario = load_scenario(None)

    # Execute
    folder = write_compose(scenario, tmp_path)

    # Assert: "$$" is compose's escape for "$", so the container's shell, not compose, reads it.
    text = (tmp_path / "docker-compose.yml").read_text()
    byzantine = [s for s in folder.services if s.byzantine]
    assert text.count(f'{ATTACK_ENV}: "gaussian"') == len(byzantine) == 2
    assert text.count(f'--set \\"attack.name=$${ATTACK_ENV}\\"') == 2
    assert f"${{{ATTACK_ENV}" not in text


def test_swapping_the_attack_changes_only_the_attack_lines(tmp_path):
    # Prepare
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["compose", "--out", str(a)]) == 0

    # Execute
    assert main(["compose", "--set", "attack.name=sign_flip", "--out", str(b)]) == 0

    # Assert
    lines_a = (a / "docker-compose.yml").read_text().splitlines()
    lines_b = (b / "docker-compose.yml").read_text().splitlines()
    assert len(lines_a) == len(lines_b)
    changed = [(x, y) for x, y in zip(lines_a, lines_b) if x != y]
    assert len(changed) == 2
    for x, y in changed:
        assert x.strip() == f'{ATTACK_ENV}: "gaussian"'
        assert y.strip() == f'{ATTACK_ENV}: "sign_flip"'
    assert load_scenario(b / "scenario.toml").attack.name == "sign_flip"


def test_scenario_file_is_the_resolved_scenario_listening_on_every_interface(tmp_path):
    # Prepare
    scenario = load_scenario(None, ["rounds=7"])

    # Execute
    write_compose(scenario, tmp_path)

    # Assert
    written = load_scenario(tmp_path / "scenario.toml")
    assert written.network.host == "0.0.0.0"
    assert written.rounds == 7
    assert scenario_topology(written).graph.edges == scenario_topology(scenario).graph.edges
    assert (tmp_path / "results").is_dir() and (tmp_path / "wheelhouse").is_dir()
    assert (tmp_path / ".dockerignore").exists() and "docker-compose up" in (tmp_path / "README.md").read_text()


def test_idx_dataset_and_edge_list_are_mounted_into_the_containers(tmp_path):
    # Prepare
    data = tmp_path / "fmnist"
    data.mkdir()
    edges = tmp_path / "ring.txt"
    edges.write_text("0 1\n1 2\n2 0\n")
    scenario = load_scenario(
        None,
        ["data.name='fashion-mnist'", f"data.dir='{data}'", "topology.kind='edgelist'", f"topology.file='{edges}'",
         "topology.honest=3", "topology.byzantine=0", "attack.name='none'"],
    )

    # Execute
    resolved, mounts, copies = container_scenario(scenario)
    write_compose(scenario, tmp_path / "out")

    # Assert
    assert resolved.data.dir == "/data" and resolved.topology.file == "/scenario/edges.txt"
    assert f"{data}:/data:ro" in [m.spec() for m in mounts]
    assert "./edges.txt:/scenario/edges.txt:ro" in [m.spec() for m in mounts]
    assert (tmp_path / "out" / "edges.txt").read_text() == edges.read_text()
    assert f'"{data}:/data:ro"' in (tmp_path / "out" / "docker-compose.yml").read_text()


def test_a_scenario_that_cannot_run_in_containers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="network.transport"):
        write_compose(load_scenario(None, ["network.transport='inproc'"]), tmp_path)
    with pytest.raises(ValueError, match="port"):
        ComposeOptions(port=0)
    assert main(["compose", "--set", "network.transport='inproc'", "--out", str(tmp_path)]) == 2


def test_dockerfile_online_uses_the_cpu_index_and_offline_uses_no_network():
    online = render_dockerfile(ComposeOptions())
    offline = render_dockerfile(ComposeOptions(offline=True))
    custom = render_dockerfile(ComposeOptions(offline=True, base_image="registry.local/debian-py:12"))

    assert "ARG BASE_IMAGE=python:3.11-slim" in online
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in online
    assert "ARG BASE_IMAGE=dfedrw-base:bookworm" in offline
    assert "--no-index" in offline and "--find-links /wheelhouse" in offline
    assert "http" not in offline
    assert "ARG BASE_IMAGE=registry.local/debian-py:12" in custom


def test_offline_compose_builds_with_no_network(tmp_path):
    write_compose(load_scenario(None), tmp_path, ComposeOptions(offline=True, image="dfedrw-test:1"))

    text = (tmp_path / "docker-compose.yml").read_text()

    assert re.search(r'build:\n\s+context: "\."\n\s+network: "none"', text)
    assert text.count('image: "dfedrw-test:1"') == 13


def write_finals(results: Path, clients: int, *, missing: int | None = None) -> None:
    for k in range(clients):
        (results / "peers").mkdir(parents=True, exist_ok=True)
        (results / "peers" / f"{k}.jsonl").write_text(json.dumps({"round": 0, "train_loss": 1.0, "weights": {str(k): 1.0}}) + "\n")
        if k != missing:
            write_json_atomic(results / "peers" / f"{k}.json", {"completed": True, "accuracy": 50.0 + k, "global_accuracy": 40.0, "pid": 1})


def test_summarize_writes_the_summary_and_fails_when_a_client_did_not_finish(tmp_path, capsys):
    # Prepare
    scenario_file = tmp_path / "scenario.toml"
    scenario_file.write_text('rounds = 1\n[topology]\nkind = "complete"\nhonest = 3\n')
    ok, broken = tmp_path / "ok", tmp_path / "broken"
    write_finals(ok, 3)
    write_finals(broken, 3, missing=2)

    # Execute
    rc_ok = main(["summarize", str(ok), "--scenario", str(scenario_file)])
    rc_broken = main(["summarize", str(broken), "--scenario", str(scenario_file)])
    rc_empty = main(["summarize", str(tmp_path / "nothing")])

    # Assert
    assert (rc_ok, rc_broken, rc_empty) == (0, 1, 2)
    summary = json.loads((ok / "summary.json").read_text())
    assert summary["honest_mean_accuracy"] == pytest.approx(51.0)
    assert json.loads((broken / "summary.json").read_text())["failed_peers"] == [2]
    assert "honest mean accuracy" in capsys.readouterr().out


def test_plan_matches_the_graph_each_client_draws():
    scenario = load_scenario(None, ["topology.honest=5", "topology.byzantine=1"])
    topology = scenario_topology(scenario)

    services = plan_services(scenario)

    assert [(s.id, s.neighbours, s.byzantine) for s in services] == [
        (k, topology.neighbours(k), k in topology.byzantine) for k in range(6)
    ]


def test_under_a_schedule_each_service_knows_every_peer_it_may_meet():
    # Prepare: epidemic (any pair may meet) and edge failures (base neighbours only)
    epidemic = load_scenario(None, ["topology.honest=5", "topology.byzantine=1", "topology.schedule=epidemic", "topology.schedule_params.epidemic.fanout=2"])
    failures = load_scenario(None, ["topology.honest=5", "topology.byzantine=1", "topology.schedule=edge_failures"])

    # Execute
    everyone, base = plan_services(epidemic), plan_services(failures)

    # Assert
    assert [s.neighbours for s in everyone] == [tuple(j for j in range(6) if j != k) for k in range(6)]
    assert [s.neighbours for s in base] == [scenario_topology(failures).neighbours(k) for k in range(6)]


def test_a_schedule_named_by_import_path_is_copied_into_the_compose_folder(tmp_path):
    scenario = load_scenario(None, ["topology.schedule=tests.support.schedules:Rotating"])
    # The schedule's module (here a package of this repository's tests) goes into plugins/.
    assert plugin_sources(scenario) == {"plugins/tests": Path(__file__).resolve().parents[1]}
    write_compose(scenario, tmp_path)
    assert (tmp_path / "plugins" / "tests" / "support" / "schedules.py").is_file()
    assert 'schedule = "tests.support.schedules:Rotating"' in (tmp_path / "scenario.toml").read_text()


def secrets_of(text: str, service: str) -> list[str]:
    """The secret targets one service of a generated file names."""
    block = text.split(f"  {service}:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r'target: "([^"]+)"', block)


def test_each_client_gets_only_its_own_certificate_and_key(tmp_path):
    # Prepare
    scenario = load_scenario(None, ["topology.honest=3", "topology.byzantine=1"])

    # Execute
    folder = write_compose(scenario, tmp_path)

    # Assert: certs/ is a complete certificate folder for the scenario, keys 0600.
    assert folder.made_certificates and folder.run_id == run_id_of(tmp_path / "certs")
    for k in range(4):
        assert load_identity(tmp_path / "certs", k).client == k
        assert (tmp_path / "certs" / f"client-{k}.key").stat().st_mode & 0o777 == 0o600
    text = (tmp_path / "docker-compose.yml").read_text()
    for k in range(4):
        assert secrets_of(text, f"client-{k}") == ["ca.pem", f"client-{k}.pem", f"client-{k}.key"]
    assert text.count("./certs/client-") == 8 and text.count('file: "./certs/ca.pem"') == 1
    assert text.count('"--certs", "/run/secrets"') == 3 and text.count("--certs /run/secrets --peer") == 1
    # The build context holds no certificate.
    assert (tmp_path / ".dockerignore").read_text().splitlines()[1] == "*"
    assert "gets, as docker-compose secrets in `/run/secrets`, only" in (tmp_path / "README.md").read_text()


def test_certificates_are_kept_when_the_folder_is_written_again_and_never_overwritten(tmp_path):
    # Prepare
    scenario = load_scenario(None, ["topology.honest=3", "topology.byzantine=1"])
    first = write_compose(scenario, tmp_path / "a")
    ca = (tmp_path / "a" / "certs" / "ca.pem").read_bytes()
    other = tmp_path / "b"
    make_certificates(2, other / "certs")  # too few clients for the scenario

    # Execute
    again = write_compose(load_scenario(None, ["topology.honest=3", "topology.byzantine=1", "attack.name=alie"]), tmp_path / "a")

    # Assert
    assert not again.made_certificates and again.run_id == first.run_id
    assert (tmp_path / "a" / "certs" / "ca.pem").read_bytes() == ca
    with pytest.raises(ValueError, match="never overwritten"):
        write_compose(scenario, other)
    assert sorted(p.name for p in (other / "certs").iterdir()) == ["ca.pem", "client-0.key", "client-0.pem", "client-1.key", "client-1.pem"]
    assert main(["compose", "--set", "topology.honest=3", "--set", "topology.byzantine=1", "--out", str(other)]) == 2


def test_a_folder_of_the_users_own_files_is_refused_and_left_as_it_was(tmp_path, capsys):
    # Prepare
    scenario = load_scenario(None, ["topology.honest=3", "topology.byzantine=1"])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    (mine / "Dockerfile").write_text("FROM scratch")
    (tmp_path / "afile").write_text("x")

    # Execute
    code = main(["compose", "--set", "topology.honest=3", "--set", "topology.byzantine=1", "--out", str(mine)])

    # Assert
    err = capsys.readouterr().err
    assert code == 2 and "did not write (Dockerfile, README.md)" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in mine.iterdir()) == ["Dockerfile", "README.md"] and (mine / "README.md").read_text() == "my notes"
    with pytest.raises(ValueError, match="is not a folder"):
        write_compose(scenario, tmp_path / "afile")
    written = write_compose(scenario, tmp_path / "again")  # a compose folder is written again
    assert write_compose(scenario, tmp_path / "again").run_id == written.run_id


def test_with_tls_off_no_certificates_are_made_or_mounted(tmp_path):
    write_compose(load_scenario(None, ["network.tls='off'"]), tmp_path)

    text = (tmp_path / "docker-compose.yml").read_text()

    assert not (tmp_path / "certs").exists()
    assert "secrets" not in text and "--certs" not in text
    assert 'Certificates: none, `network.tls = "off"`' in (tmp_path / "README.md").read_text()


def test_each_client_writes_only_its_own_results_folder_and_summarize_reads_them_all(tmp_path):
    # Prepare
    scenario = load_scenario(None, ["topology.honest=3", "topology.byzantine=1"])
    folder = write_compose(scenario, tmp_path)
    text = (tmp_path / "docker-compose.yml").read_text()
    results = tmp_path / "results"

    # Execute: what the containers write, each into its own folder (seen as /results/peers).
    for k in range(3):
        own = results / "clients" / str(k)
        (own / f"{k}.jsonl").write_text(json.dumps({"round": 0, "train_loss": 1.0, "weights": {str(k): 1.0}}) + "\n")
        write_json_atomic(own / f"{k}.json", {"completed": True, "accuracy": 60.0, "global_accuracy": 50.0, "pid": 7, "tls": "mutual"})
    rc = main(["summarize", str(results), "--scenario", str(tmp_path / "scenario.toml")])

    # Assert
    for svc in folder.services:
        mounts = re.findall(r'- "([^"]+)"', text.split(f"  {svc.name}:", 1)[1].split("\n\n", 1)[0])
        assert [m for m in mounts if not m.endswith(":ro")] == [f"./results/clients/{svc.id}:/results/peers"]
    assert sorted(os.readlink(p) for p in (results / "peers").iterdir()) == sorted(
        f"../clients/{k}/{k}.{ext}" for k in range(4) for ext in ("json", "jsonl")
    )
    assert rc == 1  # client 3 wrote nothing: it failed
    summary = json.loads((results / "summary.json").read_text())
    assert summary["failed_peers"] == [3] and summary["peers"]["0"]["completed"]
    assert summary["tls"] == "mutual"
    assert '"./results:/results"' in text.split("  summarize:", 1)[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user, the containers run as that user and nothing is chowned")
def test_as_root_keys_and_results_folders_belong_to_the_containers_user(tmp_path):
    write_compose(load_scenario(None, ["topology.honest=2", "topology.byzantine=0", "attack.name='none'"]), tmp_path)

    text = (tmp_path / "docker-compose.yml").read_text()

    assert text.count(f'user: "{CONTAINER_UID}:{CONTAINER_UID}"') == 3  # two clients and summarize
    for k in range(2):
        key = (tmp_path / "certs" / f"client-{k}.key").stat()
        assert (key.st_uid, key.st_gid, key.st_mode & 0o777) == (CONTAINER_UID, CONTAINER_UID, 0o600)
        assert (tmp_path / "results" / "clients" / str(k)).stat().st_uid == CONTAINER_UID
    assert (tmp_path / "certs" / "ca.pem").stat().st_uid == 0  # public: no need to give it away
    assert (tmp_path / "results").stat().st_uid == CONTAINER_UID  # summarize writes summary.json


def test_user_option_and_the_image_user():
    assert ComposeOptions(user="2000:3000").run_as == (2000, 3000)
    for bad in ("0:0", "root", "1000", "-1:5", "1000:x"):
        with pytest.raises(ValueError, match="user"):
            ComposeOptions(user=bad)
    for options in (ComposeOptions(), ComposeOptions(offline=True)):
        assert f"USER {CONTAINER_UID}:{CONTAINER_UID}" in render_dockerfile(options)


def test_compose_cli_takes_a_user(tmp_path):
    assert main(["compose", "--set", "topology.honest=2", "--set", "topology.byzantine=0", "--set", "attack.name='none'",
                 "--user", "2000:2000", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "docker-compose.yml").read_text().count('user: "2000:2000"') == 3
    if os.geteuid() == 0:
        assert (tmp_path / "certs" / "client-1.key").stat().st_uid == 2000
