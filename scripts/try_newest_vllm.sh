#!/usr/bin/env bash
# What does the newest vLLM on PyPI break? Install it into a scratch venv and find out.
#
#   scripts/try_newest_vllm.sh [VENV_DIR]     (default .venv-vllm-newest, kept for next time)
#
# Not part of .ci/run: it follows PyPI, not this checkout. The steps, each named in the
# output and in the summary at the end:
#   1. find: the newest vllm release on PyPI (`pip index versions vllm`);
#   2. install: that release through scripts/install_vllm.sh --any-version --no-probe
#      (torch's CPU build and schedspec's own dependencies too; its steps are named when
#      one fails: a runtime package the release pins differently, a METADATA it cannot
#      trim);
#   3. probe: `python -m schedspec.properties.probe vllm`, which builds and steps a
#      VllmEngine per config family (an API the adapter reads that moved fails here,
#      naming the family and the error);
#   4. check: `schedspec check --engine vllm --examples 20` (a behaviour that moved fails
#      here, with its shrunk trace in the venv's folder).
# Steps 3 and 4 run even when the one before failed, so one run shows all it can. A release
# outside the supported range runs with SCHEDSPEC_VLLM_ANY_RELEASE=1, as the nearest
# supported release (adapters/vllm/releases.py); adding it to SUPPORTED there and to
# scripts/install_vllm.sh is how it becomes supported. Exit status 0 when every step
# passed, else 1.
set -Euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
SCRIPT=try_newest_vllm.sh
[[ $# -le 1 ]] || {
    echo "$SCRIPT: error: usage: scripts/$SCRIPT [VENV_DIR]" >&2
    exit 1
}
VENV=${1:-$REPO/.venv-vllm-newest}
export SCHEDSPEC_VLLM_ANY_RELEASE=1
RESULTS=()

step() {
    echo
    echo "== $SCRIPT: step $1"
}

# record NAME STATUS: a step's outcome for the summary.
record() {
    if [[ $2 -eq 0 ]]; then
        RESULTS+=("$1: passed")
    else
        RESULTS+=("$1: FAILED (exit $2)")
    fi
}

summary() {
    echo
    echo "== $SCRIPT: vLLM ${NEWEST:-?} in $VENV"
    local line failed=0
    for line in "${RESULTS[@]}"; do
        echo "   $line"
        [[ $line == *FAILED* ]] && failed=1
    done
    exit "$failed"
}

step "1/4 find: the newest vllm on PyPI"
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV" || {
        record find 1
        summary
    }
fi
NEWEST=$("$VENV/bin/python" -m pip --disable-pip-version-check index versions vllm 2>/dev/null |
    sed -nE 's/^vllm \(([^)]+)\)$/\1/p')
if [[ -z $NEWEST ]]; then
    echo "$SCRIPT: pip index versions vllm named no release (is PyPI reachable?)" >&2
    record find 1
    summary
fi
echo "newest: vllm $NEWEST"
record "find (vllm $NEWEST)" 0

step "2/4 install: vllm==$NEWEST (scripts/install_vllm.sh, which brings torch's CPU build and schedspec too)"
status=0
"$REPO/scripts/install_vllm.sh" --version "$NEWEST" --any-version --no-probe "$VENV" || status=$?
record install "$status"
[[ $status -eq 0 ]] || summary

# Both from this checkout (PYTHONPATH first), so they try the adapter beside this script.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
step "3/4 probe: build and step a VllmEngine per config family"
"$VENV/bin/python" -m schedspec.properties.probe vllm
record probe $?

step "4/4 check: schedspec check --engine vllm --examples 20"
"$VENV/bin/python" -m schedspec check --engine vllm --examples 20 --trace-dir "$VENV"
record check $?

summary
