#!/usr/bin/env bash
# The wheels a `dfedrw compose` image is built from, into one folder:
#
#   bash scripts/build_wheelhouse.sh DIR                   the project and every dependency
#                                                          (offline builds: pip install --no-index)
#   bash scripts/build_wheelhouse.sh --project-only DIR    the project wheel alone (online builds)
#
# DIR is usually the compose folder's wheelhouse/. The wheels must fit the image's Python
# (CPython 3.11 on Linux x86_64, glibc): run this with a 3.11 interpreter, PYTHON=... (default
# .venv/bin/python). pip reads its usual configuration (index, find-links, proxy). PyTorch is
# pinned to the CPU build: on a machine whose index serves the CUDA build, set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu.
set -euo pipefail

TORCH="torch==2.13.0"
IMAGE_PYTHON="${IMAGE_PYTHON:-3.11}"
project_only=0
if [ "${1:-}" = "--project-only" ]; then
    project_only=1
    shift
fi
if [ $# -ne 1 ]; then
    echo "usage: bash scripts/build_wheelhouse.sh [--project-only] DIR" >&2
    exit 2
fi
mkdir -p "$1"
dest="$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."
repo="$PWD"
py="${PYTHON:-$repo/.venv/bin/python}"
if [ ! -x "$py" ]; then
    echo "build_wheelhouse: no Python at $py; run scripts/setup.sh or set PYTHON=" >&2
    exit 2
fi
have="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$have" != "$IMAGE_PYTHON" ]; then
    echo "build_wheelhouse: $py is Python $have but the image runs $IMAGE_PYTHON; compiled wheels would not fit" >&2
    exit 2
fi

# setuptools builds inside the source tree (build/, *.egg-info): build from a copy so the
# working tree is left as it was. What the copy holds is read from pyproject.toml, the one
# place that says what the package is made of (its packages and their folders, its readme),
# so a folder added to the package cannot be left out here.
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
mapfile -t parts < <("$py" "$repo/scripts/package_sources.py" "$repo")
[ ${#parts[@]} -gt 1 ] || { echo "build_wheelhouse: no package folders found in pyproject.toml" >&2; exit 2; }
tar -C "$repo" --exclude=__pycache__ -cf - "${parts[@]}" | tar -C "$src" -xf -
# An older project wheel would make the image's `pip install dfedrw-*.whl` ambiguous.
rm -f "$dest"/dfedrw-*.whl
if [ "$project_only" = 1 ]; then
    "$py" -m pip wheel --quiet --no-deps --wheel-dir "$dest" "$src"
else
    torch_index=()
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        torch_index=(--index-url "$TORCH_INDEX_URL")
    fi
    "$py" -m pip download --quiet --no-deps --dest "$dest" "${torch_index[@]}" "$TORCH"
    constraints="$src/constraints.txt"
    echo "$TORCH" >"$constraints"
    # The pin and the folder itself as a source keep pip on the CPU wheel just fetched.
    "$py" -m pip wheel --quiet --prefer-binary --wheel-dir "$dest" --find-links "$dest" \
        --constraint "$constraints" "$src"
    if ls "$dest"/nvidia_* >/dev/null 2>&1; then
        echo "build_wheelhouse: warning: CUDA packages (nvidia_*) came with PyTorch; for the CPU build" \
            "set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu and start from an empty DIR" >&2
    fi
fi
echo "build_wheelhouse: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest" >&2
