#!/usr/bin/env bash
# The CUDA checks and figures of gpu_impl and the execution layer, as one run on a GPU
# machine (whose python3 already holds torch with CUDA; nothing is installed here).
#
#     benchmarks/cuda_checks.sh OUT_DIR
#     DEVICE=cpu PYTHON=.venv/bin/python BATCHES=1,64 BIG=256 benchmarks/cuda_checks.sh OUT
#         (a dry run on the CPU: every step, small sizes)
#
# In order of what a short lease must not miss: bench_gpu_impl on CUDA (B up to 2^20,
# with the GPU's busy share; a CUDA fault shows there first), then correctness on CUDA
# (the block-exact lockstep diff with the reference, which runs the invariant suite on
# both, swarm mode with its device checks, the execution layer's properties), then the
# execution benchmark and where a large-B tick spends its time. Every step has its own
# time limit (about 8 minutes in all) and the run goes on past a failing step; one log
# collects them all, and nvidia-smi samples the GPU's load beside it.
set -u
out=${1:?usage: benchmarks/cuda_checks.sh OUT_DIR}
mkdir -p "$out"
log="$out/cuda_checks.log"
cd "$(dirname "$0")/.."
device=${DEVICE:-cuda}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SCHEDSPEC_GPU_DEVICE=$device
py=${PYTHON:-python3}
batches=${BATCHES:-1,64,1024,4096,16384,65536,262144,1048576}
big=${BIG:-65536}  # swarm mode's instances; four times that for the per-line timing
failed=()

step() {
    local name=$1 limit=$2 started rc
    shift 2
    echo "== $name (limit ${limit}s): $*" | tee -a "$log"
    started=$(date +%s)
    timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
    echo "== $name: rc=$rc in $(($(date +%s) - started))s" | tee -a "$log"
    [ "$rc" = 0 ] || failed+=("$name")
}

dmon=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi dmon -s u -o T -d 1 >"$out/gpu_load.txt" 2>&1 &
    dmon=$!
    nvidia-smi -L | tee -a "$log"
fi
step env 30 "$py" -c 'import platform, sys, torch; print(sys.version, platform.processor()); \
print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())'
step bench-gpu-impl 160 "$py" benchmarks/bench_gpu_impl.py --device "$device" \
    --batches "$batches"
# 40 examples, not the CI profile's 100: at B = 1 a CUDA step is launch-bound (about
# ten times a CPU step), and this step must leave the figures their time.
step diff-reference-gpu 90 "$py" -m schedspec diff --left reference --right gpu \
    --compare-block-ids --seed 20261129 --examples 40 --trace-dir "$out"
step swarm 60 "$py" -m schedspec check --engine gpu --instances "$big" --seed 3 \
    --trace-dir "$out"
step execution-properties 40 "$py" -m pytest -q -p no:cacheprovider \
    tests/test_execution_invariance.py
step bench-execution 50 "$py" benchmarks/bench_execution.py --device "$device"
step lines 45 "$py" benchmarks/bench_gpu_impl.py --device "$device" --lines $((big * 4))

[ -z "$dmon" ] || kill "$dmon"
echo "== failed steps: ${failed[*]:-none}" | tee -a "$log"
[ ${#failed[@]} = 0 ]
