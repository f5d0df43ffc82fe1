"""The web view's server: the page, its script and style (files of this package), the run's
graph, and its round records as server-sent events, read from the results folder as the run
writes them (:class:`~.records.RunRecords`).

Read-only: it answers ``GET`` only, serves nothing but its own three files and what it reads of
the run, and every request must carry the token it prints in its URL (else 403). It binds
127.0.0.1 unless told another address. Python's standard HTTP server, one thread per request."""

from __future__ import annotations

import hmac
import json
import secrets
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from dfedrw.launch.view.records import RunRecords

# The page's own files, by the name they are asked for: nothing else is read from disk.
STATIC = {"view.js": "text/javascript; charset=utf-8", "view.css": "text/css; charset=utf-8"}
# How often the records are read for new rounds.
POLL_SECONDS = 0.25
# Records per event: a page that connects late gets the history in a few large events.
EVENT_RECORDS = 2000


def static_text(name: str) -> str:
    """One of the page's files, from the installed package."""
    return resources.files("dfedrw.launch.view").joinpath("static", name).read_text(encoding="utf-8")


class ViewServer:
    """Serves the view of the run in ``folder`` (``scenario``: the run's, when the folder has
    none yet) on ``host:port`` (0: a free port), in threads of its own."""

    def __init__(self, folder: Path, *, scenario: Any = None, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        self.records = RunRecords(folder, scenario)
        self.token = token or secrets.token_urlsafe(18)
        self.changed = threading.Condition()
        self.ended = False
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.threads: list[threading.Thread] = []
        self.streams = 0  # event streams open now (pages connected)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/?token={self.token}"

    def start(self) -> ViewServer:
        # A run that had ended: every record read before a page is told so.
        finished = (self.records.folder / "summary.json").is_file()
        self.records.poll()
        self.ended = finished
        for target, name in ((self.httpd.serve_forever, "view-http"), (self._poll, "view-poll")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _poll(self) -> None:
        """Reads the records as they grow, until the run's summary is written (the run ended:
        its launcher writes ``summary.json`` last) or the server stops."""
        while not self.stopping.is_set():
            finished = (self.records.folder / "summary.json").is_file()
            new = self.records.poll()
            with self.changed:
                self.ended = self.ended or finished
                if new or finished:
                    self.changed.notify_all()
            if finished or self.stopping.wait(POLL_SECONDS):
                return

    def end(self, linger: float = 2.0) -> None:
        """The run ended: the last records read, pages told, and once every open page took them
        (at most ``linger`` seconds), the server stopped."""
        self.records.poll()
        deadline = time.monotonic() + linger
        with self.changed:
            self.ended = True
            self.changed.notify_all()
            while self.streams and time.monotonic() < deadline:
                self.changed.wait(max(0.0, deadline - time.monotonic()))
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        with self.changed:
            self.ended = True
            self.changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def allowed(self, query: dict[str, list[str]]) -> bool:
        given = (query.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.token.encode())


def _handler(view: ViewServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "dfedrw-view"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # a page's requests are not the run's news

        def _send(self, status: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, status: HTTPStatus) -> None:
            self._send(status, f"{status.value} {status.phrase}\n".encode())

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            parts = urlsplit(self.path)
            if not view.allowed(parse_qs(parts.query)):
                return self._refuse(HTTPStatus.FORBIDDEN)
            path = parts.path
            if path == "/":
                return self._send(HTTPStatus.OK, page_html(view.token).encode(), "text/html; charset=utf-8")
            if path.startswith("/static/") and path[len("/static/") :] in STATIC:
                name = path[len("/static/") :]
                return self._send(HTTPStatus.OK, static_text(name).encode(), STATIC[name])
            if path == "/meta":
                # ``ended``: the run had ended when the page asked (its records are all there).
                return self._send(HTTPStatus.OK, json.dumps({**view.records.meta, "ended": view.ended}).encode(), "application/json")
            if path == "/events":
                return self._events()
            return self._refuse(HTTPStatus.NOT_FOUND)

        def _refuse_method(self) -> None:
            self._refuse(HTTPStatus.METHOD_NOT_ALLOWED)

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_method  # noqa: N815 - the base class's names

        def _events(self) -> None:
            """The run's records as server-sent events: what was read so far, then each new
            batch as it is read; ``end`` once the run ended and every record went."""
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            sent = 0
            with view.changed:
                view.streams += 1
            try:
                while True:
                    with view.changed:
                        while len(view.records.history) == sent and not view.ended:
                            view.changed.wait(15.0)
                            if len(view.records.history) == sent and not view.ended:
                                self.wfile.write(b": alive\n\n")  # a comment: finds a page that left
                                self.wfile.flush()
                        upto, ended = len(view.records.history), view.ended
                    while sent < upto:
                        batch = view.records.history[sent : min(upto, sent + EVENT_RECORDS)]
                        self.wfile.write(b"event: rounds\ndata: [" + ",".join(batch).encode() + b"]\n\n")
                        sent += len(batch)
                    with view.records.lock:  # the poller adds to it meanwhile
                        finals = json.dumps({str(k): v for k, v in view.records.finals.items()})
                    self.wfile.write(b"event: finals\ndata: " + finals.encode() + b"\n\n")
                    if ended:
                        self.wfile.write(b"event: end\ndata: {}\n\n")
                        self.wfile.flush()
                        return
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return
            finally:
                with view.changed:
                    view.streams -= 1
                    view.changed.notify_all()

    return Handler


def page_html(token: str | None, data: dict[str, Any] | None = None) -> str:
    """The page: served (``token``: the server's, the script asks with it) or, with ``data``
    (the whole run), one self-contained file with the script, the style and the records in it."""
    html = static_text("view.html")
    if data is None:
        head = '<link rel="stylesheet" href="static/view.css?token={t}">'.format(t=token)
        tail = '<script src="static/view.js?token={t}"></script>'.format(t=token)
    else:
        # </ in the JSON could end the script element early: written as <\/.
        payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        head = f"<style>{static_text('view.css')}</style>"
        tail = f'<script id="run-data" type="application/json">{payload}</script>\n<script>{static_text("view.js")}</script>'
    return html.replace("<!--head-->", head).replace("<!--tail-->", tail)
