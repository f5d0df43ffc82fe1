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
# PyTorch's CPU build. PyPI's Linux x86_64 wheel of torch is the CUDA build, which pulls
# several GB of NVIDIA packages; the CPU build is `torch==2.13.0+cpu`, on PyTorch's own index.
# A wheelhouse pip is configured to read (find-links) is tried first; TORCH_INDEX_URL names
# another index (a mirror, or a CUDA build's) and is then the only one asked.
TORCH="torch==2.13.0"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
if ! $PY -c 'import torch' 2>/dev/null; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        echo "setup: installing $TORCH from $TORCH_INDEX_URL" >&2
        $PY -m pip install -q "$TORCH" --index-url "$TORCH_INDEX_URL"
    elif ! $PY -m pip install -q "$TORCH+cpu" 2>/dev/null; then
        echo "setup: installing $TORCH (CPU build) from $TORCH_CPU_INDEX" >&2
        $PY -m pip install -q "$TORCH" --index-url "$TORCH_CPU_INDEX"
    fi
fi
# Debian's Fashion-MNIST (/usr/share/datasets/fashion-mnist): the runs and tests on the real
# data set read it. Installed where this runs as root with apt; elsewhere one line says how.
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing Debian's dataset-fashion-mnist" >&2
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; }; then
            echo "setup: could not install dataset-fashion-mnist; the Fashion-MNIST tests skip until it is there" >&2
        fi
    else
        echo "setup: Fashion-MNIST is not installed; run 'sudo apt-get install dataset-fashion-mnist' (its tests skip until then)" >&2
    fi
fi
# The test tools and the tensorboard extra, whose tests run in CI too.
$PY -m pip install -q -e ".[dev,tensorboard]"
echo "setup: ready ($($PY -c 'import torch, grpc; print("torch", torch.__version__, "grpcio", grpc.__version__)'))" >&2
