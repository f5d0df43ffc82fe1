"""The launchers' command line. Thin: flags become a scenario and a call into the library.

    dfedrw run [SCENARIO] [--set key=value ...] [--out DIR] [--certs DIR] [--engine clients|batched] [--tensorboard DIR] [--view [PORT]]
    dfedrw view RUN_DIR [--port N] [--host ADDRESS] [--html FILE]
    dfedrw peer --scenario FILE --id K (--rendezvous ENDPOINT | --peer ID=HOST:PORT ...) [--out DIR] [--certs DIR] [--tensorboard DIR]
    dfedrw certs [SCENARIO] [--set key=value ...] --out DIR [--days N]
    dfedrw slurm [SCENARIO] [--set key=value ...] --out DIR [--ntasks N] [--cpus-per-task N] [--partition P] [--time LIMIT] [--python PATH]
    dfedrw fetch {mnist,fashion-mnist} --dir DIR
    dfedrw compose [SCENARIO] [--set key=value ...] --out DIR [--offline] [--image NAME] [--base-image IMAGE] [--port N] [--user UID:GID]
    dfedrw summarize OUT [--scenario FILE]
    dfedrw list [rules|tpms|crs|attacks] [--plugin module:Class ...] [--module MODULE ...] [--markdown | --readme FILE]

The ``peer`` command and its environment variables are the client's own (:mod:`peer.cli`).
The ``dfedrw`` program is this command line plus the experiments' commands (sweep, report,
export: :mod:`experiments.cli`); ``python -m dfedrw.launch.cli`` runs the launchers' commands alone.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from dfedrw.peer import cli as peer_cli
from dfedrw.peer.cli import add_peer_command, add_tensorboard_flag, dispatch, folder_path, new_parser, under_torchrun
from dfedrw.launch.procs import stop_on_signals  # noqa: F401 - re-exported: the experiments' command line uses it
from dfedrw.launch.forkserver import START_METHODS
from dfedrw.peer.config.scenario import ENGINES, Scenario, load_scenario
from dfedrw.peer.kinds.table import KINDS
from dfedrw.peer.config.unused import unused_settings


def load_told(path: Path | None, sets: list[str]) -> Scenario:
    """The scenario, after a warning line on stderr for each setting its run will not use."""
    scenario = load_scenario(path, sets)
    for line in unused_settings(scenario):
        print(f"warning: {line}", file=sys.stderr)
    return scenario


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dfedrw.launch.local import print_summary
    from dfedrw.launch.runner import run_scenario

    stop_on_signals()
    scenario = load_told(args.scenario, [*args.set, *([f"engine.name={args.engine}"] if args.engine else [])])
    console = Console(stderr=True)
    view = None
    if args.view is not None:
        from dfedrw.launch.runner import default_out_dir
        from dfedrw.launch.view import ViewServer

        args.out = args.out or default_out_dir()
        view = ViewServer(args.out, scenario=scenario, host=args.view_host, port=args.view).start()
        print(f"view: {view.url}", file=sys.stderr, flush=True)
    try:
        out, summary = run_scenario(scenario, args.out, console=console, certs=args.certs, tensorboard=args.tensorboard, start=args.start)
    finally:
        if view is not None:
            view.end()
    print_summary(summary, Console())
    print(f"results: {out}")
    if summary.get("interrupted"):
        return 130
    honest_failed = [k for k in summary["failed_peers"] if summary["peers"][str(k)]["role"] == "honest"]
    return 1 if len(honest_failed) == len([p for p in summary["peers"].values() if p["role"] == "honest"]) else 0


def cmd_view(args: argparse.Namespace) -> int:
    """``dfedrw view``: serve a results folder's view until Ctrl-C, or write it as one file."""
    from dfedrw.launch.view import ViewServer, check_run_folder, export_html

    check_run_folder(args.run)
    if args.html is not None:
        count = export_html(args.run, args.html)
        print(f"wrote {args.html}: {count} round records of {args.run}, script and style in the file")
        return 0
    stop_on_signals()
    view = ViewServer(args.run, host=args.host, port=args.port).start()
    print(f"view of {args.run}: {view.url}", flush=True)
    print("Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        while True:
            view.stopping.wait(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        view.stop()


def cmd_peer(args: argparse.Namespace) -> int:
    """``dfedrw peer``: one client; under torchrun (no --id, RANK and WORLD_SIZE set) this rank's client."""
    if not under_torchrun(args):
        return peer_cli.cmd_peer(args)
    from dfedrw.launch.torchrun import cmd_peer as cmd_rank

    return cmd_rank(args)


def cmd_certs(args: argparse.Namespace) -> int:
    from dfedrw.peer.transport.identity import make_certificates

    scenario = load_scenario(args.scenario, args.set)
    run_id = make_certificates(scenario.num_clients, args.out, days=args.days)
    print(
        f"run {run_id}: a CA and {scenario.num_clients} client certificates in {args.out} "
        f"(ca.pem, client-K.pem, client-K.key; give client K only its own key)"
    )
    return 0


def cmd_slurm(args: argparse.Namespace) -> int:
    from dfedrw.launch.slurm import write_job

    scenario = load_told(args.scenario, args.set)
    script = write_job(
        scenario, args.out, ntasks=args.ntasks, python=args.python, cpus_per_task=args.cpus_per_task, partition=args.partition, time_limit=args.time,
    )
    print(f"{scenario.num_clients} clients as {scenario.num_clients} Slurm tasks: submit with `sbatch {script}`; results in {args.out / 'run'}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from dfedrw.peer.learning.datasets import download_idx

    download_idx(args.dataset, args.dir)
    print(f"{args.dataset}: IDX files in {args.dir}")
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    from dfedrw.launch.compose import write_compose
    from dfedrw.launch.compose_plan import ComposeOptions

    options = ComposeOptions(image=args.image, base_image=args.base_image, port=args.port, offline=args.offline, user=args.user)
    folder = write_compose(load_told(args.scenario, args.set), args.out, options)
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

    from dfedrw.peer.results.collect import collect_summary, collected_now
    from dfedrw.launch.local import print_summary

    if not (args.out / "peers").is_dir():
        print(f"dfedrw summarize: {args.out / 'peers'} does not exist; OUT is the folder the clients wrote to", file=sys.stderr)
        return 2
    scenario = load_scenario(args.scenario) if args.scenario else None
    summary = collect_summary(args.out, scenario, extra={"collected_at": collected_now()})
    print_summary(summary, Console())
    print(f"summary: {args.out / 'summary.json'}")
    return 1 if summary["failed_peers"] else 0


def cmd_list(args: argparse.Namespace) -> int:
    from dfedrw.peer.kinds.catalog import list_registered, sync_readme

    if args.readme:
        fresh = sync_readme(args.readme)
        print(f"{args.readme}: registry tables {'already up to date' if fresh else 'rewritten'}")
        return 0
    print(list_registered(args.kind, plugins=args.plugin, modules=args.module, markdown=args.markdown))
    return 0


def build_parser(more: Callable[[argparse._SubParsersAction], None] | None = None) -> argparse.ArgumentParser:
    """The launchers' command line; ``more`` adds further commands (the experiments' ones)."""
    parser, sub = new_parser()

    run = sub.add_parser("run", help="run a scenario (as local client processes unless --engine batched)")
    run.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    run.add_argument("--out", type=folder_path, default=None, help="results folder (default: a new folder under runs/)")
    run.add_argument("--certs", type=folder_path, default=None, help="certificate folder from `dfedrw certs` (default: new certificates in OUT/certs)")
    run.add_argument(
        "--engine", choices=ENGINES, default=None,
        help="clients: every client its own process or thread (network.transport); batched: all clients as one tensor in this process, for experiments (same as --set engine.name=...)",
    )
    run.add_argument(
        "--start", choices=START_METHODS, default=None,
        help="how client processes start: fork (from one process that has the client code imported; the default on Linux) or spawn (each a fresh interpreter)",
    )
    add_tensorboard_flag(run, what="each honest client's rounds and their honest mean")
    run.add_argument(
        "--view", nargs="?", type=int, const=0, default=None, metavar="PORT",
        help="serve a web view of the run while it goes, on 127.0.0.1 (PORT, default: a free one); the URL with its token is printed",
    )
    run.add_argument("--view-host", default="127.0.0.1", metavar="ADDRESS", help="address the view binds (default: 127.0.0.1)")
    run.set_defaults(func=cmd_run)

    vw = sub.add_parser("view", help="serve a web view of a run's results folder (running or finished), or write it as one HTML file")
    vw.add_argument("run", type=Path, metavar="RUN_DIR", help="a run's results folder (a sweep's run: SWEEP/runs/NAME)")
    vw.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    vw.add_argument("--host", default="127.0.0.1", metavar="ADDRESS", help="address to bind (default: 127.0.0.1; the token is asked for on every request)")
    vw.add_argument("--html", type=Path, default=None, metavar="FILE", help="write one self-contained HTML file of the whole run instead of serving")
    vw.set_defaults(func=cmd_view)

    ce = sub.add_parser("certs", help="make a run's CA and one certificate per client (for compose, several hosts, torchrun)")
    ce.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario); sets the number of clients")
    ce.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    ce.add_argument("--out", type=folder_path, required=True, metavar="DIR", help="folder for ca.pem, client-K.pem and client-K.key (keys mode 0600)")
    ce.add_argument("--days", type=int, default=30, help="validity of the certificates in days (default: 30)")
    ce.set_defaults(func=cmd_certs)

    add_peer_command(sub, cmd_peer)

    sl = sub.add_parser("slurm", help="write an sbatch script that runs a scenario's clients as Slurm tasks (one peer network across an allocation)")
    sl.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario)")
    sl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    sl.add_argument("--out", type=folder_path, required=True, metavar="DIR", help="new or empty folder on a file system every node sees: job.sbatch, scenario.toml, certs/, logs/, run/")
    sl.add_argument("--ntasks", type=int, default=None, help="Slurm tasks (default and only accepted value: the scenario's number of clients)")
    sl.add_argument("--cpus-per-task", type=int, default=1, help="CPUs each client's task asks (default: 1)")
    sl.add_argument("--partition", default=None, help="the partition to ask (default: the cluster's)")
    sl.add_argument("--time", default=None, metavar="LIMIT", help="the job's time limit, as sbatch --time takes it")
    sl.add_argument("--python", default=None, help="the Python with dfedrw installed on every node (default: this one)")
    sl.set_defaults(func=cmd_slurm)

    f = sub.add_parser("fetch", help="download MNIST / Fashion-MNIST IDX files (needs internet)")
    f.add_argument("dataset", choices=["mnist", "fashion-mnist"])
    f.add_argument("--dir", required=True)
    f.set_defaults(func=cmd_fetch)

    if more is not None:
        more(sub)

    cp = sub.add_parser("compose", help="write a docker-compose cluster for a scenario (one container per client)")
    cp.add_argument("scenario", nargs="?", default=None, help="scenario TOML (default: the built-in scenario)")
    cp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    cp.add_argument("--out", type=folder_path, required=True, metavar="DIR", help="folder for docker-compose.yml, Dockerfile, scenario.toml, results/")
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

    kinds = ", ".join(k.words for k in KINDS)
    ls = sub.add_parser("list", help=f"list the registered extensions ({kinds}) with their settings")
    ls.add_argument("kind", nargs="?", choices=[k.plural for k in KINDS], help="one kind (default: all)")
    ls.add_argument("--plugin", action="append", default=[], metavar="MODULE:CLASS", help="also describe this import path (repeatable)")
    ls.add_argument("--module", action="append", default=[], metavar="MODULE", help="import this module first, e.g. one that registers classes (repeatable)")
    ls.add_argument("--markdown", action="store_true", help="print the markdown tables of docs/reference.md")
    ls.add_argument("--readme", type=Path, default=None, metavar="FILE", help="rewrite the tables between <!-- registry:KIND --> markers of FILE (the project's tables: docs/reference.md)")
    ls.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
