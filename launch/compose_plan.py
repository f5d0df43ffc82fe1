"""What a compose folder holds, decided from the scenario: the paths inside the containers, the
options, one service per client with its command (its graph neighbours' addresses, its
secrets, its results folder), the mounts and the outside classes' modules to copy."""

from __future__ import annotations
import dataclasses
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.wiring.build import scenario_dataset, scenario_transport
from dfedrw.peer.transport.identity import CA_FILE, cert_file, key_file
from dfedrw.peer.wiring.plan import colluding_group
from dfedrw.peer.wiring.plan import scenario_graphs, scenario_topology


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
_OWN_PACKAGES = ("dfedrw", "peer", "engines", "launch", "experiments", "topologies")


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
    """Every client's service. Its neighbours are those it may exchange with: its graph
    neighbours, or under a schedule every peer it may meet in some round (it connects to each
    when it first sends to it, see docs/schedules.md)."""
    topology = scenario_topology(scenario)
    graphs = scenario_graphs(scenario, topology)
    colluders = colluding_group(topology.byzantine, scenario.attack.colluding)
    return [
        ClientService(k, k in topology.byzantine, graphs.possible(k), colluders if k in colluders else ())
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
    if scenario_transport(scenario).placement != "processes":
        raise ValueError(
            f"compose: network.transport={scenario.network.transport!r} does not run clients as processes; "
            "containers talk over the network: set network.transport=grpc"
        )
    mounts = [Mount("./scenario.toml", SCENARIO_PATH)]
    copies: dict[str, Path] = {}
    # Inside a container the client must accept connections from the other containers.
    network = dataclasses.replace(scenario.network, host="0.0.0.0")
    data = scenario.data
    folder = getattr(scenario_dataset(data), "folder", None)
    if callable(folder):  # a set read from files (the IDX sets) is mounted; digits ships inside scikit-learn
        try:
            host_dir = folder()
        except DatasetUnavailable as exc:
            raise ValueError(f"compose: {exc}") from None
        mounts.append(Mount(str(Path(host_dir).resolve()), DATA_PATH))
        data = dataclasses.replace(data, dir=DATA_PATH)
    topology = scenario.topology
    if topology.file:
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
    """The outside modules the scenario names by import path (``module:Class``: the attack, the
    data set, model, topology and schedule, and every client's rule, TPM and CRS), as files to copy:
    ``plugins/NAME`` -> the module's file, or a package's folder, as this host imports it. One
    line if a module cannot be found."""
    named: dict[str, str] = {}
    for key, value in (
        ("attack.name", scenario.attack.name), ("data.name", scenario.data.name), ("train.model", scenario.train.model),
        ("topology.kind", scenario.topology.kind), ("topology.schedule", scenario.topology.schedule),
    ):
        if ":" in value:
            named.setdefault(value, key)
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
