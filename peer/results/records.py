"""What a run leaves on disk, and the summary built from it.

Each client appends one JSON object per round to ``peers/<id>.jsonl`` as it goes (flushed
every line, so a crash loses nothing already done) and writes ``peers/<id>.json`` when it
finishes. The launcher builds ``summary.json`` from these files only, never from telemetry,
and from the same read of them the run's compact ``record.json`` (:class:`RecordBuilder`).

A results folder holds one run: the launchers refuse a folder an earlier run wrote into
(:func:`check_fresh_out_dir`), and a client started again by hand into its own folder moves the
earlier round log aside (``<id>.jsonl.1``, ``.2``, ...) rather than mixing two runs in one file,
unless it resumes from its checkpoint (``peers/<id>.ckpt.npz``): then it continues its own log."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


class RoundLog:
    """One client's round log. ``keep_through``: the client resumes from a checkpoint of that round,
    so records up to that round are kept (rewritten atomically), the ones after it, logged before
    the crash, are dropped (counted in ``dropped``; ``last_logged`` is the highest round logged
    before the crash) and the resumed rounds are appended: one record per round stays the rule.

    ``tensorboard``: a folder for TensorBoard event files (``--tensorboard``); an honest client (one
    not in ``byzantine``, the scenario's Byzantine ids) also writes each record there as scalars,
    see :mod:`dfedrw.peer.results.tensorboard`."""

    def __init__(
        self,
        out_dir: Path,
        client_id: int,
        *,
        keep_through: int | None = None,
        flush_seconds: float = 0.0,
        tensorboard: Path | None = None,
        byzantine: Collection[int] = (),
        digest: bool = False,
    ) -> None:
        # ``digest``: also keep what the summary and record read of this log (``self.digest``), so
        # that a launcher in this process (the batched engine) need not read it back.
        self.digest = RoundDigest(byzantine) if digest else None
        # A record reaches the file at once (a client process may be killed any moment), or,
        # with ``flush_seconds``, at most that long after it was written (the batched engine,
        # which writes every client's record each round and cannot resume anyway).
        self.flush_seconds = flush_seconds
        self._flushed = time.monotonic()
        self._scalars = None
        if tensorboard is not None and client_id not in byzantine:
            from dfedrw.peer.results.tensorboard import ClientScalars

            restart_at = None if keep_through is None else keep_through + 1
            self._scalars = ClientScalars(tensorboard, client_id, byzantine, restart_at=restart_at)
        path = Path(out_dir) / "peers" / f"{client_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.dropped = 0
        self.last_logged = -1
        if keep_through is not None:
            records = read_rounds(out_dir, client_id)
            kept = [r for r in records if isinstance(r.get("round"), int) and r["round"] <= keep_through]
            self.dropped = len(records) - len(kept)
            self.last_logged = max((r["round"] for r in records if isinstance(r.get("round"), int)), default=-1)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
            os.replace(tmp, path)
            self._file = path.open("a", encoding="utf-8")
            return
        if path.exists() and path.stat().st_size > 0:
            n = 1
            while path.with_name(f"{path.name}.{n}").exists():
                n += 1
            kept = path.with_name(f"{path.name}.{n}")
            os.replace(path, kept)
            log.warning("client %d: %s holds an earlier run's rounds; moved to %s", client_id, path, kept.name)
        # A new file; an empty one (left by a run killed before its first round) holds nothing to keep.
        self._file = path.open("w" if path.exists() and path.stat().st_size == 0 else "x", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        if self.digest is not None:
            self.digest.add(record)
        if self._scalars is not None:
            self._scalars.write(record)
        if self.flush_seconds <= 0 or time.monotonic() - self._flushed >= self.flush_seconds:
            self._file.flush()
            if self._scalars is not None:
                self._scalars.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        self._file.close()
        if self._scalars is not None:
            self._scalars.close()


def check_fresh_out_dir(out_dir: Path, client_ids: Iterable[int]) -> None:
    """Raise FileExistsError when ``out_dir`` already holds a run's results: a summary (finished
    or interrupted) or a round log of one of ``client_ids`` (a run that was killed before its
    summary). Results of two runs in one folder would be mixed up."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is not a folder")
    summary = out / "summary.json"
    if summary.exists():
        try:
            interrupted = bool(json.loads(summary.read_text(encoding="utf-8")).get("interrupted"))
        except (OSError, ValueError, AttributeError):
            interrupted = False
        what = "an interrupted run" if interrupted else "a finished run"
        raise FileExistsError(f"{out} already holds {what}; choose another --out (or delete the folder to redo it)")
    logs = [out / "peers" / f"{k}.jsonl" for k in client_ids]
    found = [p.name for p in logs if p.exists() and p.stat().st_size > 0]
    if found:
        raise FileExistsError(
            f"{out} holds round logs of an earlier run that did not finish ({', '.join(found[:3])}"
            f"{', ...' if len(found) > 3 else ''}); choose another --out (or delete the folder to redo it)"
        )


def write_json_atomic(path: Path, obj: Any, *, indent: int | None = 2) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    text = json.dumps(obj, indent=indent) if indent is not None else json.dumps(obj, separators=(",", ":"))
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_rounds(out_dir: Path, client_id: int) -> list[dict[str, Any]]:
    """The per-round records of one client; a torn last line (crash mid-write) is skipped."""
    path = Path(out_dir) / "peers" / f"{client_id}.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):  # a line that is not a record (only a client's own folder holds it) is not one
            records.append(record)
    return records


def read_final(out_dir: Path, client_id: int) -> dict[str, Any] | None:
    """A client's final record, or None when it has none, or none that can be read: a file that is
    not a JSON object is reported and read as no record (a client that did not finish), never
    trusted: under compose each client writes its own folder, a Byzantine one included."""
    path = Path(out_dir) / "peers" / f"{client_id}.json"
    if not path.exists():
        return None
    try:
        final = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        log.warning("%s: not a client's final record (%s); read as none", path, exc)
        return None
    if not isinstance(final, dict):
        log.warning("%s: not a client's final record (a JSON %s); read as none", path, type(final).__name__)
        return None
    return final


RECORD_FILE = "record.json"
RECORD_VERSION = 1
# What a client measures on its evaluation rounds.
VALUE_CURVES = ("accuracy", "global_accuracy", "attack_success")
# What a run's clock and wire say at each evaluation round (a round with an accuracy): the
# seconds since the client's round loop began (wall time in the client engine, simulated time
# in a batched engine that keeps a clock), and the bytes it has sent up to and with that round.
# Only for records that give ``seconds``: accuracy against time and against bytes.
TIME_CURVES = ("seconds", "bytes_sent")
CURVE_KEYS = (*VALUE_CURVES, *TIME_CURVES)
# Curves a run has only under some attacks (a backdoor's success rate) or with a clock: in a
# record only when measured, so that the records of runs without them stay the same bytes.
OPTIONAL_CURVES = frozenset({"attack_success", *TIME_CURVES})


class RoundDigest:
    """What :func:`summarize` and :class:`RecordBuilder` read of one client's round records (the
    attributes below; ``byzantine``: the Byzantine senders' ids), fed one record at a time in round
    order (:meth:`add`). Built from a log read back (:meth:`of`) or as a :class:`RoundLog` writes
    it: the same values either way (a record's floats come back from JSON unchanged), so the summary
    and record are the same bytes."""

    def __init__(self, byzantine: Collection[int] = ()) -> None:
        self.byzantine = frozenset(byzantine)
        self.rounds = 0
        self.byzantine_shares: list[float] = []  # per record, when there are Byzantine ids
        self.trailing_alone = 0  # how many of the last records in a row weighed at most one sender
        self.alone = 0  # how many records weighed at most one sender (its own model only)
        self.curves: dict[str, list[tuple[int, float]]] = {key: [] for key in CURVE_KEYS}
        self.weight_sums: dict[int, float] = {}  # sender -> its weights summed over the records
        self.bytes_sent = 0  # over the records, in round order
        self.seconds: float | None = None  # the last record's, when the records give it
        self._ids: dict[str, int] = {}  # a record's sender key -> the sender's id

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]], byzantine: Collection[int] = ()) -> "RoundDigest":
        digest = cls(byzantine)
        for record in records:
            digest.add(record)
        return digest

    def add(self, rec: dict[str, Any]) -> None:
        self.rounds += 1
        round_ = rec.get("round")
        sent = rec.get("bytes_sent")
        if isinstance(sent, int):
            self.bytes_sent += sent
        seconds = rec.get("seconds")
        if isinstance(seconds, (int, float)):
            self.seconds = float(seconds)
        if isinstance(round_, int):
            for key in VALUE_CURVES:
                value = rec.get(key)
                if value is not None:
                    self.curves[key].append((round_, float(value)))
            if self.seconds is not None and rec.get("accuracy") is not None:
                self.curves["seconds"].append((round_, self.seconds))
                self.curves["bytes_sent"].append((round_, float(self.bytes_sent)))
        w = rec.get("weights") or {}
        self.trailing_alone = self.trailing_alone + 1 if len(w) <= 1 else 0
        self.alone += len(w) <= 1
        sums, ids, byzantine = self.weight_sums, self._ids, self.byzantine
        share = 0  # as sum() adds them: from int 0, in the record's order
        for s, v in w.items():
            sender = ids.get(s)
            if sender is None:
                sender = ids[s] = int(s)
            sums[sender] = sums.get(sender, 0.0) + float(v)
            if sender in byzantine:
                share = share + v
        if byzantine:
            self.byzantine_shares.append(share)

    def isolated(self) -> bool:
        """True when, over the last tenth of its rounds, the client aggregated its own model only."""
        return self.rounds > 0 and self.trailing_alone >= max(1, self.rounds // 10)


class RecordBuilder:
    """A run's compact record (``record.json``): the honest mean of each curve in ``CURVE_KEYS``
    at each round that has it, and the mean weight each honest client (``receivers``) gave each
    client (``senders``) over its rounds, ``None`` where it never weighed that sender::

        {"version": 1,
         "curves": {"accuracy": [[round, mean], ...], "global_accuracy": [[round, mean], ...],
                    "attack_success": [[round, mean], ...]},   # (only under a backdoor attack)
         "weights": {"receivers": [ids], "senders": [ids], "matrix": [[weight or null, ...], ...]}}

    Fed one receiver's round records at a time (:meth:`add`), in the receivers' order, so that a
    caller reading each client's log once (:func:`summarize`) builds it from that read."""

    def __init__(self, receivers: Iterable[int], senders: Iterable[int]) -> None:
        self.receivers = sorted(receivers)
        self.senders = sorted(senders)
        self._col = {s: j for j, s in enumerate(self.senders)}
        self._per_round: dict[str, dict[int, list[float]]] = {key: {} for key in CURVE_KEYS}
        self._matrix = np.full((len(self.receivers), len(self.senders)), np.nan)
        self._row = {r: i for i, r in enumerate(self.receivers)}
        self._last: int | None = None  # the receiver added last

    def add(self, receiver: int, records: "Iterable[dict[str, Any]] | RoundDigest") -> None:
        """One receiver's records, or their :class:`RoundDigest`, receivers in ascending order."""
        i = self._row[receiver]
        if self._last is not None and receiver <= self._last:
            raise ValueError(f"RecordBuilder.add: receiver {receiver} out of order (each once, in ascending order)")
        self._last = receiver
        digest = records if isinstance(records, RoundDigest) else RoundDigest.of(records)
        for key in CURVE_KEYS:
            for round_, value in digest.curves[key]:
                self._per_round[key].setdefault(round_, []).append(value)
        if digest.rounds:
            for sender, total in digest.weight_sums.items():
                j = self._col.get(sender)
                if j is not None:
                    self._matrix[i, j] = total / digest.rounds

    def result(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "curves": {
                key: [[r, float(np.mean(v))] for r, v in sorted(self._per_round[key].items())]
                for key in CURVE_KEYS
                if key not in OPTIONAL_CURVES or self._per_round[key]
            },
            "weights": {
                "receivers": list(self.receivers),
                "senders": list(self.senders),
                # Python floats a row at a time, NaN found as x != x: what np.isnan per entry gave,
                # in a tenth of the time (70 s for the 10^8 entries of 10,000 clients).
                "matrix": [[None if x != x else x for x in row.tolist()] for row in self._matrix],
            },
        }


def summarize(
    out_dir: Path,
    *,
    roles: dict[int, str],
    pids: dict[int, int | None],
    exit_codes: dict[int, int | None],
    rounds: int,
    wall_seconds: float,
    record: RecordBuilder | None = None,
    digests: Mapping[int, RoundDigest] | None = None,
) -> dict[str, Any]:
    """Build the run summary from the clients' files; ``record``, when given, is fed each honest
    client's round records from the same read. ``digests``: each client's :class:`RoundDigest` as
    its :class:`RoundLog` kept it in this process, read instead of the logs."""
    byzantine = {k for k, r in roles.items() if r == "byzantine"}
    peers: dict[str, Any] = {}
    failed: list[int] = []
    isolated: list[int] = []
    alone: dict[int, float] = {}  # honest clients alone in more than ALONE_SHARE of their rounds: the share
    shut_out: dict[int, dict[int, int]] = {}  # honest receiver -> honest senders it shut out: times
    restarted: list[int] = []
    accs: list[float] = []
    gaccs: list[float] = []
    shares: list[float] = []
    successes: list[float] = []  # under a backdoor attack: each honest client's final success rate
    seconds: list[float] = []  # with a clock: each honest client's seconds at its last round
    sent: list[float] = []  # each honest client's bytes sent over the run
    success_by_round: dict[int, list[float]] = {}
    for k in sorted(roles):
        final = read_final(out_dir, k)
        ok = final is not None and final.get("completed") and exit_codes.get(k) in (0, None)
        if not ok:
            failed.append(k)
        if digests is None:
            digest = RoundDigest.of(read_rounds(out_dir, k), byzantine)
        else:
            digest = digests[k]
            if digest.byzantine != byzantine:
                raise ValueError(f"client {k}'s round digest counts Byzantine weight for {sorted(digest.byzantine)}, the run's Byzantine clients are {sorted(byzantine)}")
        if record is not None and roles[k] == "honest":
            record.add(k, digest)
        entry: dict[str, Any] = {
            "role": roles[k],
            "pid": pids.get(k),
            "exit_code": exit_codes.get(k),
            "completed": bool(ok),
            "rounds_done": digest.rounds,
            "accuracy": None,
            "global_accuracy": None,
            "rejected_messages": None,
            "stale_messages": None,
            # Restarts from its checkpoint, and rounds they cost (skipped to catch up, or redone).
            "restarts": 0,
            "rounds_lost": 0,
        }
        if roles[k] == "honest":
            # Rounds it learnt alone (its own model only), whatever its final accuracy says.
            entry["rounds_alone"] = digest.alone
            if digest.rounds and digest.alone > ALONE_SHARE * digest.rounds:
                entry.setdefault("notes", []).append(f"alone {100 * digest.alone / digest.rounds:.0f}% of rounds")
                alone[k] = round(digest.alone / digest.rounds, 4)
        if final is not None and final.get("shut_out") and roles[k] == "honest":
            honest_out = {int(s): n for s, n in final["shut_out"].items() if roles.get(int(s)) == "honest"}
            if honest_out:
                # An honest sender shut out by an honest receiver: the rate bound misjudged it.
                shut_out[k] = honest_out
                entry.setdefault("notes", []).append(f"shut out honest {', '.join(map(str, sorted(honest_out)))}")
        if final is not None:
            for key in ("accuracy", "global_accuracy", "rejected_messages", "rejected_by_reason", "stale_messages"):
                entry[key] = final.get(key)
            if final.get("attack_success") is not None:
                entry["attack_success"] = final["attack_success"]
            entry["restarts"] = int(final.get("restarts") or 0)
            entry["rounds_lost"] = int(final.get("rounds_lost") or 0)
            if final.get("held_back"):
                # Rounds it began late, waiting for neighbours too far behind (the lead bound).
                entry["held_back"] = final["held_back"]
        if entry["restarts"]:
            restarted.append(k)
        if roles[k] == "honest" and digest.isolated():
            # Completed, but alone at the end (its host cut off, say): trained on its own data only.
            isolated.append(k)
        peers[str(k)] = entry
        if roles[k] == "honest" and ok:
            accs.append(final["accuracy"])
            gaccs.append(final["global_accuracy"])
            if digest.seconds is not None:
                seconds.append(digest.seconds)
                sent.append(float(digest.bytes_sent))
            if final.get("attack_success") is not None:
                successes.append(final["attack_success"])
                for round_, value in digest.curves["attack_success"]:
                    success_by_round.setdefault(round_, []).append(value)
        if roles[k] == "honest" and byzantine:
            shares.extend(digest.byzantine_shares)

    def stat(fn, xs):
        return float(fn(np.asarray(xs))) if xs else None

    return {
        "honest_mean_accuracy": stat(np.mean, accs),
        "accuracy_variance": stat(np.var, accs),
        "honest_mean_global_accuracy": stat(np.mean, gaccs),
        "global_accuracy_variance": stat(np.var, gaccs),
        "worst_accuracy": stat(np.min, accs),
        "rounds": rounds,
        "wall_seconds": round(wall_seconds, 3),
        "byzantine_weight_share": (float(np.mean(shares)) if shares else 0.0) if byzantine else None,
        "failed_peers": failed,
        "isolated_peers": isolated,
        # What the network did to honest clients, unseen in a final accuracy: none in a healthy run.
        "alone_peers": {str(k): v for k, v in alone.items()},
        "honest_senders_shut_out": {str(k): {str(s): n for s, n in v.items()} for k, v in shut_out.items()},
        "warnings": network_warnings(alone, shut_out),
        "restarted_peers": restarted,
        "honest_completed": len(accs),
        **({"attack_success": success_summary(successes, success_by_round)} if successes else {}),
        # With a clock: the mean honest client's cost (record.json's curves: accuracy against both).
        **({"honest_mean_seconds": stat(np.mean, seconds), "honest_mean_bytes_sent": stat(np.mean, sent)} if seconds else {}),
        "peers": peers,
    }


# A client that aggregated its own model only in more than this share of its rounds is named in
# a run's summary: in a healthy network an honest client hears from a neighbour every round.
ALONE_SHARE = 0.01


def network_warnings(alone: Mapping[int, float], shut_out: Mapping[int, Mapping[int, int]]) -> list[str]:
    """One line per thing the network did to honest clients that a run must report instead of "ok":
    honest clients alone in a share of their rounds, honest senders shut out past a rate bound."""
    lines = []
    if alone:
        who = ", ".join(f"{k} ({100 * v:.0f}%)" for k, v in sorted(alone.items()))
        lines.append(f"honest clients aggregated their own model only in more than {100 * ALONE_SHARE:g}% of their rounds: {who}")
    if shut_out:
        pairs = ", ".join(f"{s} by {k}" for k, v in sorted(shut_out.items()) for s in sorted(v))
        lines.append(f"honest senders were shut out for sending past their rate bound: {pairs}")
    return lines


def success_summary(finals: list[float], by_round: Mapping[int, list[float]]) -> dict[str, Any]:
    """A backdoor's success over the honest clients (percent): the mean and the worst (highest)
    of their final rates, and the honest mean's peak over the evaluated rounds with its round;
    after the attack window, final against peak is how long the backdoor lasted."""
    means = {r: float(np.mean(v)) for r, v in sorted(by_round.items())}
    peak = max(means, key=lambda r: (means[r], -r)) if means else None
    return {
        "mean": float(np.mean(finals)),
        "worst": float(np.max(finals)),
        "peak_mean": means[peak] if peak is not None else None,
        "peak_round": peak,
    }
