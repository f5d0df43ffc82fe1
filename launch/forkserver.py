"""Client processes forked from one process that has the client code imported.

A fresh interpreter spends about a second and 170 MB of its own memory importing torch,
numpy, networkx, cryptography and the client code before it can run a round. ``dfedrw run``
with ``--start fork`` (the default where ``os.fork`` exists) pays that once: it starts this
module as a fork server, which imports everything a client needs and creates nothing else (no
gRPC channel or server, no torch thread: gRPC supports ``fork`` only before any of its objects
exists), freezes its objects out of the garbage collector's reach (so that collecting in a
child does not write to, and so copy, the pages it shares with the server), and then forks one
child per request. A child starts in well under a tenth of a second, and the pages it has not
written stay shared with the server and every other client.

A sweep starts its batches of runs of the batched engine (``python -m dfedrw.launch.batched_engine``)
the same way, from a server that has the batched engine imported (:data:`ENTRIES`): each batch
is still a process of its own, so a crash ends only that batch.

Requests and replies are JSON lines over the server's stdin and stdout (never pickle):

* ``{"tag": N, "argv": [...], "env": {...}, "log": PATH, "cwd": PATH}`` (and, optionally,
  ``"entry": NAME``, one of :data:`ENTRIES`; ``"peer"`` where it is missing) -> the server
  forks; the child starts a new session, takes exactly ``env`` as its environment, writes
  stdout and stderr to ``log`` and runs the entry's ``main`` on ARGV (``dfedrw peer ARGV``);
  the reply is ``{"tag": N, "pid": PID}`` (or ``{"tag": N, "error": "..."}``);
* when a child ends: ``{"exited": PID, "code": C}`` (C as ``subprocess.Popen.returncode``:
  negative for a signal).

When its stdin closes (the launcher is done, or gone) the server sends SIGTERM to the children
still running, SIGKILL to those left after a grace period, and exits.

The launcher's side is :class:`ForkServer`, whose :meth:`~ForkServer.start` returns a
:class:`ForkedProcess`: the part of ``subprocess.Popen`` the launcher uses (``pid``,
``poll``, ``wait``, ``terminate``, ``kill``, ``returncode``).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import pkgutil
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["ENTRIES", "PRELOAD", "Entry", "START_METHODS", "ForkServer", "ForkedProcess", "client_env", "fork_available", "may_fork_clients", "prestart", "serve", "take_prestarted"]

# How client processes start: forked from this module's server, or each a fresh interpreter.
START_METHODS = ("fork", "spawn")
# What a client process imports; the server imports it once for all of them.
PRELOAD = ("torch", "numpy", "dfedrw.peer.cli", "dfedrw.peer.client.client", "dfedrw.peer.learning.datacache", "dfedrw.peer.transport.grpc.transport")
# What a forked child can run: the module whose ``main(argv)`` it calls, the words put before
# the request's argv, and what a server started for that entry imports first (``P.*``: the
# package P and each of its modules).
class Entry(NamedTuple):
    module: str
    words: tuple[str, ...]
    preload: tuple[str, ...]


ENTRIES: dict[str, Entry] = {
    "peer": Entry("dfedrw.peer.cli", ("peer",), PRELOAD),
    "batched": Entry(
        "dfedrw.launch.batched_engine", (),
        ("torch", "numpy", "statistics", "dfedrw.launch.batched_engine", "dfedrw.engines.together", "dfedrw.engines.run", "dfedrw.launch.preflight", "dfedrw.launch.procs",
         "dfedrw.peer.cli", "dfedrw.peer.config.scenario", "dfedrw.peer.results.records", "dfedrw.peer.learning.datacache", "dfedrw.peer.results.tensorboard",
         "dfedrw.peer.aggregation.*", "dfedrw.peer.attacks.*"),
    ),
}
_GRACE = 5.0


def fork_available() -> bool:
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def client_env() -> dict[str, str]:
    """The environment a launcher gives its client processes (and their fork server)."""
    from dfedrw.peer.cli import without_flag_variables

    # The clients' flags come from the launcher's command lines, not from variables in its
    # environment that stand for them.
    env = {**without_flag_variables(os.environ), "DFEDRW_PARENT_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    # One torch thread per client: many clients share the cores, and one thread keeps a
    # client's arithmetic the same to the bit whatever the machine.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# ------------------------------------------------------------------------------ the server


def _child(request: dict[str, Any], keep: tuple[int, ...]) -> None:
    """In the forked child: become the client process the request describes. Never returns."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        # As in a fresh interpreter.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (log, null, *keep):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        entry = ENTRIES[request.get("entry", "peer")]
        argv = [*entry.words, *request["argv"]]
        sys.argv = ["dfedrw", *argv]
        code = importlib.import_module(entry.module).main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the child reports everything, then exits
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


def _checked(request: Any) -> None:
    ok = (
        isinstance(request, dict)
        and isinstance(request.get("tag"), int)
        and isinstance(request.get("argv"), list) and all(isinstance(a, str) for a in request["argv"])
        and isinstance(request.get("env"), dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in request["env"].items())
        and isinstance(request.get("log"), str) and isinstance(request.get("cwd"), str)
        and isinstance(request.get("entry", "peer"), str) and request.get("entry", "peer") in ENTRIES
    )
    if not ok:
        raise ValueError(f"a request is {{tag: int, argv: [str], env: {{str: str}}, log: str, cwd: str}} and, optionally, entry: one of {', '.join(ENTRIES)}")


def _reply(message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def serve(preload: tuple[str, ...] = PRELOAD) -> int:
    """The fork server's loop (see the module docstring), with the modules ``preload`` imported."""
    for name in preload:
        module = importlib.import_module(name.removesuffix(".*"))
        if name.endswith(".*"):
            for info in pkgutil.iter_modules(module.__path__, f"{module.__name__}."):
                importlib.import_module(info.name)
    gc.collect()
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when clients stop
    children: set[int] = set()

    def reap() -> None:
        for pid in list(children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                children.discard(pid)
                _reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    pending = b""
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        reap()
        if 0 not in ready:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            tag = None
            try:
                request = json.loads(line)
                if isinstance(request, dict) and isinstance(request.get("tag"), int):
                    tag = request["tag"]
                _checked(request)
                pid = os.fork()
            except (ValueError, OSError) as exc:
                _reply({"tag": tag, "error": str(exc)})
                continue
            if pid == 0:
                _child(request, (wake_r, wake_w))
            children.add(pid)
            _reply({"tag": tag, "pid": pid})
    # The launcher is done or gone: no child outlives the server.
    for pid in children:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE
    while children and time.monotonic() < deadline:
        time.sleep(0.05)
        reap()
    for pid in children:
        _signal(pid, signal.SIGKILL)
    return 0


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------------------ the launcher's side


class ForkServer:
    """A running fork server (started at once; it imports while the launcher goes on)."""

    def __init__(self, python: str, env: dict[str, str], *, log: Path | None = None, entry: str = "peer") -> None:
        if entry not in ENTRIES:
            raise ValueError(f"no fork server entry {entry!r}; there are: {', '.join(ENTRIES)}")
        self.python = python
        self.entry = entry  # what it has imported, and what its children run
        self.proc = subprocess.Popen(
            [python, "-m", "dfedrw.launch.forkserver", entry], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, start_new_session=True,
        )
        self.pid = self.proc.pid
        # What the server writes to stderr (a failed import, say): kept until a log file is
        # named, then written there.
        self._log_lock = threading.Lock()
        self._log_lines: list[bytes] = []
        self._log_file = None
        if log is not None:
            self.attach_log(log)
        threading.Thread(target=self._read_stderr, daemon=True, name="fork-server-log").start()
        self._cond = threading.Condition()
        self._started: dict[int, dict[str, Any]] = {}
        self.exits: dict[int, int] = {}
        self._gone = False
        self._tag = 0
        threading.Thread(target=self._read, daemon=True, name="fork-server").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._cond:
                if "exited" in message:
                    self.exits[int(message["exited"])] = int(message["code"])
                elif message.get("tag") is not None:
                    self._started[int(message["tag"])] = message
                self._cond.notify_all()
        with self._cond:
            self._gone = True
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            with self._log_lock:
                self._log_lines.append(line)
                if self._log_file is not None:
                    self._log_file.write(line)
                    self._log_file.flush()

    def attach_log(self, path: Path) -> None:
        """Write what the server has said and will say to ``path``."""
        with self._log_lock:
            self._log_file = open(path, "wb")  # noqa: SIM115 - kept open for the server's life
            self._log_file.writelines(self._log_lines)
            self._log_file.flush()

    def start(self, argv: list[str], env: dict[str, str], log: Path, *, timeout: float = 120.0) -> ForkedProcess:
        """Fork one child running the server's entry on ``argv`` (a client: ``dfedrw peer ARGV``)
        with environment ``env``, output to ``log``."""
        with self._cond:
            self._tag += 1
            tag = self._tag
        what = "client" if self.entry == "peer" else "process"
        request = {"tag": tag, "entry": self.entry, "argv": argv, "env": env, "log": str(log), "cwd": os.getcwd()}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        with self._cond:
            if not self._cond.wait_for(lambda: tag in self._started or self._gone, timeout):
                raise RuntimeError(f"the fork server (pid {self.pid}) did not start a {what} within {timeout:.0f} s")
            reply = self._started.pop(tag, None)
        if reply is None or "pid" not in reply:
            why = reply["error"] if reply else f"it exited ({self._last_words()})"
            raise RuntimeError(f"the fork server could not start a {what}: {why}")
        return ForkedProcess(self, int(reply["pid"]))

    def _last_words(self) -> str:
        with self._log_lock:
            lines = [ln.decode(errors="replace").strip() for ln in self._log_lines if ln.strip()]
        return lines[-1][:300] if lines else "no output"

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            if pid in self.exits:
                return self.exits[pid]
            if not self._gone:
                return None
        # The server is gone, so nobody reports this child: alive, or ended unseen.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return 1
        return None

    def wait_exit(self, pid: int, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: pid in self.exits or self._gone, timeout)

    def close(self, timeout: float = _GRACE + 5.0) -> None:
        """End the server: its stdin closes, it stops what children remain, and exits."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with self._log_lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None


_prestarted: ForkServer | None = None


def prestart(argv: list[str]) -> None:
    """Start the fork server before the launcher's own imports when ``argv`` (the ``dfedrw``
    command line) is a ``run`` that may fork client processes: the two imports then overlap,
    and the launcher finds a server ready (:func:`take_prestarted`). One not taken (the run
    turned out to be batched or in-process) is closed when the launcher exits."""
    global _prestarted
    if fork_available() and _prestarted is None and may_fork_clients(argv):
        _prestarted = ForkServer(sys.executable, client_env())
        atexit.register(_close_prestarted)


def may_fork_clients(argv: list[str]) -> bool:
    """Whether the ``dfedrw`` command line ``argv`` is a ``run`` that may fork client processes:
    not one that asks for ``--start spawn`` or the batched engine (``--engine batched``, a
    ``--set engine.name=batched``, or a scenario file that names it and is not overridden). A
    fork server started for nothing imports torch beside the launcher: a second of CPU."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] != "run":
        return False
    flags = " ".join(argv)
    if any(f in flags for f in ("--start spawn", "--start=spawn")):
        return False
    return _engine_named(argv) != "batched"


def _engine_named(argv: list[str]) -> str | None:
    """The engine a ``run`` command line names: the last ``--engine`` or ``--set
    engine.name=...``, else its scenario file's (read with tomllib), else None."""
    named = None
    for i, arg in enumerate(argv):
        for flag in ("--engine", "--set"):
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1 :]
            else:
                continue
            if flag == "--engine":
                named = value
            elif value.replace(" ", "").startswith("engine.name="):
                named = value.split("=", 1)[1].strip().strip("'\"")
    if named is not None:
        return named
    position = argv.index("run") + 1 if "run" in argv else len(argv)
    if position < len(argv) and argv[position].endswith(".toml") and not argv[position].startswith("-"):
        try:
            import tomllib

            with open(argv[position], "rb") as f:
                engine = tomllib.load(f).get("engine", {})
            return engine.get("name") if isinstance(engine, dict) else None
        except (OSError, ValueError, RecursionError):  # the run itself reports what is wrong with the file
            return None
    return None


def take_prestarted(python: str) -> ForkServer | None:
    """The server :func:`prestart` started, if it runs ``python`` (once)."""
    global _prestarted
    server, _prestarted = _prestarted, None
    if server is not None and (server.python != python or server.proc.poll() is not None):
        server.close()
        return None
    return server


def _close_prestarted() -> None:
    if _prestarted is not None:
        _prestarted.close()


class ForkedProcess:
    """A client forked by a :class:`ForkServer`, seen as the launcher sees a ``Popen``."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"client pid {self.pid}", timeout)
            self.server.wait_exit(self.pid, min(left, 1.0) if left is not None else 1.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            _signal(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _main(argv: list[str]) -> int:
    """``python -m dfedrw.launch.forkserver [ENTRY]``: serve, with ENTRY's modules imported."""
    entry = argv[0] if argv else "peer"
    if len(argv) > 1 or entry not in ENTRIES:
        print(f"usage: python -m dfedrw.launch.forkserver [{'|'.join(ENTRIES)}]", file=sys.stderr)
        return 2
    return serve(ENTRIES[entry].preload)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
