"""What the web view costs and how fast it draws, in a real headless browser (Debian's chromium
and chromedriver, driven by Selenium).

* ``load``: a batched run of ``--clients`` clients (100 by default, Erdos-Renyi rho 0.1: about
  1,000 directed edges) is served by ``dfedrw view``; printed: seconds from opening the page to
  every round drawn, and the milliseconds one scrub step takes to repaint (the slider's
  ``show(r)``: graph, charts and table), median and largest over ``--steps`` rounds;
* ``run``: the default scenario run without ``--view``, with it and no page open, and with a
  page open on it, in turn, ``--pairs`` times; printed: each run's wall seconds, the medians and
  their ratios to the run without.

``--shots DIR`` also writes screenshots: the live page of the default run while it goes
(``view-live.png``) and the static export of the finished run (``view-export.png``).

    python bench/view_bench.py
    python bench/view_bench.py --only load --clients 100
    python bench/view_bench.py --only run --rounds 3000 --pairs 3 --shots docs/images

The browser helpers here are the ones the browser test uses (tests/multiprocess/test_view_browser.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_missing() -> str | None:
    """Why no headless browser can run here (None: one can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


def chrome(width: int = 1400, height: int = 900):
    """A headless Chromium at ``width`` x ``height``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_js(driver, expression: str, timeout: float, every: float = 0.1):
    """The value of ``expression`` once it is truthy; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(f"return ({expression});")
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression!r} still false after {timeout:g} s")
        time.sleep(every)


PAGE = """({
  nodes: document.querySelectorAll('#nodes g.node').length,
  byzantine: document.querySelectorAll('#nodes g.byzantine').length,
  base: document.querySelectorAll('#base line').length,
  edges: document.querySelectorAll('#edges line').length,
  round: document.getElementById('round').textContent,
  status: document.getElementById('status').textContent,
  last: window.dfedrwView ? window.dfedrwView.state.last : -1,
  received: window.dfedrwView ? window.dfedrwView.state.received : 0,
  drawn: window.dfedrwView ? window.dfedrwView.state.drawn : 0,
})"""


def page(driver) -> dict:
    return driver.execute_script(f"return {PAGE};")


def click(driver, selector: str, tries: int = 5) -> None:
    """Click the element ``selector`` names as a person would. The page redraws its graph when
    data comes in (the run's final records arrive after it ended), which can replace the element
    between finding it and clicking it: it is found again, at most ``tries`` times."""
    from selenium.common.exceptions import StaleElementReferenceException

    for attempt in range(tries):
        try:
            driver.find_element("css selector", selector).click()
            return
        except StaleElementReferenceException:
            if attempt == tries - 1:
                raise


def drawn_edges(driver) -> list[tuple[int, int, float, float]]:
    """The weighted arrows drawn: (sender, receiver, weight, stroke width)."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#edges line:not(.missing)')].map("
        "l => [l.dataset.from, l.dataset.to, l.dataset.weight, l.getAttribute('stroke-width')]);"
    )
    return [(int(a), int(b), float(w), float(s)) for a, b, w, s in rows]


def start_run(out: Path, sets: list[str], *, view: bool) -> tuple[subprocess.Popen, str | None]:
    """``dfedrw run`` of the default scenario with ``sets`` into ``out``; with ``view``, its
    URL once printed."""
    cmd = [sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(out), *(f"--set={s}" for s in sets), *(["--view"] if view else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not view:
        return proc, None
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        if line.startswith("view: "):
            url = line.split()[1]
            # The rest of stderr is drained so the run never blocks on a full pipe.
            import threading

            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, url
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("dfedrw run --view printed no view URL")


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    """``dfedrw view folder`` and its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "dfedrw.experiments.cli", "view", str(folder)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise RuntimeError(f"dfedrw view printed {line!r}")
    return proc, line.split()[-1]


def bench_load(clients: int, rounds: int, steps: int, work: Path) -> None:
    out = work / "many"
    subprocess.run(
        [sys.executable, "-m", "dfedrw.experiments.cli", "run", "--out", str(out), "--engine", "batched", f"--set=topology.honest={clients}",
         "--set=topology.byzantine=0", "--set=attack.name=none", "--set=topology.rho=0.1", f"--set=rounds={rounds}", "--set=eval.every=20"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    proc, url = serve(out)
    driver = chrome()
    try:
        start = time.monotonic()
        driver.get(url)
        wait_js(driver, f"window.dfedrwView && window.dfedrwView.state.drawn === {clients * rounds}", 120, every=0.02)
        loaded = time.monotonic() - start
        shown = page(driver)
        repaint = []
        for i in range(steps):
            r = (i * 7919) % rounds
            repaint.append(driver.execute_script("const t = performance.now(); window.dfedrwView.show(arguments[0]); return performance.now() - t;", r))
        print(f"load: {clients} clients, {shown['edges']} weighted arrows, {rounds} rounds ({clients * rounds} records)")
        print(f"  page open to every round drawn: {loaded:.2f} s")
        print(f"  a scrub step's repaint: median {statistics.median(repaint):.1f} ms, largest {max(repaint):.1f} ms over {steps} steps")
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=30)


VARIANTS = {"off": "without --view", "served": "--view, no page open", "page": "--view, a page open"}


def bench_run(rounds: int, pairs: int, work: Path, shots: Path | None) -> None:
    sets = [f"rounds={rounds}"]
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for pair in range(pairs):
        for variant in VARIANTS:
            view = variant != "off"
            out = work / f"run-{pair}-{variant}"
            start = time.monotonic()
            proc, url = start_run(out, sets, view=view)
            driver = None
            if variant == "page":
                driver = chrome()
                driver.get(url)
                if shots is not None and pair == 0:
                    wait_js(driver, f"window.dfedrwView && window.dfedrwView.state.last >= {min(rounds - 1, rounds // 3)}", 600)
                    time.sleep(0.5)
                    driver.save_screenshot(str(shots / "view-live.png"))
            proc.wait(timeout=3600)
            walls[variant].append(time.monotonic() - start)
            if driver is not None:
                driver.quit()
            print(f"  pair {pair + 1}: {VARIANTS[variant]}: {walls[variant][-1]:.1f} s", flush=True)
            if proc.returncode != 0:
                raise RuntimeError(f"dfedrw run exited with {proc.returncode}")
    off = statistics.median(walls["off"])
    print(f"run: the default scenario, {rounds} rounds, wall seconds (median of {pairs}), and each against the run without --view:")
    for variant, label in VARIANTS.items():
        median = statistics.median(walls[variant])
        print(f"  {label:22} {median:7.1f} s  {median / off:.3f}")
    if shots is not None:
        export = work / "export.html"
        subprocess.run([sys.executable, "-m", "dfedrw.experiments.cli", "view", str(work / "run-0-page"), "--html", str(export)], check=True, stdout=subprocess.DEVNULL)
        driver = chrome()
        try:
            driver.get(export.as_uri())
            wait_js(driver, f"window.dfedrwView && window.dfedrwView.state.last === {rounds - 1}", 60)
            driver.execute_script("window.dfedrwView.select(0);")
            time.sleep(0.3)
            driver.save_screenshot(str(shots / "view-export.png"))
        finally:
            driver.quit()
        print(f"screenshots: {shots / 'view-live.png'}, {shots / 'view-export.png'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("load", "run"), default=None)
    parser.add_argument("--clients", type=int, default=100, help="clients of the load case (default 100)")
    parser.add_argument("--load-rounds", type=int, default=200, help="rounds of the load case (default 200)")
    parser.add_argument("--steps", type=int, default=30, help="scrub steps timed (default 30)")
    parser.add_argument("--rounds", type=int, default=1000, help="rounds of the run case (default 1000)")
    parser.add_argument("--pairs", type=int, default=2, help="alternated pairs of the run case (default 2)")
    parser.add_argument("--shots", type=Path, default=None, metavar="DIR", help="write view-live.png and view-export.png there")
    args = parser.parse_args(argv)
    missing = browser_missing()
    if missing:
        parser.error(missing)
    if args.shots is not None:
        args.shots.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="view-bench-"))
    try:
        if args.only in (None, "load"):
            bench_load(args.clients, args.load_rounds, args.steps, work)
        if args.only in (None, "run"):
            bench_run(args.rounds, args.pairs, work, args.shots)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
