"""A client's checkpoint: what it needs to resume after its process was killed.

One file per client, ``peers/<id>.ckpt.npz`` in the results folder, written every
``checkpoint.every`` rounds: a ``numpy.savez`` archive of arrays, never a pickle (loaded with
``allow_pickle=False``, so a pickled object array is refused). It holds the model vector
(float32), each random generator's state (uint8, ``torch.Generator.get_state()``), the trainer's
epoch permutation (int64), and a uint8 array of JSON with the scalars (client id, round, scenario
fingerprint, counters, and what its rule keeps from round to round, ``Aggregate.memory``).

Written atomically: to ``<name>.tmp``, flushed to disk, then renamed over the old one; a crash
mid-write leaves the previous checkpoint intact and a torn ``.tmp`` that is never read."""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dfedrw.peer.config.scenario import Scenario, scenario_to_dict

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (unreadable, another client's or another scenario's)."""


def checkpoint_path(out_dir: Path, client_id: int) -> Path:
    return Path(out_dir) / "peers" / f"{client_id}.ckpt.npz"


def scenario_fingerprint(scenario: Scenario) -> str:
    """What a checkpoint must match: the settings that shape training, not [network], [checkpoint]
    or [eval] (a client may come back with another address, deadline or evaluation cadence)."""
    table = scenario_to_dict(scenario)
    for name in ("network", "checkpoint", "eval"):
        table.pop(name, None)
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Checkpoint:
    client: int
    round: int  # the last round the client completed
    scenario: str  # scenario_fingerprint
    vector: np.ndarray | None = None  # float32 model vector (None: a Byzantine client holds no model)
    generators: dict[str, np.ndarray] = field(default_factory=dict)  # name -> uint8 generator state
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # other plain arrays (trainer order)
    counters: dict[str, Any] = field(default_factory=dict)  # JSON scalars (trainer position, restarts, ...)


def memory_counters(memory: Mapping[int, float] | None) -> dict[str, Any]:
    """What a checkpoint's counters keep of a rule's ``Aggregate.memory`` (nothing if None)."""
    return {} if memory is None else {"rule_memory": {str(k): float(v) for k, v in memory.items()}}


def memory_of(ckpt: Checkpoint, path: Path) -> dict[int, float] | None:
    """The rule's memory a checkpoint kept (:func:`memory_counters`), checked: integer ids,
    finite values; raises :class:`CheckpointError` otherwise."""
    kept = ckpt.counters.get("rule_memory")
    if kept is None:
        return None
    try:
        memory = {int(k): float(v) for k, v in kept.items()}
    except (AttributeError, TypeError, ValueError):
        memory = None
    if memory is None or not all(math.isfinite(v) for v in memory.values()):
        raise CheckpointError(f"checkpoint {path}: rule_memory is not a map of ids to finite numbers; delete it to start over")
    return memory


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "client": ckpt.client, "round": ckpt.round, "scenario": ckpt.scenario, "counters": ckpt.counters}
    arrays: dict[str, np.ndarray] = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    if ckpt.vector is not None:
        arrays["vector"] = np.asarray(ckpt.vector, dtype=np.float32)
    for name, state in ckpt.generators.items():
        arrays[f"gen_{name}"] = np.asarray(state, dtype=np.uint8)
    for name, value in ckpt.arrays.items():
        arrays[f"arr_{name}"] = np.asarray(value)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, *, client: int, scenario: str, vector_size: int | None) -> Checkpoint:
    """Read and check a checkpoint; raises :class:`CheckpointError` (one line) when it cannot be
    used. ``vector_size`` None: no model expected (a Byzantine client)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            raw = {name: z[name] for name in z.files}
        meta = json.loads(bytes(raw.pop("meta")).decode())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); delete it to start over") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has an unknown format; delete it to start over")
    if meta.get("client") != client:
        raise CheckpointError(f"checkpoint {path} belongs to client {meta.get('client')}, not {client}")
    if meta.get("scenario") != scenario:
        raise CheckpointError(
            f"checkpoint {path} was written under another scenario (fingerprint {meta.get('scenario')}, this one {scenario}); "
            "use the run's own scenario, or another --out"
        )
    vector = raw.pop("vector", None)
    if vector_size is not None:
        if vector is None or vector.dtype != np.float32 or vector.shape != (vector_size,):
            got = None if vector is None else f"{vector.dtype}{list(vector.shape)}"
            raise CheckpointError(f"checkpoint {path}: model vector {got} does not match this model (float32[{vector_size}])")
        if not np.isfinite(vector).all():
            raise CheckpointError(f"checkpoint {path}: model vector is not finite")
    generators = {k[4:]: v for k, v in raw.items() if k.startswith("gen_")}
    if any(v.dtype != np.uint8 or v.ndim != 1 for v in generators.values()):
        raise CheckpointError(f"checkpoint {path}: a generator state is not a uint8 vector")
    arrays = {k[4:]: v for k, v in raw.items() if k.startswith("arr_")}
    rnd = meta.get("round")
    if not isinstance(rnd, int) or rnd < 0:
        raise CheckpointError(f"checkpoint {path}: bad round {rnd!r}")
    return Checkpoint(
        client=client, round=rnd, scenario=scenario, vector=vector, generators=generators, arrays=arrays,
        counters=dict(meta.get("counters") or {}),
    )
