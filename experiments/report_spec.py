"""A grid's ``[report]`` table: the keys it may hold, the defaults it is filled with, and the
checks against the grid's axes (:func:`normalize_report_spec`, run when a sweep is planned and
again when ``dfedrw report`` reads the sweep). What the keys mean: :mod:`experiments.report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dfedrw.experiments.table import METRICS


KINDS = ("fairness", "byzantine", "robustness", "tpm_pairs", "backdoor")
DEFAULT_METRIC = {
    "fairness": "honest_mean_accuracy",
    "byzantine": "honest_mean_global_accuracy",
    "robustness": "honest_mean_global_accuracy",
    "tpm_pairs": "honest_mean_global_accuracy",
    "backdoor": "honest_mean_global_accuracy",
}
SPEC_KEYS = (
    "kind", "metric", "rows", "columns", "row_labels", "column_labels", "axis_labels", "unranked", "paper", "tolerance",
    "reference", "equal_rows",
)
# tpm_pairs: the row values where the claim is that the two pairs do about equally well.
DEFAULT_EQUAL_ROWS = ["iid"]
SEED_AXIS = "seed"


class ReportError(ValueError):
    """A report spec or sweep folder cannot be reported; the message names the problem."""


def _label_table(name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise ReportError(f"report.{name} must be a table of \"value\" = \"pretty name\" strings")
    return {str(k): v for k, v in value.items()}


def normalize_report_spec(
    raw: Mapping[str, Any] | None, axes: Mapping[str, Sequence[str]], *, required: bool = True
) -> dict[str, Any] | None:
    """Check a ``[report]`` table against the grid's axes and fill in its defaults.

    Defaults: kind ``fairness``; the metric of the kind; the last non-seed axis as the
    columns and the other non-seed axes as the rows. Returns None when ``raw`` is None, not
    ``required``, and the grid has no axis to put in the columns.
    """
    spec = dict(raw or {})
    for key in spec:
        if key not in SPEC_KEYS:
            raise ReportError(f"unknown key 'report.{key}'; valid keys: {', '.join(SPEC_KEYS)}")
    kind = spec.get("kind", "fairness")
    if kind not in KINDS:
        raise ReportError(f"report.kind={kind!r} is not valid; choose one of: {', '.join(KINDS)}")
    metric = spec.get("metric", DEFAULT_METRIC[kind])
    if metric not in METRICS:
        raise ReportError(f"report.metric={metric!r} is not valid; choose one of: {', '.join(METRICS)}")
    free = [a for a in axes if a != SEED_AXIS]
    columns = spec.get("columns")
    if columns is None:
        if not free:
            if raw is None and not required:
                return None
            raise ReportError(f"report.columns: the grid has no axis besides '{SEED_AXIS}' to form the columns")
        columns = free[-1]
    if not isinstance(columns, str) or columns not in axes or columns == SEED_AXIS:
        raise ReportError(f"report.columns={columns!r} must name one axis; choose one of: {', '.join(free)}")
    rows = spec.get("rows")
    if rows is None:
        rows = [a for a in free if a != columns]
    if isinstance(rows, str):
        rows = [rows]
    if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
        raise ReportError(f"report.rows={rows!r} must be a list of axis names; choose from: {', '.join(free)}")
    for r in rows:
        if r not in axes or r == SEED_AXIS or r == columns:
            choices = ", ".join(a for a in free if a != columns)
            why = f"it is the columns' axis (report.columns = {columns!r})" if r == columns else "it is not a row axis"
            what = f"choose from: {choices}" if choices else "the grid has no other axis for the rows: leave report.rows out (one row)"
            raise ReportError(f"report.rows: {r!r}: {why}; {what}")
    if len(set(rows)) != len(rows):
        raise ReportError(f"report.rows={rows!r} names an axis twice")
    for a, labels in axes.items():
        if a not in rows and a != columns and a != SEED_AXIS and len(labels) > 1:
            raise ReportError(
                f"axis '{a}' has {len(labels)} values but is neither in report.rows nor report.columns; "
                f"add it to report.rows (only '{SEED_AXIS}' is averaged over)"
            )
    unranked = spec.get("unranked", [])
    if not isinstance(unranked, list) or not all(isinstance(u, str) for u in unranked):
        raise ReportError("report.unranked must be a list of column labels (kind = \"robustness\": defence labels)")
    reference = spec.get("reference")
    if reference is not None:
        if kind == "byzantine":
            where, choices = f"the columns axis '{columns}'", axes[columns]
        elif kind in ("robustness", "backdoor") and rows:
            where, choices = f"the defence axis '{rows[-1]}' (the last of report.rows)", axes[rows[-1]]
        else:
            raise ReportError(
                "report.reference is for kind = \"byzantine\" (the column every method is compared with, e.g. "
                "\"No-AT\") or kind = \"robustness\" or \"backdoor\" (the defence row every worst case is compared with)"
            )
        if not isinstance(reference, str) or reference not in choices:
            raise ReportError(f"report.reference={reference!r} must be a value of {where}: {', '.join(choices)}")
    if kind in ("robustness", "backdoor") and not rows:
        raise ReportError(f"report.rows: kind = \"{kind}\" needs the defence axis as the last row axis")
    equal_rows = spec.get("equal_rows")
    if equal_rows is not None and kind != "tpm_pairs":
        raise ReportError("report.equal_rows is for kind = \"tpm_pairs\"")
    if kind == "tpm_pairs":
        if len(axes[columns]) != 2:
            raise ReportError(
                f"report.columns: kind = \"tpm_pairs\" compares two pairs; the axis '{columns}' has "
                f"{len(axes[columns])} values ({', '.join(axes[columns])})"
            )
        if equal_rows is None:
            equal_rows = list(DEFAULT_EQUAL_ROWS)
        if not isinstance(equal_rows, list) or not all(isinstance(v, str) for v in equal_rows):
            raise ReportError("report.equal_rows must be a list of row values (e.g. [\"iid\"])")
    tolerance = spec.get("tolerance", 3.0)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance > 0:
        raise ReportError(f"report.tolerance={tolerance!r} must be a number > 0 (accuracy points)")
    paper = spec.get("paper", {})
    if paper and kind not in ("fairness", "byzantine"):
        raise ReportError(f"report.paper is for kind = \"fairness\" or \"byzantine\", not {kind!r}")
    if not isinstance(paper, Mapping):
        raise ReportError("report.paper must be a table of \"ROW|COLUMN\" = value")
    clean_paper: dict[str, Any] = {}
    for key, value in paper.items():
        ok_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok_pair = (
            kind == "fairness" and isinstance(value, list) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        )
        if not (ok_number or ok_pair):
            what = "a variance or [variance, accuracy]" if kind == "fairness" else "an accuracy"
            raise ReportError(f"report.paper.{key!r}={value!r} must be {what}")
        clean_paper[str(key)] = [float(v) for v in value] if ok_pair else float(value)
    normalized = {
        "kind": kind,
        "metric": metric,
        "rows": list(rows),
        "columns": columns,
        "row_labels": _label_table("row_labels", spec.get("row_labels")),
        "column_labels": _label_table("column_labels", spec.get("column_labels")),
        "axis_labels": _label_table("axis_labels", spec.get("axis_labels")),
        "unranked": list(unranked),
        "paper": clean_paper,
        "tolerance": float(tolerance),
        "reference": reference,
    }
    if kind == "tpm_pairs":
        # Only where it means something, so that other kinds' recorded specs stay as they were.
        normalized["equal_rows"] = list(equal_rows)
    return normalized
