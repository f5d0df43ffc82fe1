"""``dfedrw compose``: a docker-compose cluster for a scenario, one container per client.

Writes into a folder:

- ``docker-compose.yml``: one service ``client-K`` per client, Byzantine clients included, each
  started as ``python -m dfedrw.peer --scenario /scenario/scenario.toml --id K --out /results
  --listen-port PORT --certs /run/secrets --peer J=client-J:PORT ...`` with its graph
  neighbours only (and, with ``attack.colluding``, a Byzantine client's colluders, with whom it
  pools what it receives), as a non-root user; a Byzantine service takes its attack from the one line
  ``DFEDRW_ATTACK: NAME`` of its environment; a one-shot ``summarize`` service (profile
  ``summarize``) writes ``results/summary.json``;
- ``certs/``: the run's CA and one key and certificate per client (``dfedrw certs``), kept when
  the folder is written again. Each service gets, as docker-compose secrets under
  ``/run/secrets``, only ``ca.pem`` and its own ``client-K.pem`` and ``client-K.key``;
- ``results/``: ``clients/K/`` is the only folder client K can write (mounted on its
  ``/results/peers``), and ``peers/K.json`` / ``peers/K.jsonl`` are links into it, so
  ``dfedrw summarize results`` reads every client as from any other launcher while no
  container, Byzantine or not, can write another client's results;
- ``Dockerfile`` (online: ``python:3.11-slim`` and the CPU PyTorch index; offline: a local base
  image and a local wheelhouse, no network) and ``.dockerignore``;
- ``scenario.toml``: the resolved scenario as the containers see it (listening on 0.0.0.0,
  data and edge-list paths inside the container);
- ``plugins/``: the modules of the outside classes the scenario names by import path
  (``module:Class``), copied from where this host imports them and mounted read-only on
  ``/plugins``, which is the services' ``PYTHONPATH``;
- ``README.md`` (how to build, run, watch and swap the attack), ``wheelhouse/``.

The graph is drawn here from the scenario's seed, exactly as each client draws it, so the
address lists in the file agree with what every container computes for itself.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from dfedrw.peer.config.scenario import Scenario, dump_scenario
from dfedrw.peer.transport.identity import CA_FILE, IdentityError, key_file, load_identity, make_certificates, run_id_of
from dfedrw.launch.compose_files import DOCKERIGNORE, WRITTEN_BY, render_compose, render_dockerfile, render_readme
from dfedrw.launch.compose_plan import (
    CERTS_DIR, PLUGINS_DIR, RESULTS_DIR, ClientService, ComposeOptions, client_results_dir, container_scenario, plan_services,
    uses_certificates,
)


# -- rendering -------------------------------------------------------------------------------
# The YAML is written by hand (no YAML library in the dependencies); every scalar is a JSON
# string, which YAML reads as the same double-quoted string.


@dataclass(frozen=True)
class ComposeFolder:
    out_dir: Path
    services: list[ClientService]
    written: list[Path]
    # Things the user should know before `docker-compose up` (e.g. results of an earlier run).
    warnings: list[str]
    # The certificates' run id (None with network.tls = "off") and whether they were made now.
    run_id: str | None = None
    made_certificates: bool = False


def ensure_certificates(scenario: Scenario, folder: Path) -> tuple[str, bool]:
    """The compose folder's certificates: made when ``folder`` holds none, otherwise kept (never
    overwritten) when they fit the scenario, i.e. hold a valid identity for every client.
    Returns (run id, made now)."""
    folder = Path(folder)
    if not (folder / CA_FILE).exists():
        if folder.exists() and any(folder.iterdir()):
            raise ValueError(f"compose: {folder} holds files but no {CA_FILE}; move it away")
        return make_certificates(scenario.num_clients, folder), True
    try:
        for k in range(scenario.num_clients):
            load_identity(folder, k)
        return run_id_of(folder), False
    except (IdentityError, OSError) as exc:
        raise ValueError(
            f"compose: {folder} holds certificates that do not fit this scenario ({exc}); they are never "
            f"overwritten: move {folder} away to make new ones"
        ) from None


def prepare_results(out_dir: Path, services: list[ClientService], owner: tuple[int, int] | None) -> list[str]:
    """``results/clients/K`` for each client and the links ``results/peers/K.json(l)`` into it;
    ``owner`` (uid, gid) gets the folders a container writes (given when run as root).
    Returns warnings about an earlier run's results."""
    results = Path(out_dir) / RESULTS_DIR
    peers = results / "peers"
    peers.mkdir(parents=True, exist_ok=True)
    warnings = []
    earlier = []
    for svc in services:
        own = Path(out_dir) / client_results_dir(svc.id)
        own.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            os.chown(own, *owner)
        if any(own.iterdir()):
            earlier.append(svc.id)
        for name in (f"{svc.id}.json", f"{svc.id}.jsonl"):
            link = peers / name
            target = Path("..") / "clients" / str(svc.id) / name
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            if link.exists() or link.is_symlink():
                warnings.append(f"{link} is not a link to {target}: move {results} away and write the folder again")
                continue
            link.symlink_to(target)
    if owner is not None:
        # The summarize service writes summary.json here.
        os.chown(results, *owner)
    if earlier or (results / "summary.json").exists():
        warnings.append(
            f"{results} holds an earlier run (clients {earlier or 'none'}); a client keeps its old round log as "
            f"<id>.jsonl.1 and replaces <id>.json, so move {results} away and write the folder again before `docker-compose up`"
        )
    return warnings


def check_compose_folder(out_dir: Path) -> None:
    """``out_dir`` must be new, empty, a compose folder written before (its files are replaced),
    or hold only ``certs/`` (from ``dfedrw certs``) and ``wheelhouse/``: never a folder whose
    own files (a README.md, a Dockerfile) writing would replace."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise ValueError(f"compose: --out {out_dir} is not a folder")
    names = {p.name for p in out_dir.iterdir()}
    if names <= {CERTS_DIR, "wheelhouse"}:  # made before the folder: its certificates, its wheels
        return
    compose_file = out_dir / "docker-compose.yml"
    try:
        first = compose_file.read_text(encoding="utf-8").split("\n", 1)[0] if compose_file.is_file() else ""
    except (OSError, UnicodeDecodeError):
        first = ""
    if WRITTEN_BY not in first:
        raise ValueError(
            f"compose: --out {out_dir} holds files that `dfedrw compose` did not write ({', '.join(sorted(names)[:5])}"
            f"{', ...' if len(names) > 5 else ''}), which writing the folder would replace; give a new or empty folder"
        )


def write_compose(scenario: Scenario, out_dir: Path, options: ComposeOptions | None = None) -> ComposeFolder:
    """Write the compose folder for ``scenario`` into ``out_dir`` (see :func:`check_compose_folder`):
    files are replaced, results and certificates kept (see :func:`ensure_certificates`)."""
    options = options or ComposeOptions()
    out_dir = Path(out_dir)
    check_compose_folder(out_dir)
    resolved, mounts, copies = container_scenario(scenario)
    # From the host's scenario: the container's may name files that exist only in a container.
    services = plan_services(scenario)
    out_dir.mkdir(parents=True, exist_ok=True)
    # As root the containers' user (not root) must own what they read or write; otherwise they
    # run as the user writing the folder (default_user), who owns it all already.
    owner = options.run_as if os.getuid() == 0 else None
    run_id, made = None, False
    if uses_certificates(scenario):
        run_id, made = ensure_certificates(scenario, out_dir / CERTS_DIR)
        if owner is not None:
            for k in range(scenario.num_clients):
                os.chown(out_dir / CERTS_DIR / key_file(k), *owner)
    written: list[Path] = []

    def write(name: str, text: str) -> None:
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)

    write("docker-compose.yml", render_compose(resolved, options, mounts, services))
    write("Dockerfile", render_dockerfile(options))
    write(".dockerignore", DOCKERIGNORE)
    write("README.md", render_readme(resolved, options, services, str(out_dir)))
    dump_scenario(resolved, out_dir / "scenario.toml")
    written.append(out_dir / "scenario.toml")
    shutil.rmtree(out_dir / PLUGINS_DIR, ignore_errors=True)  # the modules of this scenario only
    for name, source in copies.items():
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, out_dir / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copyfile(source, out_dir / name)
        written.append(out_dir / name)
    # Made here so the folders belong to the user, not to the engine that would create them.
    (out_dir / "wheelhouse").mkdir(exist_ok=True)
    warnings = prepare_results(out_dir, services, owner)
    return ComposeFolder(out_dir, services, written, warnings, run_id, made)
