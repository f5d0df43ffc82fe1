"""``dfedrw``: the command line. Thin: flags become a scenario and a call into the library.

    dfedrw run [SCENARIO] [--set key=value ...] [--out DIR] [--certs DIR]
    dfedrw peer --scenario FILE --id K (--rendezvous ENDPOINT | --peer ID=HOST:PORT ...) [--out DIR] [--certs DIR]
    dfedrw certs [SCENARIO] [--set key=value ...] --out DIR [--days N]
    dfedrw fetch {mnist,fashion-mnist} --dir DIR
    dfedrw sweep GRID.toml [--out DIR] [--jobs N] [--dry-run]
    dfedrw report DIR... [--out OUTDIR] [--no-plots]
    dfedrw export SWEEP_DIR --out DIR
    dfedrw compose [SCENARIO] [--set key=value ...] --out DIR [--offline] [--image NAME] [--base-image IMAGE] [--port N] [--user UID:GID]
    dfedrw summarize OUT [--scenario FILE]
    dfedrw list [rules|tpms|crs|attacks] [--plugin module:Class ...] [--module MODULE ...] [--markdown | --readme FILE]

Every ``peer`` flag can also come from the environment: DFEDRW_SCENARIO, DFEDRW_ID,
DFEDRW_RENDEZVOUS, DFEDRW_OUT, DFEDRW_LISTEN_PORT, DFEDRW_PEERS (comma-separated ID=HOST:PORT),
DFEDRW_CERTS. The secret a client shows the launcher comes only from the environment
(DFEDRW_LINK_TOKEN, set by ``dfedrw run``), never a flag: a command line is readable by every user.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
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


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, which stops every child and records the stop.

    Set explicitly because the inherited disposition cannot be trusted: a background job of a
    non-interactive shell starts with SIGINT ignored, and Python then installs no handler, so
    Ctrl-C or ``kill -INT`` would be lost. A handler (unlike SIG_IGN) is reset at exec, so the
    processes started from here get the default disposition back.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from launch.local import print_summary
    from launch.runner import run_scenario

    _stop_on_signals()
    scenario = load_scenario(args.scenario, args.set)
    console = Console(stderr=True)
    out, summary = run_scenario(scenario, args.out, console=console, certs=args.certs)
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

    if args.id is None and _env("RANK") is not None and _env("WORLD_SIZE") is not None:
        # Under torchrun: client id = RANK, addresses through torchrun's store.
        from launch.torchrun import run_torchrun

        if args.scenario is None:
            raise SystemExit("dfedrw peer: --scenario is required (or DFEDRW_SCENARIO)")
        final = run_torchrun(load_scenario(args.scenario, args.set), Path(args.out), certs=args.certs)
        logging.getLogger("peer").info("client %s done: %s", final["id"], final)
        return 0
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
        certs=args.certs,
        link_token=_env("DFEDRW_LINK_TOKEN"),
    )
    logging.getLogger("peer").info("client %s done: %s", args.id, final)
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from peer.identity import make_certificates

    scenario = load_scenario(args.scenario, args.set)
    run_id = make_certificates(scenario.num_clients, args.out, days=args.days)
    print(
        f"run {run_id}: a CA and {scenario.num_clients} client certificates in {args.out} "
        f"(ca.pem, client-K.pem, client-K.key; give client K only its own key)"
    )
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from peer.data import download_idx

    download_idx(args.dataset, args.dir)
    print(f"{args.dataset}: IDX files in {args.dir}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console

    from launch.sweep import run_sweep

    out = args.out if args.out is not None else Path("sweeps") / args.grid.stem
    _stop_on_signals()
    try:
        result = run_sweep(args.grid, out, jobs=args.jobs, dry_run=args.dry_run, console=Console(stderr=True))
    except KeyboardInterrupt:
        # Before any run started (while checking the grid): nothing to stop or record.
        print("dfedrw sweep: interrupted", file=sys.stderr)
        return 130
    if not args.dry_run:
        print(f"results: {result.out_dir}")
    return result.exit_code


def cmd_report(args: argparse.Namespace) -> int:
    from launch.report import write_report

    out = args.out if args.out is not None else args.dirs[0] / "report"
    written = write_report(args.dirs, out, plots=not args.no_plots)
    print((out / "table.md").read_text(encoding="utf-8"), end="")
    print(f"\nwrote {len(written)} files to {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from launch.record import export_sweep

    exported, left_out = export_sweep(args.sweep, args.out)
    print(f"exported {exported} finished runs of {args.sweep} to {args.out}")
    if left_out:
        print(f"left out {len(left_out)} runs that have not finished: {', '.join(left_out[:5])}{' ...' if len(left_out) > 5 else ''}", file=sys.stderr)
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    from launch.compose import ComposeOptions, write_compose

    options = ComposeOptions(image=args.image, base_image=args.base_image, port=args.port, offline=args.offline, user=args.user)
    folder = write_compose(load_scenario(args.scenario, args.set), args.out, options)
    byzantine = [s.name for s in folder.services if s.byzantine]
    print(f"{len(folder.services)} client services (Byzantine: {', '.join(byzantine) or 'none'}) in {folder.out_dir}, run as user {options.run_as[0]}:{options.run_as[1]}")
    if folder.run_id is not None:
        what = "made" if folder.made_certificates else "kept"
        print(f"certificates of run {folder.run_id} {what} in {folder.out_dir / 'certs'}; each service gets only its own key, as a secret")
    for warning in folder.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"next: see {folder.out_dir / 'README.md'} (build the wheelhouse, docker-compose build, docker-compose up)")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    from rich.console import Console

    from launch.collect import collect_summary, collected_now
    from launch.local import print_summary

    if not (args.out / "peers").is_dir():
        print(f"dfedrw summarize: {args.out / 'peers'} does not exist; OUT is the folder the clients wrote to", file=sys.stderr)
        return 2
    scenario = load_scenario(args.scenario) if args.scenario else None
    summary = collect_summary(args.out, scenario, extra={"collected_at": collected_now()})
    print_summary(summary, Console())
    print(f"summary: {args.out / 'summary.json'}")
    return 1 if summary["failed_peers"] else 0


def cmd_list(args: argparse.Namespace) -> int:
    from peer.plugins import list_registered, sync_readme

    if args.readme:
        fresh = sync_readme(args.readme)
        print(f"{args.readme}: registry tables {'already up to date' if fresh else 'rewritten'}")
        return 0
    print(list_registered(args.kind, plugins=args.plugin, modules=args.module, markdown=args.markdown))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dfedrw", description="Decentralized federated learning with DFedReweighting.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a scenario as local client processes")
    run.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    run.add_argument("--out", type=Path, default=None, help="results folder (default: a new folder under runs/)")
    run.add_argument("--certs", type=Path, default=None, help="certificate folder from `dfedrw certs` (default: new certificates in OUT/certs)")
    run.set_defaults(func=cmd_run)

    ce = sub.add_parser("certs", help="make a run's CA and one certificate per client (for compose, several hosts, torchrun)")
    ce.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario); sets the number of clients")
    ce.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    ce.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for ca.pem, client-K.pem and client-K.key (keys mode 0600)")
    ce.add_argument("--days", type=int, default=30, help="validity of the certificates in days (default: 30)")
    ce.set_defaults(func=cmd_certs)

    p = sub.add_parser("peer", help="run one client process (under torchrun: client id = RANK)")
    p.add_argument("--scenario", default=_env("DFEDRW_SCENARIO"))
    p.add_argument("--id", type=int, default=_env("DFEDRW_ID"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--rendezvous", default=_env("DFEDRW_RENDEZVOUS"), help="launcher zmq endpoint")
    p.add_argument("--peer", action="append", default=None, metavar="ID=HOST:PORT", help="static address of a client (repeatable)")
    p.add_argument("--listen-port", type=int, default=int(_env("DFEDRW_LISTEN_PORT", "0")))
    p.add_argument("--out", default=_env("DFEDRW_OUT", "runs/peer"))
    p.add_argument("--certs", type=Path, default=_env("DFEDRW_CERTS"), help="the run's certificate folder (needed with network.tls = 'mutual')")
    p.set_defaults(func=cmd_peer)

    f = sub.add_parser("fetch", help="download MNIST / Fashion-MNIST IDX files (needs internet)")
    f.add_argument("dataset", choices=["mnist", "fashion-mnist"])
    f.add_argument("--dir", required=True)
    f.set_defaults(func=cmd_fetch)

    sw = sub.add_parser("sweep", help="run every scenario of a grid file, in parallel and resumably")
    sw.add_argument("grid", type=Path, help="grid TOML (base, set, [axes], [[variants.NAME]], [[exclude]], [report])")
    sw.add_argument("--out", type=Path, default=None, help="sweep folder (default: sweeps/<grid name>); rerun to resume")
    sw.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the number of CPUs)")
    sw.add_argument("--dry-run", action="store_true", help="print the points and their run folders, run nothing")
    sw.set_defaults(func=cmd_sweep)

    rp = sub.add_parser("report", help="tables, paper comparison and plots from sweep folders")
    rp.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="sweep folders (merged; same [report] required)")
    rp.add_argument("--out", type=Path, default=None, help="output folder (default: DIR/report of the first DIR)")
    rp.add_argument("--no-plots", action="store_true", help="write the tables only")
    rp.set_defaults(func=cmd_report)

    ex = sub.add_parser("export", help="copy a sweep's results in compact form (summary, scenario, curves, mean weights per run)")
    ex.add_argument("sweep", type=Path, metavar="SWEEP_DIR", help="folder written by `dfedrw sweep`")
    ex.add_argument("--out", type=Path, required=True, metavar="DIR", help="destination (replaced); `dfedrw report DIR` reads it like the sweep")
    ex.set_defaults(func=cmd_export)

    cp = sub.add_parser("compose", help="write a docker-compose cluster for a scenario (one container per client)")
    cp.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario)")
    cp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    cp.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for docker-compose.yml, Dockerfile, scenario.toml, results/")
    cp.add_argument("--offline", action="store_true", help="build from a local base image and a local wheelhouse, with no network")
    cp.add_argument("--image", default="dfedrw:latest", help="image name the services run (default: dfedrw:latest)")
    cp.add_argument("--base-image", default="", help="FROM image (default: python:3.11-slim, or dfedrw-base:bookworm with --offline)")
    cp.add_argument("--port", type=int, default=50051, help="port every client listens on in its container (default: 50051)")
    cp.add_argument("--user", default="", metavar="UID:GID", help="user the containers run as (default: yours, or 10001:10001 when run as root); never root")
    cp.set_defaults(func=cmd_compose)

    sm = sub.add_parser("summarize", help="write OUT/summary.json from the clients' files and print the results (exit 1 if a client failed)")
    sm.add_argument("out", type=Path, metavar="OUT", help="results folder holding peers/<id>.json(l)")
    sm.add_argument("--scenario", type=Path, default=None, metavar="FILE", help="the run's scenario (default: OUT/scenario.toml)")
    sm.set_defaults(func=cmd_summarize)

    ls = sub.add_parser("list", help="list the registered rules, TPMs, CRSs and attacks with their settings")
    ls.add_argument("kind", nargs="?", choices=("rules", "tpms", "crs", "attacks"), help="one kind (default: all)")
    ls.add_argument("--plugin", action="append", default=[], metavar="MODULE:CLASS", help="also describe this import path (repeatable)")
    ls.add_argument("--module", action="append", default=[], metavar="MODULE", help="import this module first, e.g. one that registers classes (repeatable)")
    ls.add_argument("--markdown", action="store_true", help="print the README's markdown tables")
    ls.add_argument("--readme", type=Path, default=None, metavar="FILE", help="rewrite the tables between <!-- registry:KIND --> markers of FILE")
    ls.set_defaults(func=cmd_list)
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
