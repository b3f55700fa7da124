#!/usr/bin/env bash
# Install the CPU build of torch 2.13.0 into a venv, before `pip install -e '.[test]'`.
#
#   scripts/install_torch_cpu.sh VENV_DIR   (the venv is created if it does not exist)
#
# Why: on Linux, PyPI's torch 2.13.0 is the CUDA build (torch plus ~15 nvidia-* wheels and
# triton: gigabytes). The CPU build lives on PyTorch's own index as torch==2.13.0+cpu. With
# it installed first, the test extra's `torch==2.13.0` is already met and pip keeps it.
# A GPU user skips this script: `pip install -e '.[gpu,test]'` takes the CUDA build from PyPI.
#
# The pin carries the local version (+cpu), so pip cannot land on the CUDA build: where
# no CPU wheel can be had it fails, it never falls back to gigabytes. Where it looks:
#   1. pip's local wheels only (--no-index: its find-links; this project's machines keep
#      the wheel there), so nothing is fetched and nothing waits on the network;
#   2. otherwise PyTorch's CPU index ($TORCH_CPU_INDEX), for the torch wheel alone
#      (~190 MB for Linux x86_64);
# then torch's own small dependencies (filelock, sympy, networkx, jinja2, fsspec, ...) come
# from pip's usual indexes. For Linux: on macOS PyPI's torch is already the CPU build
# (there is no +cpu wheel), so skip this script there.
# Running it again is a no-op once the CPU build is there.
set -Eeuo pipefail
# shellcheck source=lib/pip_install.sh
source "$(dirname "$0")/lib/pip_install.sh"

TORCH_VERSION=2.13.0+cpu
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

die() {
    echo "install_torch_cpu.sh: error: $*" >&2
    exit 1
}

[[ $# -eq 1 ]] || die "usage: scripts/install_torch_cpu.sh VENV_DIR"
VENV=$1

if [[ ! -x "$VENV/bin/python" ]]; then
    command -v python3 >/dev/null || die "python3 not found: it is needed to create $VENV"
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"

installed_torch() {
    "$PY" -c 'import importlib.metadata as md; print(md.version("torch"))' 2>/dev/null || true
}

if [[ $(installed_torch) == "$TORCH_VERSION" ]]; then
    echo "install_torch_cpu.sh: torch==$TORCH_VERSION already in $VENV; nothing to do"
    exit 0
fi

# A failed local lookup only means "no local wheel": its message is not an error.
if ! pip_install -q --no-index --no-deps "torch==$TORCH_VERSION" >/dev/null 2>&1; then
    echo "install_torch_cpu.sh: torch==$TORCH_VERSION from $TORCH_CPU_INDEX"
    pip_install -q --no-deps --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION" ||
        die "no torch==$TORCH_VERSION wheel for $("$PY" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])') on $(uname -sm): not among pip's local wheels, and $TORCH_CPU_INDEX could not serve one (see pip's output above)"
fi
# torch is in place, so this fetches only what torch itself depends on.
pip_install -q "torch==$TORCH_VERSION"

[[ $(installed_torch) == "$TORCH_VERSION" ]] ||
    die "pip left torch $(installed_torch) in $VENV, not $TORCH_VERSION"
"$PY" -W ignore -c 'import torch' || die "torch==$TORCH_VERSION is installed in $VENV but does not import (above)"
echo "install_torch_cpu.sh: torch==$TORCH_VERSION ready in $VENV"
