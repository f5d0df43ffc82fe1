"""``dfedrw``: the command line. Thin: flags become a scenario and a call into the library.

    dfedrw run [SCENARIO] [--set key=value ...] [--out DIR]
    dfedrw peer --scenario FILE --id K (--rendezvous ENDPOINT | --peer ID=HOST:PORT ...) [--out DIR]
    dfedrw fetch {mnist,fashion-mnist} --dir DIR

Every ``peer`` flag can also come from the environment: DFEDRW_SCENARIO, DFEDRW_ID,
DFEDRW_RENDEZVOUS, DFEDRW_OUT, DFEDRW_LISTEN_PORT, DFEDRW_PEERS (comma-separated ID=HOST:PORT).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

from peer.config import ScenarioError, load_scenario
from peer.data import DatasetUnavailable


def _env(name: str, default=None):
    return os.environ.get(name, default)


def _parse_peers(items: list[str]) -> dict[int, str]:
    book: dict[int, str] = {}
    for item in items:
        for part in filter(None, item.split(",")):
            key, sep, addr = part.partition("=")
            if not sep or not key.strip().isdigit() or not addr:
                raise SystemExit(f"dfedrw: bad --peer {part!r}; expected ID=HOST:PORT")
            book[int(key)] = addr.strip()
    return book


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from launch.local import print_summary
    from launch.runner import run_scenario

    scenario = load_scenario(args.scenario, args.set)
    console = Console(stderr=True)
    out, summary = run_scenario(scenario, args.out, console=console)
    print_summary(summary, Console())
    print(f"results: {out}")
    if summary.get("interrupted"):
        return 130
    honest_failed = [k for k in summary["failed_peers"] if summary["peers"][str(k)]["role"] == "honest"]
    return 1 if len(honest_failed) == len([p for p in summary["peers"].values() if p["role"] == "honest"]) else 0


def _watch_parent(parent: int) -> None:
    """Exit if the launcher that started this client is gone, so no client is left orphaned."""

    def loop() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=loop, daemon=True, name="parent-watch").start()


def cmd_peer(args: argparse.Namespace) -> int:
    from peer.node import run_peer

    if args.scenario is None or args.id is None:
        raise SystemExit("dfedrw peer: --scenario and --id are required (or DFEDRW_SCENARIO / DFEDRW_ID)")
    parent = _env("DFEDRW_PARENT_PID")
    if parent:
        _watch_parent(int(parent))
    scenario = load_scenario(args.scenario, args.set)
    peers = _parse_peers(args.peer or ([_env("DFEDRW_PEERS")] if _env("DFEDRW_PEERS") else []))
    rendezvous = args.rendezvous
    if not rendezvous and not peers:
        raise SystemExit("dfedrw peer: give --rendezvous ENDPOINT (from a launcher) or the --peer ID=HOST:PORT list")
    final = run_peer(
        scenario,
        int(args.id),
        Path(args.out),
        rendezvous=rendezvous or None,
        addresses=None if rendezvous else peers,
        listen_port=int(args.listen_port),
    )
    logging.getLogger("peer").info("client %s done: %s", args.id, final)
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from peer.data import download_idx

    download_idx(args.dataset, args.dir)
    print(f"{args.dataset}: IDX files in {args.dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dfedrw", description="Decentralized federated learning with DFedReweighting.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a scenario as local client processes")
    run.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    run.add_argument("--out", type=Path, default=None, help="results folder (default: a new folder under runs/)")
    run.set_defaults(func=cmd_run)

    p = sub.add_parser("peer", help="run one client process")
    p.add_argument("--scenario", default=_env("DFEDRW_SCENARIO"))
    p.add_argument("--id", type=int, default=_env("DFEDRW_ID"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--rendezvous", default=_env("DFEDRW_RENDEZVOUS"), help="launcher zmq endpoint")
    p.add_argument("--peer", action="append", default=None, metavar="ID=HOST:PORT", help="static address of a client (repeatable)")
    p.add_argument("--listen-port", type=int, default=int(_env("DFEDRW_LISTEN_PORT", "0")))
    p.add_argument("--out", default=_env("DFEDRW_OUT", "runs/peer"))
    p.set_defaults(func=cmd_peer)

    f = sub.add_parser("fetch", help="download MNIST / Fashion-MNIST IDX files (needs internet)")
    f.add_argument("dataset", choices=["mnist", "fashion-mnist"])
    f.add_argument("--dir", required=True)
    f.set_defaults(func=cmd_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except ScenarioError as exc:
        print(f"dfedrw: {exc}", file=sys.stderr)
        return 2
    except (FileExistsError, DatasetUnavailable, ValueError) as exc:
        # Bad input: one clear line, no traceback.
        print(f"dfedrw: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
