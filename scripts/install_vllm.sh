#!/usr/bin/env bash
# Install vLLM into a venv, for the vLLM adapter (schedspec.properties.adapters.vllm).
#
#   scripts/install_vllm.sh VENV_DIR        (the venv is created if it does not exist)
#
# Only vLLM's scheduler and its config classes are needed, not its kernels, so this
# does not take vLLM's dependency list whole (that pulls a CUDA torch, gigabytes):
#   1. torch==2.13.0, the CPU build (on this project's machines pip takes the wheel
#      from local disk);
#   2. vllm==0.33.0 with --no-deps (the release the reference follows; ~340 MB);
#   3. only the packages that vllm.v1.core.sched.scheduler and ModelConfig import,
#      held to vLLM's own version pins by a constraints file generated from the
#      wheel's METADATA (Requires-Dist; vLLM's torch pins are left out: vLLM's
#      scheduler runs on the CPU torch 2.13.0);
#   4. xgrammar at vLLM's pin, with --no-deps (the scheduler's import chain reaches
#      it through vllm.parser; its own dependencies would pull another torch).
# On a fresh machine: about 60-90 s, about 390 MB downloaded (336 MB of it the vLLM
# wheel; torch and ~30 small wheels come from local disk), a 2.2 GB venv.
# pip extras cannot say --no-deps, hence a script. Running it again is a no-op once
# the install works. Afterwards: VENV_DIR/bin/pip install -e '.[test]' for schedspec.
set -Eeuo pipefail

VLLM_VERSION=0.33.0
TORCH_VERSION=2.13.0
# What `import vllm.v1.core.sched.scheduler` and `vllm.config.ModelConfig` need: with
# vllm 0.33.0 the adapter fails to build a scheduler without any one of them.
RUNTIME_PACKAGES=(
    numpy packaging regex pydantic psutil cbor2 pyzmq requests transformers aiohttp
    oss-harmony openai msgspec cloudpickle pillow pybase64 cachetools uvloop py-cpuinfo
    prometheus_client fastapi partial_json_parser llguidance apache-tvm-ffi
)

die() {
    echo "install_vllm.sh: error: $*" >&2
    exit 1
}

[[ $# -eq 1 ]] || die "usage: scripts/install_vllm.sh VENV_DIR"
VENV=$1
STEP="start"
trap 'echo "install_vllm.sh: error: step \"$STEP\" failed (see the output above); fix that and rerun: finished steps are kept" >&2' ERR

if [[ ! -x "$VENV/bin/python" ]]; then
    STEP="create the venv $VENV"
    command -v python3 >/dev/null || die "python3 not found: it is needed to create $VENV"
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# pip, minus the lines about what --no-deps leaves out on purpose (vLLM's CUDA
# kernels, its server stack, its torch 2.14 pin): those would read as errors.
pip_install() {
    "${PIP[@]}" install "$@" 2>&1 | {
        grep -v -E "^(vllm [0-9.]+ requires |ERROR: pip's dependency resolver|WARNING: Location 'file:)" || true
    }
}

# The import a working install must pass: the scheduler and the config classes, offline.
probe() {
    HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR "$PY" - "$VLLM_VERSION" "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.metadata as md
import sys

assert md.version("vllm") == sys.argv[1], md.version("vllm")
assert md.version("torch").split("+")[0] == sys.argv[2], md.version("torch")
import vllm.v1.core.sched.scheduler  # noqa: F401,E402
from vllm.config import ModelConfig, VllmConfig  # noqa: F401,E402
EOF
}

if probe; then
    echo "install_vllm.sh: vllm==$VLLM_VERSION already works in $VENV; nothing to do"
    exit 0
fi

STEP="torch==$TORCH_VERSION (CPU build)"
echo "== $STEP"
pip_install -q "torch==$TORCH_VERSION"
"$PY" -c 'import importlib.metadata as md, sys; sys.exit(md.version("torch").split("+")[0] != sys.argv[1])' \
    "$TORCH_VERSION" || die "pip installed another torch than $TORCH_VERSION into $VENV"

STEP="vllm==$VLLM_VERSION --no-deps"
echo "== $STEP"
pip_install -q --no-deps "vllm==$VLLM_VERSION"

STEP="constraints from vLLM's Requires-Dist"
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
"$PY" - >"$CONSTRAINTS" <<'EOF'
# Each dependency vLLM pins, with its version specifier: the pins our subset obeys.
import importlib.metadata as md

from pip._vendor.packaging.requirements import Requirement

LEFT_OUT = {"torch", "torchvision", "torchaudio"}  # we keep the CPU torch
for line in md.requires("vllm") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra, or another platform
    if req.name.lower() in LEFT_OUT or not str(req.specifier):
        continue
    print(f"{req.name}{req.specifier}")
EOF
echo "== constraints: $(wc -l <"$CONSTRAINTS") pins from vllm $VLLM_VERSION's METADATA"
XGRAMMAR_PIN=$(grep -i '^xgrammar' "$CONSTRAINTS" || true)
[[ -n $XGRAMMAR_PIN ]] || die "vllm $VLLM_VERSION's METADATA pins no xgrammar version"

STEP="the scheduler's runtime packages, under vLLM's pins"
echo "== $STEP"
pip_install -q -c "$CONSTRAINTS" "${RUNTIME_PACKAGES[@]}"

STEP="$XGRAMMAR_PIN --no-deps"
echo "== $STEP"
pip_install -q --no-deps "$XGRAMMAR_PIN"

STEP="import check"
if ! probe; then
    HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR "$PY" -c \
        'import vllm.v1.core.sched.scheduler; from vllm.config import ModelConfig' || true
    die "vllm $VLLM_VERSION is installed in $VENV but its scheduler does not import (above)"
fi
echo "install_vllm.sh: vllm==$VLLM_VERSION ready in $VENV"
