#!/usr/bin/env bash
# Install vLLM's scheduler into a venv, for the vLLM adapter (schedspec.properties.adapters.vllm).
#
#   scripts/install_vllm.sh VENV_DIR        (the venv is created if it does not exist)
#
# Only vLLM's scheduler, its config classes and what building a model config imports are
# needed, not its kernels, so this does not take vLLM's dependency list whole (that pulls a
# CUDA torch and its kernels, gigabytes):
#   1. torch 2.13.0: kept if the venv has it (the CPU build, or a GPU user's CUDA build),
#      else its CPU build through scripts/install_torch_cpu.sh;
#   2. vllm==0.33.0 with --no-deps (the release the reference follows; ~340 MB);
#   3. only the packages that building and stepping a VllmEngine imports (RUNTIME_PACKAGES),
#      held to vLLM's own version pins by a constraints file made from the wheel's
#      METADATA (Requires-Dist), vLLM's torch pins excepted;
#   4. xgrammar at vLLM's pin, with --no-deps (the scheduler's imports reach it; its own
#      dependencies add Triton);
#   5. vllm's and xgrammar's METADATA trimmed of the requirements left out on purpose
#      (scripts/lib/dist_requirements.py: the originals stay as METADATA.orig, the removed
#      lines are listed in LEFT_OUT), so that later `pip install`s into the venv and
#      `pip check` stay quiet about them and still check every other requirement.
# Then the probe: `python -m schedspec.properties.adapters.vllm_probe` builds and steps a
# real VllmEngine for every config family the adapter supports (no drafts, n-gram and EAGLE
# drafts; fcfs, priority; prefix caching off, on) with every per-user cache (vLLM's, Hugging
# Face's, the XDG folders) pointed at an empty temp folder: vLLM caches per user what it
# learns by importing a model's code in a subprocess, and a warm cache would hide a
# package only that import needs. The same probe runs first: a venv that passes it (and
# has vllm==0.33.0, torch 2.13.0 and trimmed METADATA) needs nothing.
#
# The probe imports schedspec from this checkout (the script puts the checkout first on
# PYTHONPATH), so it tests the adapter next to the script. schedspec's own runtime
# dependencies (click, hypothesis, z3-solver, matplotlib) must import in the venv: after
# the README's `pip install -e '.[test]'` they do; otherwise the script installs this
# checkout into the venv (`pip install -e .`, which brings them).
#
# Downloads and time on a fresh machine: see the README's set-up section. Running it again
# is a probe (~20-30 s) and nothing else once the install works.
set -Eeuo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/pip_install.sh
source "$REPO/scripts/lib/pip_install.sh"

VLLM_VERSION=0.33.0
TORCH_VERSION=2.13.0
# vLLM pins these to its CUDA torch 2.14.0; the venv keeps its torch 2.13.0, which vLLM's
# scheduler runs on (and installs no torchvision or torchaudio).
OVERRIDDEN=(torch torchvision torchaudio)
# What building and stepping a VllmEngine imports with vllm 0.33.0, in the process or in
# vLLM's model-inspection subprocess (einops: the Llama and EAGLE model code): without
# any one of them the probe fails.
RUNTIME_PACKAGES=(
    numpy packaging regex pydantic psutil cbor2 pyzmq requests transformers aiohttp
    oss-harmony openai msgspec cloudpickle pillow pybase64 cachetools uvloop py-cpuinfo
    prometheus_client fastapi partial_json_parser llguidance apache-tvm-ffi einops
)
NO_DEPS=(vllm xgrammar)
# What pip's resolver says about them until step 5 has trimmed their METADATA.
PIP_EXPECTED=("^(vllm|xgrammar) [0-9.]+ requires " "^ERROR: pip's dependency resolver")

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

# "torch" if the venv lacks torch $TORCH_VERSION (any build), else "vllm" if it lacks vllm
# $VLLM_VERSION, else nothing.
missing_version() {
    "$PY" - "$VLLM_VERSION" "$TORCH_VERSION" <<'EOF'
import importlib.metadata as md
import sys


def version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "none"


if version("torch").split("+")[0] != sys.argv[2]:
    print("torch")
elif version("vllm") != sys.argv[1]:
    print("vllm")
EOF
}

in_checkout() {
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$@"
}

probe() {
    in_checkout "$PY" -m schedspec.properties.adapters.vllm_probe
}

trimmed() {
    local dist
    for dist in "${NO_DEPS[@]}"; do
        "$PY" "$REPO/scripts/lib/dist_requirements.py" is-trimmed "$dist" 2>/dev/null || return 1
    done
}

if [[ -z $(missing_version) ]] && trimmed && probe >/dev/null 2>&1; then
    echo "install_vllm.sh: vllm==$VLLM_VERSION already works in $VENV; nothing to do"
    exit 0
fi

if [[ $(missing_version) == torch ]]; then
    STEP="torch==$TORCH_VERSION (CPU build)"
    echo "== $STEP"
    "$REPO/scripts/install_torch_cpu.sh" "$VENV"
fi

STEP="vllm==$VLLM_VERSION --no-deps"
echo "== $STEP"
pip_install -q --no-deps "vllm==$VLLM_VERSION"

STEP="constraints from vLLM's Requires-Dist"
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
pip_install -q packaging # what dist_requirements.py parses requirements with
"$PY" "$REPO/scripts/lib/dist_requirements.py" constraints vllm --overridden "${OVERRIDDEN[@]}" \
    >"$CONSTRAINTS"
echo "== constraints: $(wc -l <"$CONSTRAINTS") pins from vllm $VLLM_VERSION's METADATA"
XGRAMMAR_PIN=$(grep -i '^xgrammar' "$CONSTRAINTS" || true)
[[ -n $XGRAMMAR_PIN ]] || die "vllm $VLLM_VERSION's METADATA pins no xgrammar version"

STEP="the scheduler's runtime packages, under vLLM's pins"
echo "== $STEP"
pip_install -q -c "$CONSTRAINTS" "${RUNTIME_PACKAGES[@]}"

STEP="$XGRAMMAR_PIN --no-deps"
echo "== $STEP"
pip_install -q --no-deps "$XGRAMMAR_PIN"

if ! in_checkout "$PY" -c 'import schedspec.properties.adapters.vllm' 2>/dev/null; then
    STEP="schedspec's own dependencies (pip install -e $REPO)"
    echo "== $STEP"
    pip_install -q -e "$REPO"
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

STEP="probe: build and step a VllmEngine per config family, with empty caches"
echo "== $STEP"
if ! OUTPUT=$(probe 2>&1); then
    echo "$OUTPUT" >&2
    die "vllm $VLLM_VERSION is installed in $VENV but the probe cannot build or step a VllmEngine (above)"
fi
echo "$OUTPUT"
echo "install_vllm.sh: vllm==$VLLM_VERSION ready in $VENV"
