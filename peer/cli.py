"""``python -m dfedrw.peer`` / ``dfedrw peer``: run one client process.

    python -m dfedrw.peer --scenario FILE --id K (--rendezvous ENDPOINT | --peer ID=HOST:PORT ...) [--out DIR] [--certs DIR] [--tensorboard DIR]

Every flag can also come from the environment (:data:`FLAG_VARIABLES`): DFEDRW_SCENARIO, DFEDRW_ID,
DFEDRW_RENDEZVOUS, DFEDRW_OUT, DFEDRW_LISTEN_PORT, DFEDRW_PEERS (comma-separated ID=HOST:PORT),
DFEDRW_CERTS, DFEDRW_TENSORBOARD. The secret a client shows the launcher (DFEDRW_LINK_TOKEN, set by
``dfedrw run``) comes only from the environment, never a flag: any user can read a command line.

The launchers' command line (:mod:`launch.cli`) adds this command to its own, so both read the same
flags. Under torchrun (client id = RANK) the clients start with ``-m dfedrw.launch.torchrun``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from dfedrw.peer.config.scenario import SCENARIO_DIGEST_ENV, Scenario, ScenarioError, load_scenario, load_validated
from dfedrw.peer.learning.data import DatasetUnavailable
from dfedrw.peer.client.rendezvous import host_port
from dfedrw.peer.client.link_messages import TOKEN_ENV
from dfedrw.peer.results.tensorboard import INSTALL, TensorBoardUnavailable
from dfedrw.peer.quote import cut


FLAG_VARIABLES = (
    "DFEDRW_SCENARIO", "DFEDRW_ID", "DFEDRW_RENDEZVOUS", "DFEDRW_OUT", "DFEDRW_LISTEN_PORT", "DFEDRW_PEERS", "DFEDRW_CERTS",
    "DFEDRW_TENSORBOARD", "DFEDRW_SCENARIO_SHA256",
)


def _env(name: str, default=None):
    return os.environ.get(name, default)


def without_flag_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less :data:`FLAG_VARIABLES`: what a launcher hands the clients (or runs) it
    starts with their flags. A variable left in the user's shell (say by a client started by hand)
    would otherwise set what the launcher left out: every client on one port, stray event files."""
    return {name: value for name, value in environ.items() if name not in FLAG_VARIABLES}


def _parse_peers(items: list[str]) -> dict[int, str]:
    book: dict[int, str] = {}
    for item in items:
        for part in filter(None, item.split(",")):
            key, sep, addr = part.partition("=")
            if not sep or not key.strip().isdigit() or host_port(addr.strip()) is None:
                raise SystemExit(f"dfedrw: bad --peer {part!r}; expected ID=HOST:PORT with a port in 1..65535")
            book[int(key)] = addr.strip()
    return book


def _check_endpoints(args: argparse.Namespace) -> None:
    """The launcher's endpoint and the listening port, checked before anything starts."""
    if not 0 <= args.listen_port <= 65535:
        raise SystemExit(f"dfedrw peer: --listen-port {args.listen_port}: must be in 0..65535 (0: any free port)")
    if args.rendezvous and not (args.rendezvous.startswith("tcp://") and host_port(args.rendezvous[len("tcp://"):])):
        raise SystemExit(f"dfedrw peer: --rendezvous {args.rendezvous!r}: expected tcp://HOST:PORT, as a launcher gives it")


def _watch_parent(parent: int) -> None:
    """Exit if the launcher that started this client is gone, so no client is left orphaned."""

    def loop() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=loop, daemon=True, name="parent-watch").start()


def under_torchrun(args: argparse.Namespace) -> bool:
    """No --id, and torchrun's RANK and WORLD_SIZE set: the client id is the rank."""
    return args.id is None and _env("RANK") is not None and _env("WORLD_SIZE") is not None


def cmd_peer(args: argparse.Namespace) -> int:
    from dfedrw.peer.client.process import run_grpc_client

    if under_torchrun(args):
        raise SystemExit(
            "dfedrw peer: under torchrun start the clients with -m dfedrw.launch.torchrun "
            "(torchrun --nproc-per-node N -m dfedrw.launch.torchrun --scenario FILE), or give --id"
        )
    if args.scenario is None or args.id is None:
        raise SystemExit("dfedrw peer: --scenario and --id are required (or DFEDRW_SCENARIO / DFEDRW_ID)")
    _check_endpoints(args)
    peers = _parse_peers(args.peer or ([_env("DFEDRW_PEERS")] if _env("DFEDRW_PEERS") else []))
    parent = _env("DFEDRW_PARENT_PID")
    if parent:
        _watch_parent(int(parent))
    scenario = client_scenario(args.scenario, args.set)
    rendezvous = args.rendezvous
    if not rendezvous and not peers:
        raise SystemExit("dfedrw peer: give --rendezvous ENDPOINT (from a launcher) or the --peer ID=HOST:PORT list")
    final = run_grpc_client(
        scenario,
        int(args.id),
        Path(args.out),
        rendezvous=rendezvous or None,
        addresses=None if rendezvous else peers,
        listen_port=int(args.listen_port),
        certs=args.certs,
        link_token=_env(TOKEN_ENV),
        tensorboard=args.tensorboard,
    )
    logging.getLogger("dfedrw.peer").info("client %s done: %s", args.id, final)
    return 0


def client_scenario(path: str, overrides: list[str]) -> Scenario:
    """A client's scenario: not checked again when its launcher validated it and gave the file's
    digest (:data:`SCENARIO_DIGEST_ENV`) and nothing overrides it; else loaded and validated."""
    digest = _env(SCENARIO_DIGEST_ENV)
    if digest and not overrides:
        scenario = load_validated(path, digest)
        logging.getLogger("dfedrw.peer").info("scenario %s read as its launcher validated it (SHA-256 %s), not checked again", path, digest[:16])
        return scenario
    return load_scenario(path, overrides)


def add_peer_command(sub, func: Callable[[argparse.Namespace], int] = cmd_peer) -> argparse.ArgumentParser:
    """Add the ``peer`` command to the subcommands ``sub``; ``func`` runs it."""
    p = sub.add_parser("peer", help="run one client process (under torchrun: client id = RANK)")
    p.add_argument("--scenario", default=_env("DFEDRW_SCENARIO"))
    p.add_argument("--id", type=int, default=_env("DFEDRW_ID"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--rendezvous", default=_env("DFEDRW_RENDEZVOUS"), help="launcher zmq endpoint")
    p.add_argument("--peer", action="append", default=None, metavar="ID=HOST:PORT", help="static address of a client (repeatable)")
    p.add_argument("--listen-port", type=int, default=int(_env("DFEDRW_LISTEN_PORT", "0")))
    p.add_argument("--out", type=folder_path, default=_env("DFEDRW_OUT", "runs/peer"))
    p.add_argument("--certs", type=folder_path, default=_env("DFEDRW_CERTS"), help="the run's certificate folder (needed with network.tls = 'mutual')")
    add_tensorboard_flag(p)
    p.set_defaults(func=func)
    return p


def folder_path(text: str) -> Path:
    """The type of a folder flag (``--out``, ``--certs``, ``--tensorboard``): a path, not an empty
    string, which would quietly mean the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; name a folder (. for the current one)")
    return Path(text)


def add_tensorboard_flag(parser: argparse.ArgumentParser, *, what: str = "each honest client's rounds") -> None:
    """The ``--tensorboard DIR`` flag of ``run``, ``peer`` and ``sweep`` (default: DFEDRW_TENSORBOARD)."""
    default = _env("DFEDRW_TENSORBOARD")
    parser.add_argument(
        "--tensorboard", type=folder_path, default=Path(default) if default else None, metavar="DIR",
        help=f"also write {what} as TensorBoard event files under DIR (needs {INSTALL}; default: $DFEDRW_TENSORBOARD); "
        "view with `tensorboard --logdir DIR`",
    )


def new_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The ``dfedrw`` parser with its global flags and no command yet, and its subcommands."""
    parser = argparse.ArgumentParser(prog="dfedrw", description="Decentralized federated learning with DFedReweighting.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser, parser.add_subparsers(dest="command", required=True)


def dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv``, set up logging and run the command; bad input is one line and exit code 2."""
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Each message is cut to a readable length: the values it quotes are (peer.quote.shown), but
    # a key, or a plugin's own message, may still carry megabytes of what it was given.
    try:
        return args.func(args)
    except ScenarioError as exc:
        print(f"dfedrw: {cut(str(exc))}", file=sys.stderr)
        return 2
    except (FileExistsError, DatasetUnavailable, TensorBoardUnavailable, ValueError) as exc:
        print(f"dfedrw: {cut(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A path unfit for the command (a folder for a file or the reverse, nothing there, no
        # permission) or a refused write: one line naming the path (the traceback with --verbose).
        logging.getLogger("dfedrw").debug("the error in full", exc_info=True)
        print(f"dfedrw: {cut(str(exc))}", file=sys.stderr)
        return 2 if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)) else 1


def main(argv: list[str] | None = None) -> int:
    """The client's command line alone: ``argv`` is ``["peer", FLAGS...]``."""
    parser, sub = new_parser()
    add_peer_command(sub)
    return dispatch(parser, argv)
