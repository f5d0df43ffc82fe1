"""The committed tables under docs/results are what `dfedrw report` makes of the committed data.

The pairs (data folder, output folder) come from the `dfedrw report ... --out ...` lines of
docs/results/README.md, so the commands printed there are checked too. The tables are compared
by default; the plots (slower to draw) in the slow selection.
"""

import re
from pathlib import Path

import pytest

from dfedrw.experiments.report import write_report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
TABLES = ("table.md", "table.csv", "cells.csv", "comparison.md", "worst_case.csv")


def report_commands() -> list[tuple[Path, Path]]:
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    pairs = re.findall(r"^dfedrw report (\S+) --out (\S+)\s*$", text, flags=re.MULTILINE)
    return [(ROOT / data, ROOT / out) for data, out in pairs]


COMMANDS = report_commands()


def test_every_committed_data_folder_has_its_report_command():
    assert COMMANDS, "no `dfedrw report` commands found in docs/results/README.md"
    reported = {data for data, _ in COMMANDS}
    committed = {p for p in (RESULTS / "data").iterdir() if (p / "sweep.json").is_file()}
    assert committed == reported
    for data, out in COMMANDS:
        assert (out / "table.md").is_file(), f"{out} has no table.md"


@pytest.mark.parametrize("data,out", COMMANDS, ids=lambda p: p.name)
def test_report_regenerates_the_committed_tables(data, out, tmp_path):
    write_report([data], tmp_path, plots=False)
    for name in TABLES:
        committed = out / name
        if committed.exists():
            assert (tmp_path / name).read_bytes() == committed.read_bytes(), f"{committed} differs"
        else:
            assert not (tmp_path / name).exists(), f"{committed} is missing"


@pytest.mark.slow
@pytest.mark.parametrize("data,out", COMMANDS, ids=lambda p: p.name)
def test_report_regenerates_the_committed_plots(data, out, tmp_path):
    write_report([data], tmp_path, plots=True)
    made = sorted(p.relative_to(tmp_path) for p in (tmp_path / "plots").rglob("*.png"))
    committed = sorted(p.relative_to(out) for p in (out / "plots").rglob("*.png"))
    assert made == committed
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (out / rel).read_bytes(), f"{out / rel} differs"
