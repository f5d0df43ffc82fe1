"""The text of a compose folder's files: docker-compose.yml, the Dockerfile, .dockerignore and
the README, from the plan (:mod:`launch.compose_plan`)."""

from __future__ import annotations
import json
import shlex
from dfedrw.peer.config.scenario import Scenario
from dfedrw.peer.kinds.registries import ATTACK_REGISTRY
from dfedrw.launch.compose_plan import (
    ATTACK_ENV, CLIENT_RESULTS_PATH, CONTAINER_UID, PLUGINS_DIR, PLUGINS_PATH, RESULTS_DIR, RESULTS_PATH, SCENARIO_PATH, SECRETS_PATH,
    SUMMARIZE_SERVICE, TORCH_CPU_INDEX, TORCH_REQUIREMENT, ClientService, ComposeOptions, Mount, client_results_dir, client_secrets,
    peer_command, uses_certificates,
)


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


# In the first line of every docker-compose.yml written here: how a folder to write again is known.
WRITTEN_BY = "written by `dfedrw compose`"


def render_compose(scenario: Scenario, options: ComposeOptions, mounts: list[Mount], services: list[ClientService]) -> str:
    byzantine = [s.id for s in services if s.byzantine]
    certs = uses_certificates(scenario)
    plugins = any(m.container == PLUGINS_PATH for m in mounts)
    uid, gid = options.run_as
    user = f"    user: {_q(f'{uid}:{gid}')}"
    header = [
        f"# {len(services)} DFedReweighting clients, one container each ({WRITTEN_BY}).",
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

Edit that line (`none` or any name `dfedrw list attacks` prints; each Byzantine service has its own) and
run `docker-compose up` again, or regenerate everything with `dfedrw compose ... --set
attack.name=sign_flip --out {folder}`, which also records the attack in `scenario.toml`
(and rewrites an edited line).
The attacks' settings (the `[attack.NAME]` tables, e.g. `[attack.gaussian] std`) come from
`scenario.toml`. No rebuild is needed for either.

## Outside classes

An attack, rule, TPM or CRS named by import path (`module:Class`) is not in the image: its
module is copied into `{PLUGINS_DIR}/` when the folder is written, mounted read-only on
`{PLUGINS_PATH}` in every service, and `{PLUGINS_PATH}` is the services' `PYTHONPATH`. To swap in
another outside attack, put its module into `{PLUGINS_DIR}/` too (or regenerate the folder).
"""
