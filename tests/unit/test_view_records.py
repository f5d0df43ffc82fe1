"""The web view's reading of a results folder (launch/view/records.py) and its static page, on
folders the tests write."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dfedrw.launch.view import NotARun, RunRecords, check_run_folder, export_html, page_html
from dfedrw.launch.view.records import layout, run_meta, trimmed
from dfedrw.peer.config.scenario import dump_scenario, load_scenario
from dfedrw.peer.wiring.plan import scenario_topology


def run_folder(tmp_path: Path, sets=("rounds=5",)) -> tuple[Path, object]:
    scenario = load_scenario(None, list(sets))
    folder = tmp_path / "run"
    (folder / "peers").mkdir(parents=True)
    dump_scenario(scenario, folder / "scenario.toml")
    return folder, scenario


def record(r: int, weights: dict[int, float], **more) -> str:
    return json.dumps({"round": r, "train_loss": 0.5, "weights": {str(k): w for k, w in weights.items()}, "missing": [], **more}) + "\n"


def test_the_meta_is_the_scenarios_graph_its_byzantine_clients_and_a_stable_layout(tmp_path):
    folder, scenario = run_folder(tmp_path)
    topology = scenario_topology(scenario)
    meta = RunRecords(folder).meta
    assert meta["clients"] == 12 and meta["byzantine"] == sorted(topology.byzantine) and len(meta["byzantine"]) == 2
    # An undirected edge is drawn both ways.
    assert len(meta["edges"]) == 2 * topology.graph.number_of_edges()
    assert all((v, u) in {tuple(e) for e in meta["edges"]} for u, v in meta["edges"])
    # Laid out once: the same graph and seed give the same places, inside [0, 1].
    assert meta["positions"] == RunRecords(folder).meta["positions"]
    assert all(0.0 <= x <= 1.0 and 0.0 <= y <= 1.0 for x, y in meta["positions"].values())
    assert run_meta(scenario) == meta


def test_layout_of_tiny_graphs():
    import networkx as nx

    assert set(layout(nx.path_graph(2), 0)) == {0, 1}
    assert list(layout(nx.empty_graph(1), 0)) == [0]


def test_poll_reads_whole_lines_only_and_each_once(tmp_path):
    folder, _ = run_folder(tmp_path)
    records = RunRecords(folder)
    log = folder / "peers" / "0.jsonl"
    log.write_text(record(0, {0: 0.5, 2: 0.5}) + '{"round": 1, "weig')
    first = [json.loads(x) for x in records.poll()]
    assert [(r["c"], r["round"]) for r in first] == [(0, 0)]
    assert first[0]["weights"] == {"0": 0.5, "2": 0.5} and "train_loss" not in first[0]
    assert records.poll() == []  # the torn line is not read until it is whole
    with log.open("a") as f:
        f.write('hts": {"0": 1.0}, "missing": [2]}\n')
    second = [json.loads(x) for x in records.poll()]
    assert second == [{"c": 0, "round": 1, "weights": {"0": 1.0}, "missing": [2]}]
    assert len(records.history) == 2
    assert [json.loads(x)["round"] for x in records.history[0:2]] == [0, 1]


def test_a_line_that_is_not_json_is_skipped_not_fatal(tmp_path):
    folder, _ = run_folder(tmp_path)
    (folder / "peers" / "3.jsonl").write_text("garbage\n" + record(0, {3: 1.0}))
    assert [json.loads(x)["round"] for x in RunRecords(folder).poll()] == [0]


def test_trimmed_keeps_what_the_page_draws_and_no_nan():
    out = trimmed(4, {"round": 2, "weights": {"4": 1.0}, "train_loss": 0.1, "accuracy": float("nan"), "scores": {"4": 0.2}, "bytes_received": 9})
    assert out == {"c": 4, "round": 2, "weights": {"4": 1.0}, "accuracy": None, "scores": {"4": 0.2}}
    json.dumps(out, allow_nan=False)


def test_finals_are_read_once_written(tmp_path):
    folder, _ = run_folder(tmp_path)
    records = RunRecords(folder)
    records.poll()
    assert records.finals == {}
    (folder / "peers" / "1.json").write_text(json.dumps({"completed": False, "restarts": 2, "role": "honest", "pid": 7}))
    records.poll()
    assert records.finals == {1: {"completed": False, "restarts": 2, "role": "honest"}}


def test_a_folder_that_is_not_a_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(NotARun, match="no such folder"):
        check_run_folder(tmp_path / "nothing")
    with pytest.raises(NotARun, match=r"not a run's results folder \(no scenario.toml\)$"):
        check_run_folder(tmp_path)
    (tmp_path / "sweep.json").write_text("{}")
    with pytest.raises(NotARun, match="a sweep's runs are in its runs/ folder"):
        RunRecords(tmp_path)


def test_the_export_is_one_file_with_the_records_and_no_outside_reference(tmp_path):
    folder, _ = run_folder(tmp_path)
    (folder / "peers" / "0.jsonl").write_text(record(0, {0: 1.0}))
    (folder / "peers" / "2.jsonl").write_text(record(0, {2: 0.25, 0: 0.75}) + record(1, {2: 1.0}))
    dest = tmp_path / "view.html"
    assert export_html(folder, dest) == 3
    html = dest.read_text()
    assert "<!--head-->" not in html and "<!--tail-->" not in html
    assert not re.search(r'(src|href)="(?!#)', html), "the export refers to no other file"
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    payload = re.search(r'<script id="run-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    data = json.loads(payload.replace("<\\/", "</"))
    assert [(r["c"], r["round"]) for r in data["records"]] == [(0, 0), (2, 0), (2, 1)]
    assert data["meta"]["clients"] == 12


def test_the_served_page_asks_for_its_files_with_the_token():
    html = page_html("tok")
    assert 'src="static/view.js?token=tok"' in html and 'href="static/view.css?token=tok"' in html


def test_data_that_holds_an_end_tag_cannot_end_the_pages_script_early():
    html = page_html(None, {"meta": {"rule": "</script><script>alert(1)</script>"}, "records": [], "finals": {}})
    payload = re.search(r'<script id="run-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    assert json.loads(payload.replace("<\\/", "</"))["meta"]["rule"] == "</script><script>alert(1)</script>"


def test_the_history_is_spooled_and_read_back_in_slices():
    from dfedrw.launch.view.records import SpooledHistory

    history = SpooledHistory()
    assert len(history) == 0 and history[0:5] == []
    texts = [json.dumps({"c": k, "round": r, "note": "x" * (k * r)}) for r in range(40) for k in range(3)]
    for start in range(0, len(texts), 7):  # added in uneven batches, as polls add them
        history.extend(texts[start : start + 7])
    history.extend([])
    assert len(history) == 120
    assert history[:] == texts and history[5:9] == texts[5:9] and history[118:500] == texts[118:]
    assert history[50:50] == [] and history[-3:] == texts[-3:]
    with pytest.raises(TypeError, match="slices"):
        history[3]
