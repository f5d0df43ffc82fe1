#!/usr/bin/env bash
# Runs the paper's headline Fashion-MNIST IID cells as real client processes and prints them:
#   dfedavg        : DFedAvg, 10 honest, no attack            (paper: 81.6 %)
#   dfedrw_clean   : DFedReweighting loss + loss_clip_mean, 10 honest, no attack
#   dfedrw_gaussian: the same with 2 Byzantine Gaussian clients (paper: 81.3 %)
#   dfedavg_gauss  : DFedAvg with 2 Byzantine Gaussian clients
# Usage: scripts/headline_cells.sh OUT_DIR   (needs dataset-fashion-mnist; ~20 min on 2 cores)
set -euo pipefail
OUT=${1:?usage: headline_cells.sh OUT_DIR}
DFEDRW=${DFEDRW:-.venv/bin/dfedrw}
COMMON=(--set data.name=fashion-mnist --set data.partition=iid --set rounds=3000)
run() {
    local name=$1; shift
    if [ -f "$OUT/$name/summary.json" ]; then echo "$name: done already" >&2; return; fi
    rm -rf "${OUT:?}/$name"
    "$DFEDRW" run "${COMMON[@]}" "$@" --out "$OUT/$name"
}
run dfedavg --set aggregation.rule=dfedavg --set topology.byzantine=0
run dfedrw_clean --set topology.byzantine=0 --set attack.name=none
run dfedrw_gaussian --set attack.name=gaussian
run dfedavg_gauss --set aggregation.rule=dfedavg --set attack.name=gaussian
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print(f"{'run':<18}{'local acc %':>12}{'global acc %':>14}{'var %^2':>10}{'byz share':>11}{'wall s':>9}")
for name in ("dfedavg", "dfedrw_clean", "dfedrw_gaussian", "dfedavg_gauss"):
    s = json.loads((out / name / "summary.json").read_text())
    share = s["byzantine_weight_share"]
    print(f"{name:<18}{s['honest_mean_accuracy']:>12.2f}{s['honest_mean_global_accuracy']:>14.2f}"
          f"{s['accuracy_variance']:>10.2f}{'-' if share is None else f'{share:.4f}':>11}{s['wall_seconds']:>9.0f}")
PY
