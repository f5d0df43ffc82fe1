"""Run the slow selection while other processes keep every core busy, several times in a row.

A test that passes only on an idle machine fails the day CI shares its cores. This script
starts one CPU-bound process per core (``--burners``, default: the machine's cores), each of
which spins until the script ends it (or ``--limit`` seconds pass, whichever is first), then
runs ``python -m pytest -m slow`` ``--runs`` times (default 3) and prints, for each run, whether
it passed, its wall time and pytest's last line, then the burners' CPU seconds (to show they
ran). It ends every burner it started, by PID, whatever happens. Exit status: 0 when every
run passed, else 1.

    python scripts/slow_busy.py                                  # 3 runs of the slow selection, both cores busy
    python scripts/slow_busy.py --runs 1 -- tests/multiprocess   # extra arguments go to pytest
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BURN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    sum(range(10000))\n"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux), 0 when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="how many times to run the slow selection (default 3)")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="CPU-bound processes beside it (default: one per core)")
    parser.add_argument("--limit", type=float, default=4 * 3600.0, help="seconds after which a burner stops by itself (default 4 h)")
    parser.add_argument("pytest_args", nargs="*", help="further pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.burners < 0:
        parser.error("--runs must be >= 1 and --burners >= 0")
    burners = [subprocess.Popen([sys.executable, "-c", BURN, str(args.limit)]) for _ in range(args.burners)]
    print(f"slow_busy: {len(burners)} CPU-bound processes started (pids {[b.pid for b in burners]}); {args.runs} runs of the slow selection", flush=True)
    results = []
    try:
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-m", "slow", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            seconds = time.monotonic() - start
            lines = [line for line in proc.stdout.splitlines() if line.strip()]
            last = lines[-1] if lines else "(no output)"
            busy = sum(cpu_seconds(b.pid) for b in burners)
            results.append(proc.returncode == 0)
            print(f"run {run}: {'passed' if proc.returncode == 0 else 'FAILED'} in {seconds:.0f} s; {last}; burners' CPU so far {busy:.0f} s", flush=True)
            if proc.returncode != 0:
                print("\n".join(line for line in lines if line.startswith(("FAILED", "ERROR"))), flush=True)
    finally:
        for b in burners:
            if b.poll() is None:
                b.send_signal(signal.SIGTERM)
        for b in burners:
            try:
                b.wait(timeout=10)
            except subprocess.TimeoutExpired:
                b.kill()
                b.wait()
    print(f"slow_busy: {sum(results)} of {len(results)} runs passed with {len(burners)} cores kept busy")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
