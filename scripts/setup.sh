#!/usr/bin/env bash
# Set up everything the project needs in ./.venv, from nothing, on Debian/Ubuntu.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "setup: installing python3-venv" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv python3-pip
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
PY=.venv/bin/python
# The CPU wheel: plain `pip install torch` would pull several GB of CUDA packages.
if ! $PY -c 'import torch' 2>/dev/null; then
    $PY -m pip install -q "torch==2.13.0"
fi
# The test tools and the tensorboard extra, whose tests run in CI too.
$PY -m pip install -q -e ".[dev,tensorboard]"
echo "setup: ready ($($PY -c 'import torch, grpc; print("torch", torch.__version__, "grpcio", grpc.__version__)'))" >&2
