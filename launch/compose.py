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

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from dfedrw.peer.config import Scenario, dump_scenario
from dfedrw.peer.data import DEFAULT_DIRS
from dfedrw.peer.identity import CA_FILE, IdentityError, cert_file, key_file, load_identity, make_certificates, run_id_of
from dfedrw.peer.collusion import colluding_group
from dfedrw.peer.plan import scenario_topology
from dfedrw.peer.plugins import ATTACK_REGISTRY

IMAGE = "dfedrw:latest"
ONLINE_BASE_IMAGE = "python:3.11-slim"
OFFLINE_BASE_IMAGE = "dfedrw-base:bookworm"
TORCH_REQUIREMENT = "torch==2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PORT = 50051

# Paths inside the containers.
SCENARIO_PATH = "/scenario/scenario.toml"
EDGES_PATH = "/scenario/edges.txt"
RESULTS_PATH = "/results"
# Where a client writes (RESULTS_PATH/peers): the one writable mount of its container.
CLIENT_RESULTS_PATH = RESULTS_PATH + "/peers"
DATA_PATH = "/data"
# The outside classes' modules (a scenario's module:Class names), on the services' PYTHONPATH.
PLUGINS_PATH = "/plugins"
# docker-compose mounts a service's secrets here; the client reads its certificates from it.
SECRETS_PATH = "/run/secrets"

# In the compose folder.
CERTS_DIR = "certs"
RESULTS_DIR = "results"
PLUGINS_DIR = "plugins"
# Packages of dfedrw itself, in the image already.
_OWN_PACKAGES = ("peer", "launch", "experiments")

# The clients' user in the image (no name, no home: nothing needs one). When `dfedrw compose`
# runs as root, the keys and results folders are given to this user; otherwise the containers
# run as the user who wrote the folder, who owns them already.
CONTAINER_UID = 10001

# Environment key whose value a Byzantine service passes on as --set attack.name=VALUE.
ATTACK_ENV = "DFEDRW_ATTACK"
SUMMARIZE_SERVICE = "summarize"

_IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
_USER = re.compile(r"^(0|[1-9][0-9]{0,9}):(0|[1-9][0-9]{0,9})$")


@dataclass(frozen=True)
class ComposeOptions:
    image: str = IMAGE
    # "" picks ONLINE_BASE_IMAGE or OFFLINE_BASE_IMAGE.
    base_image: str = ""
    port: int = PORT
    offline: bool = False
    # "UID:GID" the clients run as; "" picks default_user().
    user: str = ""

    def __post_init__(self) -> None:
        for key, value in (("image", self.image), ("base_image", self.base_image or OFFLINE_BASE_IMAGE)):
            if not _IMAGE_NAME.match(value):
                raise ValueError(f"compose: {key}={value!r} is not a valid image name")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"compose: port={self.port} must be in 1..65535")
        if self.user and not _USER.match(self.user):
            raise ValueError(f"compose: user={self.user!r} must be UID:GID, numbers")
        if self.user and self.user.split(":")[0] == "0":
            raise ValueError("compose: user=0:... would run the clients as root; give another UID")

    @property
    def run_as(self) -> tuple[int, int]:
        uid, gid = (self.user or default_user()).split(":")
        return int(uid), int(gid)

    @property
    def base(self) -> str:
        return self.base_image or (OFFLINE_BASE_IMAGE if self.offline else ONLINE_BASE_IMAGE)


@dataclass(frozen=True)
class ClientService:
    """One client's service: who it is and whom it talks to: its graph neighbours and, for a
    colluding Byzantine client, the other colluders (neighbours or not)."""

    id: int
    byzantine: bool
    neighbours: tuple[int, ...]
    colluders: tuple[int, ...] = ()

    @property
    def contacts(self) -> tuple[int, ...]:
        return (*self.neighbours, *(k for k in self.colluders if k != self.id and k not in self.neighbours))

    @property
    def name(self) -> str:
        return service_name(self.id)


def service_name(client: int) -> str:
    return f"client-{client}"


def default_user() -> str:
    """Who the clients run as: the user writing the folder, or CONTAINER_UID when that is root."""
    uid, gid = os.getuid(), os.getgid()
    return f"{CONTAINER_UID}:{CONTAINER_UID}" if uid == 0 else f"{uid}:{gid}"


def uses_certificates(scenario: Scenario) -> bool:
    return scenario.network.tls == "mutual"


def client_results_dir(client: int) -> str:
    """Client ``client``'s results folder, relative to the compose folder."""
    return f"{RESULTS_DIR}/clients/{client}"


def client_secrets(client: int) -> list[tuple[str, str, str]]:
    """(secret name, file in the compose folder, file name under /run/secrets): what one
    client gets, and all it gets: the CA's certificate and its own certificate and key."""
    return [
        ("ca", f"./{CERTS_DIR}/{CA_FILE}", CA_FILE),
        (f"client-{client}-cert", f"./{CERTS_DIR}/{cert_file(client)}", cert_file(client)),
        (f"client-{client}-key", f"./{CERTS_DIR}/{key_file(client)}", key_file(client)),
    ]


def plan_services(scenario: Scenario) -> list[ClientService]:
    topology = scenario_topology(scenario)
    colluders = colluding_group(topology.byzantine, scenario.attack.colluding)
    return [
        ClientService(k, k in topology.byzantine, topology.neighbours(k), colluders if k in colluders else ())
        for k in range(topology.num_clients)
    ]


def peer_command(service: ClientService, port: int, *, certs: bool = True) -> list[str]:
    """The client's command line, without the attack (see :func:`_service_command`)."""
    command = [
        "python", "-m", "dfedrw.peer", "--scenario", SCENARIO_PATH, "--id", str(service.id),
        "--out", RESULTS_PATH, "--listen-port", str(port),
    ]
    if certs:
        command += ["--certs", SECRETS_PATH]
    for k in service.contacts:
        command += ["--peer", f"{k}={service_name(k)}:{port}"]
    return command


@dataclass(frozen=True)
class Mount:
    host: str  # relative to the compose folder, or absolute
    container: str
    read_only: bool = True

    def spec(self) -> str:
        return f"{self.host}:{self.container}" + (":ro" if self.read_only else "")


def container_scenario(scenario: Scenario) -> tuple[Scenario, list[Mount], dict[str, Path]]:
    """The scenario as the containers run it, the read-only bind mounts every service has (the
    results folders are per service: see :func:`render_compose`), and the host files to copy
    into the compose folder (name in the folder -> source)."""
    if scenario.network.transport != "grpc":
        raise ValueError(
            f"compose: network.transport={scenario.network.transport!r}; containers talk over gRPC, "
            "set network.transport=grpc"
        )
    mounts = [Mount("./scenario.toml", SCENARIO_PATH)]
    copies: dict[str, Path] = {}
    # Inside a container the client must accept connections from the other containers.
    network = dataclasses.replace(scenario.network, host="0.0.0.0")
    data = scenario.data
    if data.name != "digits":  # digits ships inside scikit-learn; the IDX sets are mounted
        host_dir = data.dir or DEFAULT_DIRS.get(data.name)
        if not host_dir:
            raise ValueError(f"compose: {data.name} needs data.dir (a folder with the four IDX files)")
        if not Path(host_dir).is_dir():
            raise ValueError(f"compose: data directory {host_dir} does not exist on this host")
        mounts.append(Mount(str(Path(host_dir).resolve()), DATA_PATH))
        data = dataclasses.replace(data, dir=DATA_PATH)
    topology = scenario.topology
    if topology.kind == "edgelist":
        copies["edges.txt"] = Path(topology.file)
        mounts.append(Mount("./edges.txt", EDGES_PATH))
        topology = dataclasses.replace(topology, file=EDGES_PATH)
    plugins = plugin_sources(scenario)
    if plugins:
        copies.update(plugins)
        mounts.append(Mount(f"./{PLUGINS_DIR}", PLUGINS_PATH))
    resolved = dataclasses.replace(scenario, network=network, data=data, topology=topology)
    return resolved, mounts, copies


def plugin_sources(scenario: Scenario) -> dict[str, Path]:
    """The outside modules the scenario names by import path (``module:Class``: the attack, and
    every client's rule, TPM and CRS), as files to copy: ``plugins/NAME`` -> the module's file,
    or a package's folder, as this host imports it. One line if a module cannot be found."""
    named: dict[str, str] = {}
    if ":" in scenario.attack.name:
        named.setdefault(scenario.attack.name, "attack.name")
    for k in range(scenario.num_clients):
        cfg = scenario.aggregation_for(k)
        for kind in ("rule", "tpm", "crs"):
            value = getattr(cfg, kind)
            if isinstance(value, str) and ":" in value:
                named.setdefault(value, f"{cfg.prefix}.{kind}")
    sources: dict[str, Path] = {}
    for path, key in named.items():
        top = path.partition(":")[0].split(".")[0]
        if top in _OWN_PACKAGES:
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            raise ValueError(f"compose: {key}={path!r}: cannot find module {top!r} on this host's import path to copy into {PLUGINS_DIR}/")
        origin = Path(spec.origin)
        if spec.submodule_search_locations:
            sources[f"{PLUGINS_DIR}/{top}"] = origin.parent
        else:
            sources[f"{PLUGINS_DIR}/{origin.name}"] = origin
    return sources


# -- rendering -------------------------------------------------------------------------------
# The YAML is written by hand (no YAML library in the dependencies); every scalar is a JSON
# string, which YAML reads as the same double-quoted string.


def _q(text: str) -> str:
    # Compose substitutes ${VAR} in every value: a literal "$" must be written "$$".
    return json.dumps(text.replace("$", "$$"))


def _flow_list(items: list[str], indent: int) -> str:
    """A YAML flow sequence over several lines: the leading arguments, then the ``--peer``
    pairs four to a line, continuation lines under the first item."""
    head = items.index("--peer") if "--peer" in items else len(items)
    pairs = [items[i : i + 2] for i in range(head, len(items), 2)]
    lines = [items[:head]] + [sum(pairs[i : i + 4], []) for i in range(0, len(pairs), 4)]
    text = [", ".join(_q(x) for x in line) for line in lines if line]
    return "[" + (",\n" + " " * (indent + 1)).join(text) + "]"


def _service_command(service: ClientService, port: int, certs: bool) -> list[str]:
    command = peer_command(service, port, certs=certs)
    if not service.byzantine:
        return command
    # The attack comes from the service's own environment (its DFEDRW_ATTACK line), read by a
    # shell in the container: "$$" keeps compose from substituting it from the host's
    # environment, which would make one setting for every Byzantine service.
    line = shlex.join(command) + f' --set "attack.name=${ATTACK_ENV}"'
    return ["sh", "-c", "exec " + line]


def _volumes(mounts: list[Mount]) -> list[str]:
    return ["    volumes:", *(f"      - {_q(m.spec())}" for m in mounts)]


def render_compose(scenario: Scenario, options: ComposeOptions, mounts: list[Mount], services: list[ClientService]) -> str:
    byzantine = [s.id for s in services if s.byzantine]
    certs = uses_certificates(scenario)
    plugins = any(m.container == PLUGINS_PATH for m in mounts)
    uid, gid = options.run_as
    user = f"    user: {_q(f'{uid}:{gid}')}"
    header = [
        f"# {len(services)} DFedReweighting clients, one container each (written by `dfedrw compose`).",
        f"# Byzantine clients: {', '.join(map(str, byzantine)) or 'none'}; each takes its attack from the",
        f"# {ATTACK_ENV} line of its service (one of none, {', '.join(ATTACK_REGISTRY.names())}, or module:Class).",
        "# Build once, run, then summarize (README.md):",
        "#   docker-compose build && docker-compose up",
        f"#   docker-compose run --rm {SUMMARIZE_SERVICE}",
        "# The network is internal: containers reach each other only; no port is published.",
        f"# Clients run as user {uid}:{gid}; client K can write only results/clients/K (its /results/peers)"
        + (f",\n# and gets only ca.pem, client-K.pem and client-K.key of certs/, as secrets in {SECRETS_PATH}." if certs else "."),
        "",
        "services:",
    ]
    body: list[str] = []
    for i, svc in enumerate(services):
        command_key = "    command: "
        body.append(f"  {svc.name}:" + ("  # Byzantine" if svc.byzantine else ""))
        if i == 0:
            # One service builds the image every service runs, so `docker-compose build` builds
            # it once; `up` handles services in file order, so it exists before the others start.
            if options.offline:
                body += ["    build:", '      context: "."', '      network: "none"']
            else:
                body.append('    build: "."')
        body.append(f"    image: {_q(options.image)}")
        if i != 0:
            # The image is built here, never in a registry: a pull could only fail.
            body.append('    pull_policy: "never"')
        # An init process as PID 1 passes SIGTERM on: `docker-compose stop` ends a client at once.
        body.append("    init: true")
        body.append(user)
        if svc.byzantine or plugins:
            body.append("    environment:")
        if plugins:
            body.append(f"      PYTHONPATH: {_q(PLUGINS_PATH)}")
        if svc.byzantine:
            body.append(f"      {ATTACK_ENV}: {_q(scenario.attack.name)}")
        body.append(command_key + _flow_list(_service_command(svc, options.port, certs), len(command_key)))
        # Its own results folder is the only thing a client can write.
        body += _volumes([*mounts, Mount(f"./{client_results_dir(svc.id)}", CLIENT_RESULTS_PATH, read_only=False)])
        if certs:
            body.append("    secrets:")
            for name, _, target in client_secrets(svc.id):
                body += [f"      - source: {_q(name)}", f"        target: {_q(target)}"]
        body.append("")
    command_key = "    command: "
    summarize_cmd = ["dfedrw", "summarize", RESULTS_PATH, "--scenario", SCENARIO_PATH]
    body += [
        f"  {SUMMARIZE_SERVICE}:",
        "    # One-shot, after `docker-compose up` has returned: writes results/summary.json.",
        f"    image: {_q(options.image)}",
        '    pull_policy: "never"',
        f"    profiles: [{_q(SUMMARIZE_SERVICE)}]",
        user,
        *(["    environment:", f"      PYTHONPATH: {_q(PLUGINS_PATH)}"] if plugins else []),
        command_key + _flow_list(summarize_cmd, len(command_key)),
        # Every client's results (read through the links in results/peers), and summary.json.
        *_volumes([*mounts, Mount(f"./{RESULTS_DIR}", RESULTS_PATH, read_only=False)]),
        "",
        "networks:",
        "  default:",
        "    internal: true",
    ]
    if certs:
        # File secrets: docker-compose bind-mounts each file read-only, with the owner and mode
        # it has here (the keys: 0600, owned by the clients' user).
        body += ["", "secrets:"]
        declared: set[str] = set()
        for svc in services:
            for name, file, _ in client_secrets(svc.id):
                if name not in declared:
                    declared.add(name)
                    body += [f"  {name}:", f"    file: {_q(file)}"]
    return "\n".join(header + body) + "\n"


def render_dockerfile(options: ComposeOptions) -> str:
    user = f"""\
# The clients never run as root: a user with no name and no home (HOME=/tmp); each service of
# docker-compose.yml names the same or another UID:GID in its `user:` line.
WORKDIR /tmp
USER {CONTAINER_UID}:{CONTAINER_UID}"""
    check_wheel = (
        "ls /wheelhouse/dfedrw-*.whl >/dev/null 2>&1 || "
        "{ echo 'wheelhouse/ holds no dfedrw wheel: run scripts/build_wheelhouse.sh (see README.md)' >&2; exit 1; }"
    )
    if options.offline:
        return f"""\
# The clients' image, built with no network: a local base image with python3 (README.md says
# how to make it with debootstrap) and every wheel from ./wheelhouse
# (bash scripts/build_wheelhouse.sh DIR/wheelhouse).
ARG BASE_IMAGE={options.base}
FROM ${{BASE_IMAGE}} AS install
RUN python3 -m venv /opt/dfedrw
COPY wheelhouse/ /wheelhouse/
RUN {check_wheel} \\
    && /opt/dfedrw/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \\
       --find-links /wheelhouse /wheelhouse/dfedrw-*.whl

# Only the installed environment goes into the image, not the wheelhouse it came from.
FROM ${{BASE_IMAGE}}
COPY --from=install /opt/dfedrw /opt/dfedrw
ENV PATH=/opt/dfedrw/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PYTHONUNBUFFERED=1 HOME=/tmp
{user}
"""
    return f"""\
# The clients' image: {options.base}, the CPU build of PyTorch, then the project wheel from
# ./wheelhouse (bash scripts/build_wheelhouse.sh --project-only DIR/wheelhouse).
ARG BASE_IMAGE={options.base}
FROM ${{BASE_IMAGE}}
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The CPU index: the default one would pull several GB of CUDA packages. A layer of its own,
# so rebuilding after a change to the project does not download PyTorch again.
RUN pip install {TORCH_REQUIREMENT} --index-url {TORCH_CPU_INDEX}
COPY wheelhouse/ /wheelhouse/
RUN {check_wheel} \\
    && pip install --find-links /wheelhouse /wheelhouse/dfedrw-*.whl && rm -rf /wheelhouse
ENV HOME=/tmp
{user}
"""


DOCKERIGNORE = """\
# Only the wheels go into the build context; results, the scenario and the data are mounted.
*
!Dockerfile
!wheelhouse
"""


def render_readme(scenario: Scenario, options: ComposeOptions, services: list[ClientService], folder: str) -> str:
    """The folder's README; ``folder`` is the path the repository's commands reach it by."""
    byzantine = [s for s in services if s.byzantine]
    example = byzantine[0].name if byzantine else "client-K"
    if uses_certificates(scenario):
        certificates = f"""\
- Certificates (`network.tls = "{scenario.network.tls}"`): `certs/` holds the run's CA certificate and
  one key and certificate per client, made by `dfedrw compose` (as `dfedrw certs` would) and
  kept when the folder is written again. The CA's key was never written, so nobody can mint
  another identity. Service `client-K` gets, as docker-compose secrets in `/run/secrets`, only
  `ca.pem`, `client-K.pem` and `client-K.key`, and runs with `--certs /run/secrets`: its peers
  accept a model as client K's only over a connection that proves it holds that key. A
  Byzantine client can send bad models, but only in its own name."""
    else:
        certificates = """\
- Certificates: none, `network.tls = "off"`: no sender is authenticated, so any container on the
  network can send models in any client's name. Only for debugging."""
    if options.offline:
        build = f"""\
Offline build (no registry, no index): a local base image with python3, then every wheel from
`wheelhouse/`.

```bash
# once per machine: the base image from a minimal Debian (about a minute)
debootstrap --variant=minbase --include=python3,python3-venv bookworm rootfs http://deb.debian.org/debian
rm -f rootfs/var/cache/apt/archives/*.deb
tar -C rootfs -c . | docker import - {options.base}
# every dependency as a wheel, from the repository (same Python as the image: 3.11)
bash scripts/build_wheelhouse.sh {folder}/wheelhouse
docker-compose build
```"""
    else:
        build = f"""\
Online build: `{options.base}`, PyTorch from its CPU index, then the project wheel.

```bash
bash scripts/build_wheelhouse.sh --project-only {folder}/wheelhouse   # from the repository
docker-compose build
```

No registry here? `dfedrw compose ... --offline` writes the offline variant."""
    return f"""\
# dfedrw on docker-compose

{len(services)} clients of one DFedReweighting scenario, one container each, written by
`dfedrw compose`. Services `client-0` .. `client-{len(services) - 1}`; Byzantine:
{', '.join(f'`{s.name}`' for s in byzantine) or 'none'}. `scenario.toml` is the resolved scenario
the containers read (mounted read-only); client K writes only to `results/clients/K/`.

## Who a client is, and what it can touch

{certificates}
- User: every service runs as `user: "{':'.join(map(str, options.run_as))}"`, never root. File secrets are bind mounts,
  so a key keeps the owner and mode it has here: `certs/client-K.key` is mode 0600 and owned by
  that user (`dfedrw compose` gives it to that user when run as root; otherwise the
  containers run as you). Running `docker-compose` on another machine, copy the folder with
  owners and modes (`tar -p`, `rsync -a` as root).
- Results: `results/clients/K/` is client K's one writable mount (its `/results/peers`); no
  container sees another client's folder. `results/peers/K.json` and `K.jsonl` are links into
  it, so `results/` reads like the results folder of any other launcher.

## Build

{build}

`client-0` carries the build; every service runs the image `{options.image}`.

## Run

```bash
docker-compose up                        # every client; returns when all have finished
docker-compose run --rm summarize        # results/summary.json and the headline numbers
# or, on the host: dfedrw summarize results --scenario scenario.toml
docker-compose down                      # remove the containers and the network
```

`docker-compose up -d` runs in the background. `docker-compose logs -f` follows the clients:
each honest client logs a progress line every `rounds/20` rounds (round, training loss,
accuracy when evaluated), and every client its warnings and a final line. Every round of every
client is in `results/peers/<id>.jsonl`: `tail -f results/peers/*.jsonl`.

Results (`results/`): `peers/<id>.jsonl` per round, `peers/<id>.json` when a client finishes
(both links into `clients/<id>/`), `summary.json` from `summarize`. Before running again, move
`results/` away and run the same `dfedrw compose` command again: it makes a fresh `results/`
(with the folders and links above) and keeps `certs/`.

## Swap the attack

A Byzantine service takes its attack from one line of its environment, e.g. in `{example}`:

```yaml
    environment:
      {ATTACK_ENV}: "{scenario.attack.name}"
```

Edit that line (`none`, `gaussian`, `sign_flip`, `alie`; each Byzantine service has its own) and
run `docker-compose up` again, or regenerate everything with `dfedrw compose ... --set
attack.name=sign_flip --out {folder}`, which also records the attack in `scenario.toml`
(and rewrites an edited line).
The attack's other settings (`attack.std`, `attack.scale`, `attack.z`) come from
`scenario.toml`. No rebuild is needed for either.

## Outside classes

An attack, rule, TPM or CRS named by import path (`module:Class`) is not in the image: its
module is copied into `{PLUGINS_DIR}/` when the folder is written, mounted read-only on
`{PLUGINS_PATH}` in every service, and `{PLUGINS_PATH}` is the services' `PYTHONPATH`. To swap in
another outside attack, put its module into `{PLUGINS_DIR}/` too (or regenerate the folder).
"""


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


def write_compose(scenario: Scenario, out_dir: Path, options: ComposeOptions | None = None) -> ComposeFolder:
    """Write the compose folder for ``scenario`` into ``out_dir``: files are replaced, results
    and certificates kept (see :func:`ensure_certificates`)."""
    options = options or ComposeOptions()
    out_dir = Path(out_dir)
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
