#!/usr/bin/env bash
# Install SGLang's scheduler into a venv of its own, for the SGLang adapter
# (schedspec.properties.adapters.sglang).
#
#   scripts/install_sglang.sh VENV_DIR      (the venv is created if it does not exist)
#
# Its own venv, not vLLM's: SGLang 0.5.23 and vLLM 0.33.0 pin the same packages to
# versions that exclude each other (openai ==2.8.0 against >=2.25.0, compressed-tensors
# ==0.18.0 against ==0.17.0, xgrammar ==0.2.7 against ==0.2.8), so one venv would run
# one of them on dependencies it was not released with. The README's set-up section
# names the venv .venv-sglang.
#
# Only SGLang's scheduler stack is needed (Scheduler, PrefillAdder, ScheduleBatch, the
# radix cache and the token pools, with the TpModelWorker that builds them), not its
# kernels, so this does not take SGLang's dependency list whole (torch 2.14.1 CUDA,
# flashinfer, sgl-kernel, flash-attn, deep-gemm...: gigabytes, none of it imported):
#   1. torch 2.13.0: kept if the venv has it, else its CPU build through
#      scripts/install_torch_cpu.sh;
#   2. sglang==0.5.23 with --no-deps (a 39 MB wheel);
#   3. the packages the scheduler's import chain needs (RUNTIME_PACKAGES, found by
#      importing until nothing was missing), held to SGLang's own version pins by a
#      constraints file made from the wheel's METADATA (Requires-Dist), SGLang's torch
#      pins excepted, and Triton at TRITON_VERSION (SGLang does not name it: a CUDA torch
#      brings it; SGLang defines Triton kernels at import time and never runs them here);
#   4. compressed-tensors at SGLang's pin, with --no-deps (imported by the model config
#      code; its own dependencies would bring a second torch);
#   5. sglang's and compressed-tensors' METADATA trimmed of the requirements left out
#      on purpose (scripts/lib/dist_requirements.py), so that later `pip install`s into
#      the venv and `pip check` stay quiet about them and still check every other one.
# No torchvision: PyPI's wheels need a CUDA torch and do not load against the CPU one;
# the adapter stubs the one import of it that SGLang's config code makes.
#
# Then the probe: `python -m schedspec.properties.adapters.sglang_probe` builds SGLang's
# real Scheduler for every config family the adapter supports (plain and overlap loops,
# radix cache on and off, page sizes 1 and 4, mixed chunk) and steps each under the
# harness, with every per-user cache (Hugging Face's, SGLang's, Triton's, the XDG
# folders) pointed at an empty temp folder, so no cache can stand in for a missing
# package. The same probe runs first: a venv that passes it (and has sglang==0.5.23,
# torch 2.13.0 and trimmed METADATA) needs nothing.
#
# The probe imports schedspec from this checkout (the script puts the checkout first on
# PYTHONPATH). schedspec's own runtime dependencies must import in the venv: when they
# do not, the script installs this checkout into the venv (`pip install -e .`).
#
# Downloads and time on a fresh machine: see the README's set-up section. Running it again
# is a probe (~30 s) and nothing else once the install works.
set -Eeuo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/pip_install.sh
source "$REPO/scripts/lib/pip_install.sh"

SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
TRITON_VERSION=3.9.0
# SGLang pins these to its CUDA torch 2.14.1; the venv keeps its torch 2.13.0, which
# SGLang's scheduler runs on (and installs no torchvision or torchaudio).
OVERRIDDEN=(torch torchvision torchaudio)
# What `import sglang.srt.managers.scheduler` and building a Scheduler import with
# sglang 0.5.23 on this CPU path: without any one of them the probe fails.
RUNTIME_PACKAGES=(
    numpy packaging psutil pydantic requests pyzmq setproctitle msgspec orjson pybase64
    regex tqdm transformers pillow starlette IPython aiohttp apache-tvm-ffi dill
    sentencepiece gguf openai partial_json_parser einops uvicorn fastapi loguru
)
NO_DEPS=(sglang compressed-tensors)
# What pip's resolver says about them until step 5 has trimmed their METADATA.
PIP_EXPECTED=("^(sglang|compressed-tensors) [0-9.]+ requires " "^ERROR: pip's dependency resolver")

die() {
    echo "install_sglang.sh: error: $*" >&2
    exit 1
}

[[ $# -eq 1 ]] || die "usage: scripts/install_sglang.sh VENV_DIR"
VENV=$1
STEP="start"
trap 'echo "install_sglang.sh: error: step \"$STEP\" failed (see the output above); fix that and rerun: finished steps are kept" >&2' ERR

if [[ ! -x "$VENV/bin/python" ]]; then
    STEP="create the venv $VENV"
    command -v python3 >/dev/null || die "python3 not found: it is needed to create $VENV"
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"

# "torch" if the venv lacks torch $TORCH_VERSION (any build), else "sglang" if it lacks
# sglang $SGLANG_VERSION, else nothing.
missing_version() {
    "$PY" - "$SGLANG_VERSION" "$TORCH_VERSION" <<'EOF'
import importlib.metadata as md
import sys


def version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "none"


if version("torch").split("+")[0] != sys.argv[2]:
    print("torch")
elif version("sglang") != sys.argv[1]:
    print("sglang")
EOF
}

in_checkout() {
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$@"
}

probe() {
    in_checkout "$PY" -m schedspec.properties.adapters.sglang_probe
}

trimmed() {
    local dist
    for dist in "${NO_DEPS[@]}"; do
        "$PY" "$REPO/scripts/lib/dist_requirements.py" is-trimmed "$dist" 2>/dev/null || return 1
    done
}

if [[ -z $(missing_version) ]] && trimmed && probe >/dev/null 2>&1; then
    echo "install_sglang.sh: sglang==$SGLANG_VERSION already works in $VENV; nothing to do"
    exit 0
fi

if [[ $(missing_version) == torch ]]; then
    STEP="torch==$TORCH_VERSION (CPU build)"
    echo "== $STEP"
    "$REPO/scripts/install_torch_cpu.sh" "$VENV"
fi

STEP="sglang==$SGLANG_VERSION --no-deps"
echo "== $STEP"
pip_install -q --no-deps "sglang==$SGLANG_VERSION"

STEP="constraints from SGLang's Requires-Dist"
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
pip_install -q packaging # what dist_requirements.py parses requirements with
"$PY" "$REPO/scripts/lib/dist_requirements.py" constraints sglang --overridden "${OVERRIDDEN[@]}" \
    >"$CONSTRAINTS"
echo "triton==$TRITON_VERSION" >>"$CONSTRAINTS"
echo "== constraints: $(wc -l <"$CONSTRAINTS") pins (sglang $SGLANG_VERSION's METADATA, and Triton)"
COMPRESSED_TENSORS_PIN=$(grep -i '^compressed-tensors' "$CONSTRAINTS" || true)
[[ -n $COMPRESSED_TENSORS_PIN ]] || die "sglang $SGLANG_VERSION's METADATA pins no compressed-tensors version"

STEP="the scheduler's runtime packages, under SGLang's pins"
echo "== $STEP"
pip_install -q -c "$CONSTRAINTS" "${RUNTIME_PACKAGES[@]}" triton

STEP="$COMPRESSED_TENSORS_PIN --no-deps"
echo "== $STEP"
pip_install -q --no-deps "$COMPRESSED_TENSORS_PIN"

if ! in_checkout "$PY" -c 'import schedspec.properties.adapters.sglang' 2>/dev/null; then
    STEP="schedspec's own dependencies (pip install -e $REPO)"
    echo "== $STEP"
    pip_install -q -c "$CONSTRAINTS" -e "$REPO"
fi

STEP="trim the METADATA of ${NO_DEPS[*]} (installed with --no-deps)"
echo "== $STEP"
for dist in "${NO_DEPS[@]}"; do
    "$PY" "$REPO/scripts/lib/dist_requirements.py" trim "$dist" --overridden "${OVERRIDDEN[@]}"
done
CONFLICTS=$("$PY" -m pip --disable-pip-version-check check 2>&1 | grep -E "^($(
    IFS='|'
    echo "${NO_DEPS[*]}"
)) " || true)
[[ -z $CONFLICTS ]] || die "pip check still finds unmet requirements of ${NO_DEPS[*]}:
$CONFLICTS"

STEP="probe: build and step SGLang's Scheduler per config family, with empty caches"
echo "== $STEP"
if ! OUTPUT=$(probe 2>&1); then
    echo "$OUTPUT" >&2
    die "sglang $SGLANG_VERSION is installed in $VENV but the probe cannot build or step its Scheduler (above)"
fi
echo "$OUTPUT"
echo "install_sglang.sh: sglang==$SGLANG_VERSION ready in $VENV"
