#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh installs on a GPU machine that reaches no package index, into
# .whl/ (ignored by git): the project's dependencies that such a machine's Python may lack,
# for CPython 3.12 on Linux x86_64, at the versions installed in .venv (what the tests here
# ran with).
#
#   bash scripts/gpu_carry.sh             the client processes' packages: pyzmq, cryptography
#                                         (with cffi and pycparser) and tomli-w (about 6 MB)
#   bash scripts/gpu_carry.sh --full      also grpcio and protobuf (about 14 MB), for a machine
#                                         whose own are older than the pins (grpcio 1.85.1,
#                                         protobuf 7.35.1: the generated stubs refuse older ones)
#   bash scripts/gpu_carry.sh --lean      tomli-w alone (7 KB): the batched engine's figures and
#                                         tests only; the client-process steps are skipped
#
# gpu_check.sh installs a carried wheel only where the package is missing or its version does
# not fit the pins. Everything that travels with the checkout counts against what the machine
# takes: this prints the size of the tracked files and of .whl/ together.
# Settings: PYTHON_VERSION (3.12), PYTHON (.venv/bin/python: whose versions to take).
set -euo pipefail
cd "$(dirname "$0")/.."

tier="${1:---standard}"
case "$tier" in
    --lean) names=(tomli-w) ;;
    --standard) names=(tomli-w pyzmq cryptography cffi pycparser) ;;
    --full) names=(tomli-w pyzmq cryptography cffi pycparser grpcio protobuf) ;;
    *) echo "usage: bash scripts/gpu_carry.sh [--lean|--standard|--full]" >&2; exit 2 ;;
esac
py="${PYTHON:-.venv/bin/python}"
target="${PYTHON_VERSION:-3.12}"
if [ ! -x "$py" ]; then
    echo "gpu_carry: no Python at $py; run scripts/setup.sh first (its versions are the ones carried)" >&2
    exit 2
fi
rm -rf .whl
mkdir -p .whl
for name in "${names[@]}"; do
    version="$("$py" -c 'import sys; from importlib import metadata; print(metadata.version(sys.argv[1]))' "$name")"
    echo "gpu_carry: $name==$version" >&2
    # One platform tag per glibc baseline the wheels are published for (pip matches each exactly).
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$target" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$name==$version"
done
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
carried=$(find .whl -type f -printf '%s\n' | awk '{s += $1} END {print s}')
awk -v t="$tracked" -v c="$carried" 'BEGIN {
    printf "gpu_carry: .whl/ %.1f MiB; the tracked files %.1f MiB; together %.1f MiB (the GPU machine takes 64 MiB)\n", c / 1048576, t / 1048576, (t + c) / 1048576
}' >&2
ls -l .whl >&2
