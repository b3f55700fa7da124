"""gpu_impl against the reference: instance-steps per second, and single-instance step time.

Part 1 steps B instances of one random workload (gpu_impl's SwarmWorkload:
arrivals, aborts, drafts, prefix sharing, forced stops) for B = 1, 64,
1024, 4096: gpu_impl all B at once, the reference one instance after
another. The reference's rate does not depend on B (it steps instances one
by one), so it is measured once, on the first REFERENCE_INSTANCES (64)
instances of the same swarm replayed as traces (swarm_trace.record_instance:
the same requests and the same model decisions), over the same ticks; each
ratio below divides two rates measured in this run. Instances differ in
load: the reference's rate over groups of 16 of them ranged 13,800-15,700
instance-steps/s, so a sample of 16 moved the ratio by a tenth; 64 take
about five seconds to record and step.

On the CPU both rates count CPU seconds of this process (time.process_time; torch runs
one thread by default, as the reference does), so that other jobs on a shared machine
disturb the ratio less than they disturb wall time; `--clock wall` counts wall seconds
instead, which a GPU run always does (its kernels run outside the process's CPU time).

Part 2 times one instance with 256 and 1024 running requests (all past
their prefill, decoding one token per step): gpu_impl with B = 1 and the
reference, same requests, same one-token model.

    .venv/bin/python benchmarks/bench_gpu_impl.py                 # CPU, about a minute
    .venv/bin/python benchmarks/bench_gpu_impl.py --quick         # smoke run (seconds)
    .venv/bin/python benchmarks/bench_gpu_impl.py --device cuda   # a GPU, when one is present
    .venv/bin/python benchmarks/bench_gpu_impl.py --device cuda --batches 4096,65536,1048576
    .venv/bin/python benchmarks/bench_gpu_impl.py --malloc-default  # glibc's malloc untuned
    .venv/bin/python benchmarks/bench_gpu_impl.py --breakdown 4096  # where a tick's time goes
    .venv/bin/python benchmarks/bench_gpu_impl.py --lines 4096   # the same, per source line
    .venv/bin/python benchmarks/bench_gpu_impl.py --profile 4096  # the torch profiler's top ops
    .venv/bin/python benchmarks/bench_gpu_impl.py --cache-aware 8  # with vLLM 0.34.0's reorder
    .venv/bin/python benchmarks/bench_gpu_impl.py --clock wall     # wall seconds, not CPU ones

On the CPU the run first keeps freed memory in the process
(gpu_impl.cpu_allocator.retain_freed_memory): glibc otherwise unmaps every
large temporary on free and page-faults it back in on the next step.

The numbers are for reading, never for asserting: nothing here checks a time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import platform
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

import schedspec.gpu_impl.admission as admission
import schedspec.gpu_impl.engine as engine_module
import schedspec.gpu_impl.running_phase as running_phase
import schedspec.gpu_impl.step_plan as step_plan
from schedspec.adapters.reference import reference_engine
from schedspec.campaign.swarm_trace import SwarmRun, drive, record_instance
from schedspec.gpu_impl.batch_state import EMPTY, RUNNING
from schedspec.gpu_impl.cpu_allocator import retain_freed_memory
from schedspec.gpu_impl.engine import BatchedScheduler, NewRequests
from schedspec.gpu_impl.swarm_workload import SwarmWorkload, WorkloadShape
from schedspec.reference import Scheduler
from schedspec.spec import ModelRunnerOutput, Request, SchedulerConfig

WORKLOAD = SwarmRun(
    SchedulerConfig(
        block_size=16,
        num_blocks=256,
        max_num_batched_tokens=256,
        max_num_seqs=16,
        max_model_len=256,
        long_prefill_token_threshold=64,
        enable_prefix_caching=True,
        watermark=0.05,
        num_speculative_tokens=2,
    ),
    seed=7,
    shape=WorkloadShape(add_chance=512, max_new_tokens=24),
    slots=24,
)


# Instances the reference steps to measure its rate (see the module docstring).
REFERENCE_INSTANCES = 64


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# The clock both rates are measured on (main sets it from --clock): CPU seconds of this
# process on the CPU, wall seconds where a GPU runs the kernels.
clock: Callable[[], float] = time.process_time


def swarm(
    run: SwarmRun, batch: int, device: torch.device
) -> tuple[BatchedScheduler, SwarmWorkload]:
    """B instances of the run's workload, on tensors that widen on demand (as swarm mode's)."""
    engine = BatchedScheduler(
        run.config, batch=batch, slots=run.slots, device=device, start_width=1
    )
    return engine, SwarmWorkload(engine, run.seed, torch.arange(batch), run.shape)


def gpu_rate(
    run: SwarmRun, batch: int, warm: int, ticks: int, device: torch.device
) -> tuple[float, float, str]:
    """(instance-steps/s, mean running requests per instance, the GPU's busy share) over
    `ticks` ticks after `warm` ticks of filling up."""
    engine, workload = swarm(run, batch, device)
    for _ in range(warm):
        workload.tick()
    sync(device)
    running = torch.zeros((), dtype=torch.int64, device=device)
    started = clock()
    for _ in range(ticks):
        workload.tick()
        running += (engine.state.status == RUNNING).sum()
    busy = gpu_busy(device)
    sync(device)
    seconds = clock() - started
    return batch * ticks / seconds, int(running) / (ticks * batch), busy


def gpu_busy(device: torch.device) -> str:
    """The share of the last sampling period (up to a second, by NVML) in which a kernel
    ran on the GPU, read before the final sync: "-" on the CPU or without NVML."""
    if device.type != "cuda":
        return "-"
    try:
        return f"{torch.cuda.utilization(device)}%"
    except Exception:  # NVML missing or refused: the figure is optional
        return "?"


def reference_rate(run: SwarmRun, instances: int, warm: int, ticks: int) -> float:
    """Instance-steps/s of the reference on the same instances' ticks warm..warm+ticks."""
    traces = [record_instance(run, i, warm + ticks) for i in range(instances)]
    seconds = 0.0
    for trace in traces:
        steps = drive(reference_engine(run.config), trace)
        for _ in range(warm):
            next(steps)
        started = clock()
        for _ in steps:
            pass
        seconds += clock() - started
    return instances * ticks / seconds


# ---------------------------------------------------------- one big instance


def decode_config(running: int) -> SchedulerConfig:
    return SchedulerConfig(
        block_size=16,
        num_blocks=running * 4,
        max_num_batched_tokens=running * 64,
        max_num_seqs=running,
        max_model_len=1024,
        enable_prefix_caching=True,
    )


PROMPT = 32


def gpu_step_time(running: int, steps: int, device: torch.device) -> float:
    config = decode_config(running)
    engine = BatchedScheduler(config, batch=1, slots=running, device=device)
    one = torch.zeros(1, dtype=torch.int64, device=device)
    for i in range(running):
        prompt = torch.arange(PROMPT, device=device).unsqueeze(0) + i * PROMPT
        engine.add_requests(
            NewRequests(
                one, one + i, prompt, one + PROMPT, one + 900, one - 1, one.view(1, 1) - 1, one
            )
        )

    def step() -> None:
        plan = engine.schedule()
        count = (plan.scheduled > 0).long()
        tokens = torch.full((1, running, 3), 5, dtype=torch.int64, device=device)
        engine.update_from_output(tokens, count, plan.num_drafts, plan.rank, plan.scheduled)

    step()  # every prompt prefills in the first step
    assert int((engine.state.status == EMPTY).sum()) == 0
    return _time_steps(step, steps, device)


def reference_step_time(running: int, steps: int) -> float:
    config = decode_config(running)
    scheduler = Scheduler(config)
    for i in range(running):
        prompt = list(range(i * PROMPT, (i + 1) * PROMPT))
        scheduler.add_request(Request(f"r{i}", prompt, max_tokens=900))

    def step() -> None:
        output = scheduler.schedule()
        sampled = {rid: [5] for rid in output.num_scheduled_tokens}
        scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids=sampled))

    step()
    return _time_steps(step, steps, torch.device("cpu"))


def _time_steps(step: Callable[[], None], steps: int, device: torch.device) -> float:
    sync(device)
    started = clock()
    for _ in range(steps):
        step()
    sync(device)
    return (clock() - started) / steps


# ---------------------------------------------------------- where a tick goes

# (owner, attribute, label): the engine's entry points, its phases and the block moves
# inside them (nested: a phase's time includes its moves), and the workload's events
# (which include the engine calls they make).
TIMED: list[tuple[Any, str, str]] = [
    (BatchedScheduler, "schedule", "engine.schedule"),
    (running_phase, "_segment", "  running walk (segments)"),
    (engine_module, "reorder_waiting", "  cache-aware reorder (--cache-aware)"),
    (admission, "_admit_heads", "  admission rounds"),
    (admission, "cached_prefix", "    prefix-cache lookup"),
    (step_plan, "take_free_blocks", "  take_free_blocks (both phases)"),
    (step_plan, "register_blocks", "  register_blocks (both phases)"),
    (BatchedScheduler, "update_from_output", "engine.update_from_output"),
    (engine_module, "release_rows", "  release_rows (the finished)"),
    (BatchedScheduler, "add_requests", "engine.add_requests"),
    (engine_module, "extend_hashes", "  extend_hashes (add and update)"),
    (BatchedScheduler, "finish_requests", "engine.finish_requests (aborts)"),
    (engine_module, "release_tables", "  release_tables (aborts)"),
    (BatchedScheduler, "update_draft_token_ids", "engine.update_draft_token_ids"),
    (SwarmWorkload, "_abort", "workload: abort draws + finish_requests"),
    (SwarmWorkload, "_add", "workload: arrival draws + add_requests"),
    (SwarmWorkload, "_propose", "workload: draft draws + update_draft_token_ids"),
    (SwarmWorkload, "_model", "workload: the model's draws"),
]


def breakdown(run: SwarmRun, batch: int, warm: int, ticks: int, device: torch.device) -> None:
    """CPU time per tick in each entry in TIMED, over `ticks` ticks after `warm`."""
    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in TIMED]

    def timed(function: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            sync(device)
            started = time.process_time()
            result = function(*args, **kwargs)
            sync(device)
            spent[label] += time.process_time() - started
            return result

        return run

    for (owner, name, label), (_, _, function) in zip(TIMED, originals, strict=True):
        setattr(owner, name, timed(function, label))
    try:
        _, workload = swarm(run, batch, device)
        for _ in range(warm):
            workload.tick()
        spent.clear()
        started = time.process_time()
        for _ in range(ticks):
            workload.tick()
        total = time.process_time() - started
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)
    print(f"\nB = {batch}: {total / ticks * 1e3:.1f} ms of CPU time per tick")
    for _, _, label in TIMED:
        print(f"  {spent[label] / ticks * 1e3:7.2f} ms  {label}")


class _LineTimer(TorchFunctionMode):
    """Wall time of each torch call, charged to the innermost gpu_impl source line on
    the Python stack (nested torch calls are charged to the outer one). The mode adds
    a few microseconds per call: shares between lines are what to read."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.spent: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.depth = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if self.depth:
            return func(*args, **(kwargs or {}))
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and "gpu_impl" not in frame.f_code.co_filename:
            frame = frame.f_back
        where = "(outside gpu_impl)"
        if frame is not None:
            name = frame.f_code.co_filename.rsplit("gpu_impl/", 1)[-1]
            where = f"{name}:{frame.f_lineno} {frame.f_code.co_name}"
        self.depth += 1
        started = time.perf_counter()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            sync(self.device)
            self.spent[where] += time.perf_counter() - started
            self.calls[where] += 1
            self.depth -= 1


def lines(
    run: SwarmRun, batch: int, warm: int, ticks: int, device: torch.device, top: int = 30
) -> None:
    """The `top` gpu_impl source lines by time spent in torch calls per tick."""
    _, workload = swarm(run, batch, device)
    for _ in range(warm):
        workload.tick()
    timer = _LineTimer(device)
    with timer:
        for _ in range(ticks):
            workload.tick()
    total = sum(timer.spent.values()) / ticks * 1e3
    print(f"\nB = {batch}: {total:.1f} ms per tick in torch calls (timed one by one)")
    print(f"{'ms/tick':>8} {'calls/tick':>10}  line")
    ranked = sorted(timer.spent.items(), key=lambda item: -item[1])
    for where, seconds in ranked[:top]:
        print(f"{seconds / ticks * 1e3:>8.2f} {timer.calls[where] / ticks:>10.1f}  {where}")


def profile_ops(
    run: SwarmRun, batch: int, warm: int, ticks: int, device: torch.device, top: int = 20
) -> None:
    """The torch profiler's view of a tick with B instances: the aten ops by self CPU
    time, with their calls per tick, and the CPU time of the same ticks run without the
    profiler (which adds a few microseconds per op: read the shares, not the sums)."""
    from torch.profiler import ProfilerActivity, profile

    _, workload = swarm(run, batch, device)
    for _ in range(warm):
        workload.tick()
    sync(device)
    started = time.process_time()
    for _ in range(ticks):
        workload.tick()
    sync(device)
    plain = (time.process_time() - started) / ticks
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiled:
        for _ in range(ticks):
            workload.tick()
        sync(device)
    events = [e for e in profiled.key_averages() if e.key.startswith("aten::")]
    events.sort(key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)  # microseconds
    calls = sum(e.count for e in events)
    print(f"\nB = {batch}: {plain * 1e3:.1f} ms of CPU time per tick without the profiler")
    print(f"profiled: {total / ticks / 1e3:.1f} ms per tick in {calls / ticks:,.0f} aten ops")
    print("(calls per tick count ops called inside other ops too; self time does not)")
    print(f"{'self ms/tick':>12} {'share':>6} {'calls/tick':>10} {'us/call':>8}  op")
    for event in events[:top]:
        per_tick = event.self_cpu_time_total / ticks / 1e3
        share = event.self_cpu_time_total / total
        per_call = event.self_cpu_time_total / event.count
        row = f"{per_tick:>12.2f} {share:>6.1%} {event.count / ticks:>10.1f} {per_call:>8.1f}"
        print(f"{row}  {event.key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda [default: cpu]")
    parser.add_argument("--quick", action="store_true", help="a smoke run (seconds)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads [default: 1, like the reference]"
    )
    parser.add_argument("--batches", help="comma-separated B values [default: 1,64,1024,4096]")
    parser.add_argument("--ticks", type=int, help="timed ticks per B [default: 15; 5 with --quick]")
    parser.add_argument(
        "--malloc-default",
        action="store_true",
        help="leave glibc's malloc thresholds alone (measures what the tuning buys)",
    )
    parser.add_argument(
        "--breakdown",
        type=int,
        metavar="B",
        help="only print where a tick's time goes with B instances",
    )
    parser.add_argument(
        "--lines",
        type=int,
        metavar="B",
        help="only print the gpu_impl source lines that take the most time with B instances",
    )
    parser.add_argument(
        "--profile",
        type=int,
        metavar="B",
        help="only print the torch profiler's aten ops that take the most time with B instances",
    )
    parser.add_argument(
        "--cache-aware",
        type=int,
        default=0,
        metavar="WINDOW",
        help="run the workload with cache-aware admission, this window and a threshold of 0 "
        "(the reorder engaged whatever the usage: its cost at its most) [default: off]",
    )
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        help="what the rates count: this process's CPU seconds or wall seconds "
        "[default: cpu on the CPU, wall with --device cuda]",
    )
    args = parser.parse_args()
    global clock
    device = torch.device(args.device)
    clock_name = args.clock or ("cpu" if device.type == "cpu" else "wall")
    clock = time.process_time if clock_name == "cpu" else time.perf_counter
    run = WORKLOAD
    if args.cache_aware:
        config = dataclasses.replace(
            WORKLOAD.config,
            cache_aware_admission_window=args.cache_aware,
            cache_aware_admission_threshold=0.0,
        )
        run = dataclasses.replace(WORKLOAD, config=config)
    torch.set_num_threads(args.threads)
    retained = False if args.malloc_default else retain_freed_memory()
    batches: tuple[int, ...] = (1, 64, 256) if args.quick else (1, 64, 1024, 4096)
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
    warm, ticks = (10, 5) if args.quick else (30, 15)
    ticks = args.ticks or ticks
    print(f"torch {torch.__version__} on {device} ({platform.processor() or platform.machine()})")
    print(f"workload: {run.config}")
    print(f"torch threads: {torch.get_num_threads()}; freed memory retained: {retained}")
    source = "time.process_time" if clock_name == "cpu" else "time.perf_counter"
    print(f"clock: {clock_name} seconds ({source})")
    if args.breakdown:
        breakdown(run, args.breakdown, 30, 10, device)
        return
    if args.lines:
        lines(run, args.lines, 30, 10, device)
        return
    if args.profile:
        profile_ops(run, args.profile, 30, 10, device)
        return
    ref = reference_rate(run, 4 if args.quick else REFERENCE_INSTANCES, warm, ticks)
    print(f"\nreference: {ref:,.0f} instance-steps/s (instances stepped one by one)")
    header = f"{'B':>8} {'gpu_impl inst-steps/s':>22} {'ms/tick':>8} {'x reference':>12}"
    print(f"{header} {'running/inst':>13} {'GPU busy':>9}", flush=True)
    for batch in batches:
        rate, running, busy = gpu_rate(run, batch, warm, ticks, device)
        tick_ms = batch / rate * 1e3
        row = f"{batch:>8} {rate:>22,.0f} {tick_ms:>8.1f} {rate / ref:>11.1f}x {running:>13.1f}"
        print(f"{row} {busy:>9}", flush=True)
    print(f"\n{'running':>8} {'gpu_impl ms/step':>17} {'reference ms/step':>18} {'ratio':>7}")
    for running in (64,) if args.quick else (256, 1024):
        steps = 3 if args.quick else 10
        gpu = gpu_step_time(running, steps, device) * 1e3
        reference = reference_step_time(running, steps) * 1e3
        print(f"{running:>8} {gpu:>17.2f} {reference:>18.2f} {reference / gpu:>6.1f}x")


if __name__ == "__main__":
    main()
