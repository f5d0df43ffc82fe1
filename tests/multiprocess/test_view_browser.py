"""The web view in a real headless browser (Debian's chromium and chromedriver, Selenium): a
default run with ``--view`` watched while it goes, then scrubbed and clicked after it ended, the
drawn weights compared with the clients' records; and the static export opened from its file.
The browser helpers are bench/view_bench.py's."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from dfedrw.peer.results.records import read_rounds
from tests.support.scripts import load_bench

pytestmark = pytest.mark.slow

ROUNDS = 600
CLIENTS = 12


@pytest.fixture(scope="module")
def bench():
    module = load_bench("view_bench")
    missing = module.browser_missing()
    if missing:
        pytest.skip(missing)
    return module


def expected_edges(out, r: int, honest: list[int]) -> set[tuple[int, int, float]]:
    edges = set()
    for k in honest:
        record = next(rec for rec in read_rounds(out, k) if rec["round"] == r)
        edges |= {(int(j), k, float(w)) for j, w in record["weights"].items() if int(j) != k}
    return edges


def test_a_run_watched_live_then_scrubbed_and_clicked(bench, tmp_path):
    out = tmp_path / "run"
    proc, url = bench.start_run(out, [f"rounds={ROUNDS}"], view=True)
    driver = bench.chrome()
    try:
        # While it runs: 12 clients, 2 of them Byzantine, the graph's edges, rounds coming in.
        driver.get(url)
        bench.wait_js(driver, f"document.querySelectorAll('#nodes g.node').length === {CLIENTS}", 60)
        shown = bench.wait_js(driver, f"(() => {{ const p = {bench.PAGE}; return p.edges > 0 && p.last >= 0 && p; }})()", 120)
        assert shown["nodes"] == CLIENTS and shown["byzantine"] == 2 and shown["base"] > 0
        first = int(driver.find_element("id", "round").text)
        risen = bench.wait_js(driver, f"Number(document.getElementById('round').textContent) > {first} && Number(document.getElementById('round').textContent)", 120)
        assert proc.poll() is None, "the run was still going while the round drawn rose"
        assert risen > first
        driver.save_screenshot(str(tmp_path / "live.png"))

        # The run ends; the page has every record and says so.
        assert proc.wait(timeout=600) == 0
        bench.wait_js(driver, "document.getElementById('status').textContent === 'the run ended'", 60)
        state = driver.execute_script("const s = window.dfedrwView.state; return [s.last, s.received, [...s.byzantine]];")
        assert state[0] == ROUNDS - 1 and state[1] == CLIENTS * ROUNDS
        byzantine = set(state[2])
        honest = [k for k in range(CLIENTS) if k not in byzantine]

        # Scrubbing: the arrows drawn are the records' weights, their widths follow the weights.
        drawn_at = {}
        for r in (1, ROUNDS - 1):
            # The slider moved as a person moves it: its value set, its input event fired.
            driver.execute_script(
                "const s = document.getElementById('slider'); s.value = arguments[0]; s.dispatchEvent(new Event('input'));", r
            )
            assert driver.find_element("id", "round").text == str(r)
            drawn = bench.drawn_edges(driver)
            assert {(a, b, w) for a, b, w, _ in drawn} == expected_edges(out, r, honest)
            assert all(abs(width - (0.0015 + 0.02 * w)) < 1e-5 for _, _, w, width in drawn)
            assert {a for a, _, w, _ in drawn if w > 0} & byzantine == set(), "the honest clients gave the Gaussian attackers no weight"
            drawn_at[r] = drawn
        assert drawn_at[1] != drawn_at[ROUNDS - 1]

        # Clicking a client lists its candidates' scores and weights, as its record holds them.
        k = honest[0]
        bench.click(driver, f'#nodes g.node[data-client="{k}"] circle')
        rows = driver.execute_script(
            "return [...document.querySelectorAll('#candidates tr.candidate')].map(tr => [tr.dataset.sender, ...[...tr.cells].map(c => c.textContent)]);"
        )
        record = next(rec for rec in read_rounds(out, k) if rec["round"] == ROUNDS - 1)
        assert sorted(int(row[0]) for row in rows) == sorted(int(j) for j in record["weights"])
        assert all(len(row) == 4 for row in rows), "sender, score, weight (no staleness column under the round protocol)"
        for sender, _, score, weight in rows:
            assert float(weight) == record["weights"][sender]
            assert float(score) == record["scores"][sender]
    finally:
        driver.quit()
        if proc.poll() is None:
            proc.kill()

    # The static export: one file, opened with no server, the same run.
    export = tmp_path / "view.html"
    subprocess.run([sys.executable, "-m", "dfedrw.experiments.cli", "view", str(out), "--html", str(export)], check=True, timeout=120)
    driver = bench.chrome()
    try:
        start = time.monotonic()
        driver.get(export.as_uri())
        bench.wait_js(driver, f"window.dfedrwView && window.dfedrwView.state.drawn === {CLIENTS * ROUNDS}", 60)
        print(f"static export of {CLIENTS * ROUNDS} records drawn in {time.monotonic() - start:.2f} s")
        shown = bench.page(driver)
        assert shown["nodes"] == CLIENTS and shown["byzantine"] == 2 and shown["status"] == "a saved copy of the run"
        assert {(a, b, w) for a, b, w, _ in bench.drawn_edges(driver)} == expected_edges(out, ROUNDS - 1, honest)
        driver.save_screenshot(str(tmp_path / "export.png"))
    finally:
        driver.quit()


def test_the_marks_of_failed_restarted_and_alone_clients_and_of_missing_and_late_models(bench, tmp_path):
    import json

    from dfedrw.peer.config.scenario import dump_scenario, load_scenario
    from dfedrw.peer.wiring.plan import scenario_topology

    # Prepare: a folder written as a run writes it, with what each mark is for.
    scenario = load_scenario(None, ["rounds=2", "network.protocol=async"])
    folder = tmp_path / "run"
    (folder / "peers").mkdir(parents=True)
    dump_scenario(scenario, folder / "scenario.toml")
    topology = scenario_topology(scenario)
    honest = [k for k in range(scenario.num_clients) if k not in topology.byzantine]
    byzantine = sorted(topology.byzantine)
    a, b, c, d = honest[:4]
    records = {
        # a: a Byzantine sender given weight, an honest one late by 3 steps, one missing.
        a: {"round": 1, "weights": {str(a): 0.5, str(byzantine[0]): 0.25, str(b): 0.25}, "staleness": {str(byzantine[0]): 0, str(b): 3}, "missing": [c]},
        b: {"round": 1, "weights": {str(b): 1.0}, "missing": [], "resumed_from": 0},  # alone, and restarted
        c: {"round": 1, "weights": {str(c): 0.6, str(a): 0.4}, "missing": []},
    }
    for k, record in records.items():
        (folder / "peers" / f"{k}.jsonl").write_text(json.dumps(record) + "\n")
    (folder / "peers" / f"{d}.json").write_text(json.dumps({"completed": False, "role": "honest"}))
    export = tmp_path / "view.html"
    subprocess.run([sys.executable, "-m", "dfedrw.experiments.cli", "view", str(folder), "--html", str(export)], check=True, timeout=120)

    # Execute
    driver = bench.chrome()
    try:
        driver.get(export.as_uri())
        bench.wait_js(driver, "window.dfedrwView && window.dfedrwView.state.drawn === 3", 30)
        rings = driver.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#nodes g.node')].map(g => "
            "[g.dataset.client, [...g.querySelectorAll('circle.ring')].map(c => c.getAttribute('class').split(' ')[1]).sort()]));"
        )
        lines = driver.execute_script(
            "return [...document.querySelectorAll('#edges line')].map(l => [Number(l.dataset.from), Number(l.dataset.to), l.getAttribute('class'), l.dataset.late || null]);"
        )
    finally:
        driver.quit()

    # Assert
    assert rings[str(b)] == ["isolated", "restarted"]
    assert rings[str(d)] == ["failed"]
    assert rings[str(a)] == [] and rings[str(c)] == []
    assert sorted(map(tuple, lines)) == sorted([
        (byzantine[0], a, "byzantine", None), (b, a, "honest late", "3"), (c, a, "missing", None), (a, c, "honest", None),
    ])
