#!/usr/bin/env bash
# Every CUDA path of the project in one run on a GPU machine: the CUDA tests that skip on a CPU,
# then the figures of docs/gpu.md, each step under a time limit, everything into one folder.
#
#   OUT=DIR bash scripts/gpu_check.sh                      on a GPU (about 7 minutes)
#   OUT=DIR DRY_RUN=1 bash scripts/gpu_check.sh            every step on the CPU at tiny sizes (a test of this script)
#   OUT=DIR DEVICE=cpu BUDGET=0 bash scripts/gpu_check.sh  the figures' commands on the CPU at full size, no time limit
#
# OUT: the folder the results go to (made if missing): gpu_check.log (every step's output),
# tests.log (the CUDA tests, pytest -rA), env.json (the machine, torch, CUDA and the package
# versions used), figures.json (every figure) and figures.md (the tables, each GPU figure
# beside the CPU's of bench/results/gpu_check_cpu.json).
#
# Nothing need be downloaded. torch: the build the project pins (scripts/setup.sh) from
# PyTorch's CUDA index when that index answers within a few seconds, else the CUDA build
# already installed (its version goes into env.json). The project's other packages: those
# already installed where their versions fit the pins, else wheels from .whl/ (made by
# scripts/gpu_carry.sh and carried beside the checkout), installed into a folder on
# PYTHONPATH. The project imports as `dfedrw` through a link to this checkout in that folder.
# The image data sets are synthetic (bench/synthetic_idx.py); the client-process runs use
# scikit-learn's digits. A step that needs a package that is missing is skipped, saying which.
#
# Settings: DEVICE (cuda; cpu), BUDGET (seconds for all steps, default 460; 0: no limit), SKIP
# (step names to leave out, space-separated),
# PYTHON (default: .venv/bin/python when there is one, else python3), WORK (default
# /tmp/gpu-check, emptied first), TORCH_INDEX_URL (default PyTorch's cu130 index).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

: "${OUT:?set OUT to the folder the results go to}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DRY_RUN="${DRY_RUN:-0}"
if [ "$DRY_RUN" = 1 ]; then DEVICE="${DEVICE:-cpu}"; BUDGET="${BUDGET:-600}"; fi
DEVICE="${DEVICE:-cuda}"
BUDGET="${BUDGET:-460}"
WORK="${WORK:-/tmp/gpu-check}"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
TORCH_PIN="$(sed -n 's/^TORCH="torch==\(.*\)"$/\1/p' scripts/setup.sh)"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu130}"

rm -rf "$WORK"
mkdir -p "$WORK/fig" "$WORK/site" "$WORK/runs"
LOG="$OUT/gpu_check.log"
: >"$LOG"
: >"$OUT/tests.log"
STARTED=$(date +%s)
STEPS="$WORK/steps.tsv"
: >"$STEPS"

say() { echo "[gpu_check $(($(date +%s) - STARTED))s] $*" | tee -a "$LOG" >&2; }

# -- the environment ----------------------------------------------------------------------
SITE="$WORK/site"
# The project as `dfedrw`: a link to the checkout (pyproject maps the package dir "." to it).
ln -sfn "$REPO" "$SITE/dfedrw"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export DFEDRW_CACHE_DIR="$WORK/cache" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
TORCH_NOTE="installed"
if [ "$DEVICE" = cuda ] && [ "$DRY_RUN" != 1 ]; then
    have="$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
    if [ "${have%%+*}" != "$TORCH_PIN" ]; then
        if timeout 8 "$PYTHON" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=5)" "$TORCH_INDEX_URL/torch/" >/dev/null 2>&1; then
            say "torch $have is not the pinned $TORCH_PIN and $TORCH_INDEX_URL answers: installing it into $WORK/torch"
            if timeout 240 "$PYTHON" -m pip install -q --target "$WORK/torch" "torch==$TORCH_PIN" --index-url "$TORCH_INDEX_URL" >>"$LOG" 2>&1; then
                export PYTHONPATH="$WORK/torch:$PYTHONPATH"
                TORCH_NOTE="torch==$TORCH_PIN from $TORCH_INDEX_URL"
            else
                TORCH_NOTE="the install of torch==$TORCH_PIN from $TORCH_INDEX_URL failed: the installed build used"
            fi
        else
            TORCH_NOTE="$TORCH_INDEX_URL cannot be reached: the installed build used (the project pins $TORCH_PIN)"
        fi
    fi
fi
say "torch: $TORCH_NOTE"

# The wheels carried in .whl/, each only where the installed package is missing or its
# version does not fit the project's pins (a second copy of torch's own dependencies is
# never wanted).
WHEEL_NOTE="none carried"
if compgen -G ".whl/*.whl" >/dev/null; then
    mapfile -t needed < <("$PYTHON" - .whl <<'EOF'
import sys
from importlib import metadata
from pathlib import Path

# The pins of pyproject.toml that a wheel may have to stand in for (name: test of the version).
def fits(name, version):
    parts = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
    return {
        "grpcio": parts >= (1, 85, 1), "protobuf": (7, 35, 1) <= parts < (8,), "pyzmq": parts >= (25,),
        "cryptography": parts >= (42,), "tomli_w": parts >= (1, 0), "cffi": True, "pycparser": True,
    }.get(name, True)

for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    name = wheel.name.split("-")[0].lower()
    dist = {"tomli_w": "tomli-w"}.get(name, name)
    try:
        installed = metadata.version(dist)
    except metadata.PackageNotFoundError:
        installed = None
    if installed is None or not fits(name, installed):
        print(wheel)
EOF
)
    if [ ${#needed[@]} -gt 0 ]; then
        if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/wheels" "${needed[@]}" >>"$LOG" 2>&1; then
            export PYTHONPATH="$WORK/wheels:$PYTHONPATH"
            WHEEL_NOTE="installed from .whl: $(for w in "${needed[@]}"; do basename "$w"; done | tr '\n' ' ')"
        else
            WHEEL_NOTE="pip could not install the carried wheels (see gpu_check.log)"
        fi
    else
        WHEEL_NOTE="carried, none needed"
    fi
fi
say "wheels: $WHEEL_NOTE"

# The generated stubs refuse a protobuf runtime older than their gencode (7.35.1) and a grpcio
# older than the one that generated them (1.85.1). Where the machine's are older and no wheel
# of them came, the check goes on with them (env.json says so): protobuf's own switch for its
# check, and the client code from a copy whose gRPC stub skips grpc's.
STUBS_NOTE="as generated"
if ! "$PYTHON" -c 'import dfedrw.peer.transport.pb.peer_pb2' >/dev/null 2>&1 && "$PYTHON" -c 'import google.protobuf' >/dev/null 2>&1; then
    export TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK=true
    STUBS_NOTE="protobuf $("$PYTHON" -c 'import google.protobuf as p; print(p.__version__)') is older than the gencode's 7.35.1: its version check off"
fi
if ! "$PYTHON" -c 'import dfedrw.peer.transport.pb.peer_pb2_grpc' >/dev/null 2>&1 && "$PYTHON" -c 'import grpc' >/dev/null 2>&1; then
    overlay="$WORK/overlay/dfedrw"
    mkdir -p "$overlay"
    for item in "$REPO"/*; do
        [ "$(basename "$item")" = peer ] || ln -s "$item" "$overlay/"
    done
    cp -r "$REPO/peer" "$overlay/peer"
    sed -i 's/^if _version_not_supported:$/if False:  # gpu_check.sh: the machine'"'"'s grpcio is older than the generator'"'"'s/' "$overlay/peer/transport/pb/peer_pb2_grpc.py"
    ln -sfn "$overlay" "$SITE/dfedrw"
    STUBS_NOTE="$STUBS_NOTE; grpcio $("$PYTHON" -c 'import grpc; print(grpc.__version__)') is older than the stubs' 1.85.1: their check skipped in a copy of peer/"
fi
say "generated stubs: $STUBS_NOTE"

# What can run: the batched engine needs torch, numpy, networkx, scikit-learn, rich, tomli-w and
# protobuf; the client processes also grpcio, pyzmq and cryptography (and the generated stubs'
# grpcio and protobuf versions).
"$PYTHON" - "$WORK/env.json" "$DEVICE" "$TORCH_NOTE" "$WHEEL_NOTE" "$TORCH_PIN" "$STUBS_NOTE" <<'EOF' 2>>"$LOG"
import json, os, platform, subprocess, sys, time
from importlib import metadata

out, device, torch_note, wheel_note, pin, stubs = sys.argv[1:7]
env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(), "python": sys.version.split()[0], "python_path": sys.executable,
       "cpus": os.cpu_count(), "device": device, "torch_source": torch_note, "wheels": wheel_note, "torch_pinned": pin, "generated_stubs": stubs}
try:
    import torch
    env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        env.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(), cudnn=torch.backends.cudnn.version(),
                   gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
except Exception as exc:  # noqa: BLE001 - recorded, not raised
    env["torch_error"] = f"{type(exc).__name__}: {exc}"
try:
    env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20).stdout.strip()
except (OSError, subprocess.SubprocessError):
    env["driver"] = None
versions = {}
for dist in ("numpy", "networkx", "scikit-learn", "rich", "tomli-w", "protobuf", "grpcio", "pyzmq", "cryptography", "matplotlib", "pytest", "hypothesis"):
    try:
        versions[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        versions[dist] = None
env["packages"] = versions

def imports(*modules):
    failed = []
    for m in modules:
        try:
            __import__(m)
        except Exception as exc:  # noqa: BLE001 - which module, and why
            failed.append(f"{m}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return failed

env["missing_batched"] = imports("torch", "numpy", "networkx", "sklearn", "rich", "tomli_w", "dfedrw.engines.together", "dfedrw.launch.batched_engine")
env["missing_clients"] = imports("grpc", "zmq", "cryptography", "dfedrw.peer.transport.pb.peer_pb2_grpc", "dfedrw.launch.runner", "dfedrw.launch.torchrun")
env["missing_tests"] = imports("pytest", "hypothesis", "pytest_timeout")
json.dump(env, open(out, "w"), indent=1)
print(json.dumps(env, indent=1))
EOF
cat "$WORK/env.json" >>"$LOG" 2>/dev/null
ready() {  # ready batched|clients|tests: whether env.json found nothing of that kind missing
    "$PYTHON" -c "import json, sys; sys.exit(0 if not json.load(open(sys.argv[1])).get('missing_' + sys.argv[2], ['env.json unreadable']) else 1)" "$WORK/env.json" "$1" 2>/dev/null
}
missing() {
    "$PYTHON" -c "import json, sys; print('; '.join(json.load(open(sys.argv[1])).get('missing_' + sys.argv[2], ['env.json unreadable'])))" "$WORK/env.json" "$1" 2>/dev/null
}
if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    say "DEVICE=cuda but torch sees no CUDA device: nothing to check (DRY_RUN=1 or DEVICE=cpu run on the CPU)"
fi

# -- the data -----------------------------------------------------------------------------
# Fashion-MNIST's shapes and counts (what a round costs does not depend on the pixels); the
# scale runs' copy has a test set of 1,000 (the one evaluation a run ends with is the same for
# 1,000 and 10,000 clients at 10,000 test images x 10,000 models).
if [ "$DRY_RUN" = 1 ]; then TRAIN=3000; TEST=300; SCALE_TEST=300; else TRAIN=60000; TEST=10000; SCALE_TEST=1000; fi
DATA="$WORK/data/images"
SCALE_DATA="$WORK/data/images-scale"
"$PYTHON" bench/synthetic_idx.py "$DATA" --train "$TRAIN" --test "$TEST" >"$WORK/data-images.sha256" 2>>"$LOG"
"$PYTHON" bench/synthetic_idx.py "$SCALE_DATA" --train "$TRAIN" --test "$SCALE_TEST" >"$WORK/data-scale.sha256" 2>>"$LOG"
say "synthetic images: $TRAIN + $TEST in $DATA, $TRAIN + $SCALE_TEST in $SCALE_DATA"
# Their digests in env.json: the CPU's figures were measured on the same bytes when they match.
"$PYTHON" - "$WORK/env.json" "$WORK/data-images.sha256" "$WORK/data-scale.sha256" <<'EOF' 2>>"$LOG"
import json, sys
env = json.load(open(sys.argv[1]))
env["synthetic_data_sha256"] = {f"{tag}/{name}": digest for tag, path in (("images", sys.argv[2]), ("scale", sys.argv[3]))
                                for digest, name in (line.split() for line in open(path) if line.strip())}
json.dump(env, open(sys.argv[1], "w"), indent=1)
EOF

# -- the steps ------------------------------------------------------------------------------
# step NAME CAP NEEDS CMD...: run CMD under min(CAP, what is left of BUDGET) seconds (CAP and
# the budget ignored with BUDGET=0), unless NEEDS (batched, clients, tests) is missing or too
# little time is left; @TLEFT@ in CMD becomes the seconds it may take less ten (for a command
# that bounds its own parts and reports what it finished), STEP_LOG where its output goes
# (default gpu_check.log). Each step's result is a line of steps.tsv.
RESERVE=20  # seconds kept for the report
step() {
    local name="$1" cap="$2" needs="$3"
    shift 3
    local limit=0 status start rc log="${STEP_LOG:-$LOG}"
    if [[ " ${SKIP:-} " == *" $name "* ]]; then
        say "$name: skipped: named in SKIP"
        printf '%s\tskipped: SKIP\t0\n' "$name" >>"$STEPS"
        return
    fi
    for need in $needs; do
        if ! ready "$need"; then
            say "$name: skipped: missing ($need): $(missing "$need")"
            printf '%s\tskipped: missing %s\t0\n' "$name" "$need" >>"$STEPS"
            return
        fi
    done
    if [ "$BUDGET" != 0 ]; then
        local left=$((BUDGET - ($(date +%s) - STARTED) - RESERVE))
        if [ "$left" -lt 30 ]; then
            say "$name: skipped: ${left}s left of the ${BUDGET}s budget"
            printf '%s\tskipped: out of time\t0\n' "$name" >>"$STEPS"
            return
        fi
        limit=$((cap < left ? cap : left))
    fi
    local own=$((limit > 0 ? limit - 10 : 86400))
    local cmd=("${@//@TLEFT@/$own}")
    say "$name: start (limit ${limit}s; 0 = none): ${cmd[*]}"
    echo "== $name: ${cmd[*]}" >>"$log"
    start=$(date +%s)
    if [ "$limit" = 0 ]; then
        "${cmd[@]}" >>"$log" 2>&1
    else
        timeout -k 10 "$limit" "${cmd[@]}" >>"$log" 2>&1
    fi
    rc=$?
    case "$rc" in
        0) status=ok ;;
        124|137) if [ "$limit" = 0 ]; then status="killed (exit $rc; out of memory?)"; else status="timed out after ${limit}s"; fi ;;
        *) status="failed (exit $rc)" ;;
    esac
    [ "$log" != "$LOG" ] && tail -n 1 "$log" >>"$LOG"
    say "$name: $status in $(($(date +%s) - start))s"
    printf '%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - start))" >>"$STEPS"
}

if [ "$DRY_RUN" = 1 ]; then
    LENET_ROUNDS=2; RESNET_ROUNDS=1; SCALE_ROUNDS=2; BIG_CLIENTS=200; BIG_ROUNDS=1; MID_CLIENTS=50; CLIENT_SET=(--set rounds=2 --set eval.every=0)
    RESNET_SET=(--no-warmup --layouts loop,auto)
else
    LENET_ROUNDS=12; RESNET_ROUNDS=2; SCALE_ROUNDS=20; BIG_CLIENTS=10000; BIG_ROUNDS=3; MID_CLIENTS=1000; CLIENT_SET=(); RESNET_SET=()
fi
CNN=("$PYTHON" bench/cnn_round.py --device "$DEVICE" --layouts loop,vmap,auto --set "data.dir=$DATA")
SCALE=("$PYTHON" bench/engines.py --scale --scale-degree 10 --scale-data fashion-mnist --set "data.dir=$SCALE_DATA" --set train.batch_size=6
       --set eval.every=0 --device "$DEVICE" --point-timeout @TLEFT@)
CLIENTS=("$PYTHON" scripts/gpu_figures.py clients --device "$DEVICE" --timeout @TLEFT@ "${CLIENT_SET[@]}")
PYTEST=("$PYTHON" -m pytest -p no:cacheprovider -rA -o addopts=)

# The CUDA tests that skip on a CPU (with each file's CPU tests: they are quick), then the
# figures, the most wanted first, then the slow CUDA tests (client processes, torchrun).
CUDA_TESTS=(tests/unit/test_engine_layout.py tests/unit/test_batched.py)
ready clients && CUDA_TESTS+=(tests/integration/test_client_device.py)
STEP_LOG="$OUT/tests.log" step tests_cuda 90 "batched tests" "${PYTEST[@]}" -m "not slow" "${CUDA_TESTS[@]}"
step cnn_lenet5 90 batched "${CNN[@]}" --rounds "$LENET_ROUNDS" --json "$WORK/fig/cnn_lenet5.json"
step clients_12 75 "batched clients" "${CLIENTS[@]}" --out "$WORK/runs/clients_12" --json "$WORK/fig/clients_12.json"
step torchrun_grpc 50 "batched clients" "${CLIENTS[@]}" --torchrun 4 --transport grpc --out "$WORK/runs/torchrun_grpc" --json "$WORK/fig/torchrun_grpc.json"
step torchrun_torch 50 "batched clients" "${CLIENTS[@]}" --torchrun 4 --transport torch --out "$WORK/runs/torchrun_torch" --json "$WORK/fig/torchrun_torch.json"
step scale_softmax_mid 40 batched "${SCALE[@]}" --clients "$MID_CLIENTS" --rounds "$SCALE_ROUNDS" --json "$WORK/fig/scale_softmax_mid.json"
step scale_lenet5_mid 60 batched "${SCALE[@]}" --clients "$MID_CLIENTS" --rounds "$SCALE_ROUNDS" --set train.model=lenet5 --json "$WORK/fig/scale_lenet5_mid.json"
step cnn_resnet20 75 batched "${CNN[@]}" "${RESNET_SET[@]}" --rounds "$RESNET_ROUNDS" --set train.model=resnet20 --json "$WORK/fig/cnn_resnet20.json"
step scale_softmax_big 80 batched "${SCALE[@]}" --clients "$BIG_CLIENTS" --rounds "$SCALE_ROUNDS" --json "$WORK/fig/scale_softmax_big.json"
step scale_lenet5_big 75 batched "${SCALE[@]}" --clients "$BIG_CLIENTS" --rounds "$BIG_ROUNDS" --set train.model=lenet5 --json "$WORK/fig/scale_lenet5_big.json"
STEP_LOG="$OUT/tests.log" step tests_cuda_slow 90 "batched clients tests" "${PYTEST[@]}" -m slow tests/multiprocess/test_cuda_processes.py \
    tests/e2e/test_torchrun.py -k "gpu or cuda or nccl"

# -- the report ------------------------------------------------------------------------------
"$PYTHON" - "$STEPS" "$WORK/steps.json" <<'EOF'
import json, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
json.dump([{"name": n, "status": s, "seconds": int(t)} for n, s, t in rows], open(sys.argv[2], "w"), indent=1)
EOF
cp "$WORK/env.json" "$OUT/env.json" 2>/dev/null
CPU_FIGURES=bench/results/gpu_check_cpu.json
[ "$DEVICE" = cpu ] && [ "$DRY_RUN" != 1 ] && CPU_FIGURES=""
"$PYTHON" scripts/gpu_figures.py report --work "$WORK" ${CPU_FIGURES:+--cpu "$CPU_FIGURES"} --out "$OUT" >>"$LOG" 2>&1
say "done in $(($(date +%s) - STARTED))s; results in $OUT"
column -t -s $'\t' "$STEPS" 2>/dev/null | tee -a "$LOG" >&2 || cat "$STEPS" >&2
