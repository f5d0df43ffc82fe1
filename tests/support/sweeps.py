"""A small grid, its points, and a stand-in for the sweep's child processes (see the
``fake_run`` fixture in tests/conftest.py): what the sweep tests share."""

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "grids" / "tiny.toml"

FAST = 'set = ["rounds=3", "network.transport=inproc", "topology.honest=4", "topology.byzantine=0", "attack.name=none", "eval.every=0"]\n'


def write_grid(tmp_path, body, name="grid.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


GRID = FAST + """
[axes]
seed = [43, 44]
"data.partition" = ["iid", "dirichlet:0.1"]

[[variants.method]]
label = "DFedAvg"
set = ["aggregation.rule=dfedavg"]

[[variants.method]]
label = "Ours"
set = ["aggregation.rule=dfedreweighting", "aggregation.tpm=accuracy", "aggregation.crs=softmax"]
"""


# A stand-in for `dfedrw run` (one REQUEST FOLDER pair) and for a batch of runs (several
# pairs): records the scenario it was given and a finished summary, or misbehaves as FAKE_MODE
# says. Lets the sweep machinery be tested without training anything.
FAKE_RUN = """
import json, os, sys, time, pathlib
args = sys.argv[1:]
pairs = [(pathlib.Path(args[i]), pathlib.Path(args[i + 1])) for i in range(0, len(args), 2)]
mode = os.environ.get("FAKE_MODE", "")
with open(os.environ["FAKE_CALLS"], "a") as fh:
    fh.write("".join(folder.name + "\\n" for _, folder in pairs))
if mode == "sleep":
    for _, folder in pairs:
        (folder / "pid").write_text(str(os.getpid()))
    time.sleep(60)
for request, folder in pairs:
    text = request.read_text()
    if mode == "fail44" and "seed = 44" in text:
        print("boom: simulated crash")
        sys.exit(3)
    (folder / "scenario.toml").write_text(text)
    if mode == "record":  # a run writes its record with its summary
        (folder / "record.json").write_text(json.dumps({"version": 1, "curves": {"accuracy": [[0, 42.0]]}, "weights": {}}))
    (folder / "summary.json").write_text(json.dumps({"honest_mean_accuracy": 50.0, "accuracy_variance": 1.0}))
"""
