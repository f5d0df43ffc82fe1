"""What a run leaves on disk: each client's round log and final file (:mod:`.records`), the run's
``summary.json`` and ``record.json`` built from them (:mod:`.collect`), and TensorBoard event files
(:mod:`.tensorboard`).

The records' API is importable from here: ``from dfedrw.peer.results import read_rounds``."""

from dfedrw.peer.results.records import (
    CURVE_KEYS, RECORD_FILE, RECORD_VERSION, RecordBuilder, RoundDigest, RoundLog, check_fresh_out_dir, read_final, read_rounds,
    summarize, write_json_atomic,
)

__all__ = [
    "CURVE_KEYS", "RECORD_FILE", "RECORD_VERSION", "RecordBuilder", "RoundDigest", "RoundLog", "check_fresh_out_dir", "read_final",
    "read_rounds", "summarize", "write_json_atomic",
]
