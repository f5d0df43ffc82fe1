"""The web view's server on loopback: the token, read-only, nothing served outside its own files
and the run's records, the records as server-sent events (launch/view/server.py)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dfedrw.launch.view import ViewServer
from dfedrw.peer.config.scenario import dump_scenario, load_scenario


@pytest.fixture()
def served(tmp_path):
    scenario = load_scenario(None, ["rounds=3"])
    folder = tmp_path / "run"
    (folder / "peers").mkdir(parents=True)
    dump_scenario(scenario, folder / "scenario.toml")
    (folder / "peers" / "0.jsonl").write_text(json.dumps({"round": 0, "weights": {"0": 0.5, "2": 0.5}, "missing": []}) + "\n")
    view = ViewServer(folder).start()
    yield view, folder
    view.stop()


def get(view: ViewServer, path: str, method: str = "GET") -> tuple[int, bytes, dict[str, str]]:
    host, port = view.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)  # the path as given: no normalising
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        conn.close()


def test_it_binds_loopback_unless_told_and_prints_a_url_with_a_token(served):
    view, _ = served
    assert view.httpd.server_address[0] == "127.0.0.1"
    assert view.url.startswith("http://127.0.0.1:") and f"token={view.token}" in view.url and len(view.token) >= 20


def test_without_the_token_every_path_is_forbidden(served):
    view, _ = served
    for path in ("/", "/meta", "/events", "/static/view.js", "/?token=", "/?token=wrong", f"/?token={view.token}x", "/nothing"):
        status, body, _ = get(view, path)
        assert status == 403, path
        assert view.token.encode() not in body


def test_with_the_token_the_page_its_files_and_the_runs_graph(served):
    view, _ = served
    t = view.token
    status, body, headers = get(view, f"/?token={t}")
    assert status == 200 and b'id="graph"' in body and headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name, kind in (("view.js", "text/javascript"), ("view.css", "text/css")):
        status, body, headers = get(view, f"/static/{name}?token={t}")
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
    status, body, _ = get(view, f"/meta?token={t}")
    assert status == 200 and json.loads(body)["clients"] == 12


def test_nothing_outside_its_own_files_and_the_records_is_served(served):
    view, folder = served
    t = view.token
    for path in (
        "/static/../records.py", "/static/%2e%2e/records.py", "/static/..%2fserver.py", "/../../etc/passwd", "//etc/passwd",
        "/etc/passwd", f"/{folder}/scenario.toml", "/static/view.html", "/static/", "/peers/0.jsonl", "/scenario.toml",
        "/static/view.js/../../server.py",
    ):
        status, body, _ = get(view, f"{path}?token={t}")
        assert status == 404, path
        assert b"root:" not in body and b"import" not in body


def test_it_is_read_only(served):
    view, _ = served
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, _, _ = get(view, f"/?token={view.token}", method)
        assert status == 405, method


def test_events_carry_the_records_then_new_ones_then_the_end(served):
    view, folder = served
    host, port = view.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=20)
    conn.request("GET", f"/events?token={view.token}")
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"

    def next_event() -> tuple[str, str]:
        name = data = ""
        while True:
            line = response.fp.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = line[len("data: ") :]
            elif line == "" and name:
                return name, data

    name, data = next_event()
    assert name == "rounds" and [(r["c"], r["round"]) for r in json.loads(data)] == [(0, 0)]
    assert next_event()[0] == "finals"
    with (folder / "peers" / "0.jsonl").open("a") as f:
        f.write(json.dumps({"round": 1, "weights": {"0": 1.0}, "missing": [2]}) + "\n")
    name, data = next_event()
    assert name == "rounds" and json.loads(data) == [{"c": 0, "round": 1, "weights": {"0": 1.0}, "missing": [2]}]
    assert next_event()[0] == "finals"
    (folder / "peers" / "0.json").write_text(json.dumps({"completed": True, "role": "honest"}))
    view.records.poll()
    view.ended = True
    with view.changed:
        view.changed.notify_all()
    assert next_event() == ("finals", json.dumps({"0": {"completed": True, "role": "honest"}}))
    assert next_event()[0] == "end"
    conn.close()


def test_dfedrw_view_of_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dfedrw.experiments.cli", "view", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"dfedrw: {tmp_path}: not a run's results folder (no scenario.toml)"]


def test_dfedrw_view_html_writes_one_file(tmp_path):
    scenario = load_scenario(None, ["rounds=3"])
    folder = tmp_path / "run"
    (folder / "peers").mkdir(parents=True)
    dump_scenario(scenario, folder / "scenario.toml")
    (folder / "peers" / "4.jsonl").write_text(json.dumps({"round": 0, "weights": {"4": 1.0}, "missing": []}) + "\n")
    dest = tmp_path / "out.html"
    done = subprocess.run([sys.executable, "-m", "dfedrw.experiments.cli", "view", str(folder), "--html", str(dest)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 round records" in done.stdout and Path(dest).read_text().count('id="run-data"') == 1


def test_a_finished_run_is_sent_whole_then_ended(tmp_path):
    scenario = load_scenario(None, ["rounds=3"])
    folder = tmp_path / "run"
    (folder / "peers").mkdir(parents=True)
    dump_scenario(scenario, folder / "scenario.toml")
    for r in range(3):
        with (folder / "peers" / "1.jsonl").open("a") as f:
            f.write(json.dumps({"round": r, "weights": {"1": 1.0}, "missing": []}) + "\n")
    (folder / "summary.json").write_text("{}")  # the launcher writes it last
    view = ViewServer(folder).start()
    try:
        status, body, _ = get(view, f"/events?token={view.token}")  # ends by itself: the run ended
        events = [block for block in body.decode().split("\n\n") if block]
        assert events[0].startswith("event: rounds") and [r["round"] for r in json.loads(events[0].split("data: ", 1)[1])] == [0, 1, 2]
        assert events[-1] == "event: end\ndata: {}"
    finally:
        view.stop()
