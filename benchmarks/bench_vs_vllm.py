"""Per-step scheduler time: the reference (schedspec.reference.Scheduler) against vLLM's own.

Both engines run the same workloads in one process, and the script prints the
ratio reference / vLLM of their time per step. A step is schedule() +
update_from_output(); only those two calls are timed, in this process's CPU time
(time.process_time_ns: other jobs on a shared machine then disturb the ratios less
than they disturb wall time; each read of that clock costs about a microsecond,
which adds to the faster engine's step more, so the reference's ratio errs high), or
in wall time with --clock wall (time.perf_counter_ns).

- vLLM 0.33.0's Scheduler is driven directly, not through the adapter
  (VllmEngine translates every step to and from the spec's types and keeps a
  hash map for snapshots: work vLLM's engine never does). It is built by the
  adapter's `build_scheduler` (CPU, a tiny local config.json, no weights); its
  requests are vLLM Requests, and its model output is a vLLM-native
  ModelRunnerOutput built outside the timed region from the same fake model
  (FakeModel.token_at), so both engines see the same tokens.
- The reference is driven as benchmarks/bench_reference.py drives it
  (its `timed_step`, FakeModel.execute untimed).

Part A, steady-state decode with 256 and 1024 running requests (the setup of
bench_reference.py's decode-256 / decode-1024 cases): the median step. The
four cases are timed round-robin, in blocks of steps, so that a noisy machine
slows all of them alike.

Part B, the mixed workload of bench_reference.py (2000 requests, prompts
100-2000, outputs 10-500, 4096 blocks of 16, budget 2048, max_num_seqs 256,
max_model_len 4096, prefix caching off) run to completion by each engine:
total scheduler time, steps, and a check that both scheduled the same steps
(each step's requests and token counts, in order; preemptions). Each engine
runs it 3 times, alternating; the fastest run counts.

gc stays on; after the warm-up the heap is frozen (gc.freeze) and vLLM's
environment lookups cached, as vLLM's EngineCore does after start-up. In part
A all four cases live at once, so a full collection that one engine's
allocations trigger also scans the other's objects: the p99 column shows
those pauses, the median (the measure) does not.

Part C, async scheduling (vLLM's default): the steady decode of part A with
async_scheduling on, each engine built for it (vLLM's AsyncScheduler, the
reference in its async mode) and driven as vLLM's engine core drives it, a
batch queue of two (schedspec.engines.pipeline.BatchQueue): every engine
step schedules the next batch before the oldest one's output lands. A step is
one schedule() and the update_from_output() of the step that lands with it.
It runs in several rounds, round-robin across cases and engines; each round
gives a median step per engine and their ratio, and the median of the rounds'
ratios is the measure.

The target (the issue): the reference takes at most 0.5x vLLM's time per step, and
0.3x on the mixed workload (issue 35).
The numbers are for reading, never for asserting: nothing here fails on a time.

    .venv/bin/python benchmarks/bench_vs_vllm.py            # default (about 1 min)
    .venv/bin/python benchmarks/bench_vs_vllm.py --quick    # smoke run (seconds)

vLLM must be importable: install it with scripts/install_vllm.sh VENV_DIR.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench_reference import (
    DECODE_PROMPT_LEN,
    VOCAB_SIZE,
    RequestSpec,
    build_decode_case,
    make_mixed_workload,
    mixed_config,
    percentile,
    set_step_clock,
    step_clock,
    timed_step,
    us,
)

from schedspec.adapters.vllm.config import build_scheduler
from schedspec.adapters.vllm.runtime import (
    INSTALL_STEP,
    Vllm,
    vllm_available,
    vllm_runner_output,
)
from schedspec.adapters.vllm.runtime import load_vllm as load_adapter_names
from schedspec.engines.fake_model import FakeModel
from schedspec.engines.pipeline import BatchQueue
from schedspec.reference import Scheduler
from schedspec.spec import Request, SchedulerConfig

TARGET_RATIO = 0.5  # reference time per step / vLLM time per step, at most
# Issue 35's target for the mixed workload, where update_from_output made the gap.
MIXED_TARGET_RATIO = 0.3
MODEL_SEED = 1  # the fake model's seed on the mixed workload (bench_reference's)


# ----------------------------------------------------------------- vLLM names


@dataclass(frozen=True)
class VllmNames:
    """The vLLM classes the benchmark builds (Any: vLLM ships no type stubs)."""

    Request: Any
    SamplingParams: Any
    enable_envs_cache: Any
    # The adapter's names: its runner output follows the installed release's fields.
    adapter: Vllm
    version: str


def load_vllm() -> VllmNames:
    """vLLM's names, or exit with how to install it."""
    # find_spec first: where vLLM is absent, do not import torch just to learn that.
    if importlib.util.find_spec("vllm") is None or not vllm_available():
        print(
            f"bench_vs_vllm: vLLM cannot be imported by {sys.executable}.\n"
            f"Install it into a venv with `{INSTALL_STEP}` (e.g. scripts/install_vllm.sh "
            ".venv, the README's venv), install schedspec there (VENV_DIR/bin/pip install -e .), "
            "and run this script with VENV_DIR/bin/python.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return VllmNames(
        Request=importlib.import_module("vllm.v1.request").Request,
        SamplingParams=importlib.import_module("vllm.sampling_params").SamplingParams,
        enable_envs_cache=importlib.import_module("vllm.envs").enable_envs_cache,
        version=str(importlib.import_module("vllm").__version__),
        adapter=load_adapter_names(),
    )


# ------------------------------------------------------------ the vLLM engine


@dataclass
class VllmStep:
    schedule_ns: int
    update_ns: int
    num_scheduled_tokens: dict[str, int]
    total_tokens: int
    num_new: int
    num_preempted: int
    num_finished: int

    @property
    def total_ns(self) -> int:
        return self.schedule_ns + self.update_ns


class VllmDriver:
    """vLLM's Scheduler, its requests and a vLLM-native fake model runner."""

    def __init__(self, v: VllmNames, config: SchedulerConfig, model_seed: int) -> None:
        if config.enable_prefix_caching:
            raise ValueError("this benchmark runs vLLM with prefix caching off")
        self.v = v
        self.scheduler: Any = build_scheduler(config)
        self.model = FakeModel(seed=model_seed, vocab_size=VOCAB_SIZE)
        self.num_arrivals = 0

    def add_request(self, request_id: str, prompt: Sequence[int], max_tokens: int) -> None:
        vllm_request = self.v.Request(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            sampling_params=self.v.SamplingParams(max_tokens=max_tokens),
            pooling_params=None,
            arrival_time=float(self.num_arrivals),
        )
        self.scheduler.add_request(vllm_request)
        self.num_arrivals += 1

    def model_output(self, scheduler_output: Any) -> Any:
        """What the model runner returns for a step just scheduled: one token per request
        whose step is not a prefill chunk (vLLM's is_prefill_chunk, which schedule() has
        just set), none for a chunk. The token is the fake model's at the position it
        samples (after the known tokens and the outputs still in flight before this
        step), as for the reference."""
        requests = self.scheduler.requests
        token_at = self.model.token_at
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            r = requests[rid]
            # schedule() counted this step's output among the placeholders (async).
            position = r.num_tokens + max(r.num_output_placeholders - 1, 0)
            sampled.append([] if r.is_prefill_chunk else [token_at(rid, position)])
        return vllm_runner_output(self.v.adapter, req_ids, sampled)

    def step(self) -> VllmStep:
        """One engine iteration; only schedule() and update_from_output() are timed."""
        clock = step_clock()
        scheduler = self.scheduler
        t0 = clock()
        out = scheduler.schedule()
        t1 = clock()
        runner_output = self.model_output(out)  # untimed: the "GPU"
        t2 = clock()
        scheduler.update_from_output(out, runner_output)
        t3 = clock()
        return VllmStep(
            schedule_ns=t1 - t0,
            update_ns=t3 - t2,
            num_scheduled_tokens=out.num_scheduled_tokens,
            total_tokens=out.total_num_scheduled_tokens,
            num_new=len(out.scheduled_new_reqs),
            num_preempted=len(out.preempted_req_ids or ()),
            num_finished=len(out.finished_req_ids),
        )

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.has_unfinished_requests())


# ------------------------------------------------------- part A: steady decode


@dataclass
class StepTimes:
    step_ns: list[int] = field(default_factory=list)
    schedule_ns: list[int] = field(default_factory=list)
    update_ns: list[int] = field(default_factory=list)

    def add(self, schedule_ns: int, update_ns: int) -> None:
        self.step_ns.append(schedule_ns + update_ns)
        self.schedule_ns.append(schedule_ns)
        self.update_ns.append(update_ns)

    def median_ns(self) -> float:
        return statistics.median(self.step_ns)


@dataclass
class DecodePair:
    """The same steady-decode case on both engines."""

    name: str
    num_decoding: int
    reference: Scheduler
    ref_model: FakeModel
    vllm: VllmDriver
    ref_times: StepTimes = field(default_factory=StepTimes)
    vllm_times: StepTimes = field(default_factory=StepTimes)


def build_decode_pair(
    v: VllmNames, name: str, num_decoding: int, num_steps: int, seed: int
) -> DecodePair:
    """bench_reference's decode case, and vLLM given the same config and requests."""
    case = build_decode_case(name, num_decoding, num_steps, seed=seed)
    config = case.scheduler.config
    driver = VllmDriver(v, config, model_seed=seed)
    rng = random.Random(seed)  # the prompts build_decode_case drew
    for i in range(num_decoding):
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(DECODE_PROMPT_LEN)]
        driver.add_request(f"{name}-{i}", prompt, config.max_model_len)
    for _ in range(10 * DECODE_PROMPT_LEN):
        driver.step()
        running = driver.scheduler.running
        if len(running) == num_decoding and all(r.num_output_tokens > 0 for r in running):
            break
    else:
        raise RuntimeError(f"{name}: vLLM did not reach steady decode")
    return DecodePair(name, num_decoding, case.scheduler, case.model, driver)


def run_decode_block(pair: DecodePair, engine: str, num_steps: int, record: bool) -> None:
    n = pair.num_decoding
    for _ in range(num_steps):
        if engine == "reference":
            sample = timed_step(pair.reference, pair.ref_model)
            out = sample.output
            steady = not (
                out.preempted_req_ids
                or out.scheduled_new_reqs
                or out.finished_req_ids
                or len(out.num_scheduled_tokens) != n
                or out.total_num_scheduled_tokens != n
            )
            schedule_ns, update_ns, times = sample.schedule_ns, sample.update_ns, pair.ref_times
        else:
            step = pair.vllm.step()
            steady = not (
                step.num_preempted
                or step.num_new
                or step.num_finished
                or len(step.num_scheduled_tokens) != n
                or step.total_tokens != n
            )
            schedule_ns, update_ns, times = step.schedule_ns, step.update_ns, pair.vllm_times
        if not steady:
            raise RuntimeError(f"{pair.name} ({engine}): left steady decode")
        if record:
            times.add(schedule_ns, update_ns)


def bench_decode(
    v: VllmNames, sizes: Sequence[int], warmup: int, timed: int, block: int
) -> list[DecodePair]:
    pairs = [
        build_decode_pair(v, f"decode-{n}", n, warmup + timed, seed) for seed, n in enumerate(sizes)
    ]
    for pair in pairs:
        for engine in ("reference", "vllm"):
            run_decode_block(pair, engine, warmup, record=False)
    gc.collect()
    done = 0
    while done < timed:
        n = min(block, timed - done)
        for pair in pairs:  # round-robin: noise hits every case alike
            for engine in ("reference", "vllm"):
                run_decode_block(pair, engine, n, record=True)
        done += n
    return pairs


def report_decode(pairs: list[DecodePair]) -> list[tuple[str, float]]:
    print("A. Steady-state decode (1 token per request per step; step = schedule + update)")
    header = (
        f"  {'case':<13}{'engine':<11}{'steps':>6}{'median us':>11}{'p99 us':>9}"
        f"{'sched us':>10}{'update us':>11}{'us/req':>8}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    ratios: list[tuple[str, float]] = []
    for p in pairs:
        for engine, t in (("reference", p.ref_times), ("vLLM", p.vllm_times)):
            print(
                f"  {p.name:<13}{engine:<11}{len(t.step_ns):>6}{us(t.median_ns()):>11}"
                f"{us(percentile(sorted(t.step_ns), 99)):>9}"
                f"{us(statistics.median(t.schedule_ns)):>10}"
                f"{us(statistics.median(t.update_ns)):>11}"
                f"{t.median_ns() / p.num_decoding / 1e3:>8.2f}"
            )
    print()
    print("  Ratios reference / vLLM (same run):")
    for p in pairs:
        r, vl = p.ref_times, p.vllm_times
        ratio = r.median_ns() / vl.median_ns()
        schedule = statistics.median(r.schedule_ns) / statistics.median(vl.schedule_ns)
        update = statistics.median(r.update_ns) / statistics.median(vl.update_ns)
        print(
            f"    {p.name:<13} median step {ratio:.2f}  "
            f"(median schedule {schedule:.2f}, median update {update:.2f})"
        )
        ratios.append((f"{p.name} median step", ratio))
    print()
    return ratios


# ------------------------------------------------------ part B: mixed workload


@dataclass
class MixedRun:
    """One engine's run of the mixed workload to completion."""

    engine: str
    schedule_ns: list[int] = field(default_factory=list)
    update_ns: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)  # per step, total scheduled
    # per step, the tokens scheduled per request, in scheduling order
    step_scheduled: list[Mapping[str, int]] = field(default_factory=list)
    preemptions: int = 0

    def add(
        self, schedule_ns: int, update_ns: int, tokens: int, scheduled: Mapping[str, int]
    ) -> None:
        self.schedule_ns.append(schedule_ns)
        self.update_ns.append(update_ns)
        self.step_tokens.append(tokens)
        self.step_scheduled.append(scheduled)

    @property
    def request_steps(self) -> int:
        return sum(len(scheduled) for scheduled in self.step_scheduled)

    @property
    def steps(self) -> int:
        return len(self.schedule_ns)

    @property
    def total_ns(self) -> int:
        return sum(self.schedule_ns) + sum(self.update_ns)

    def step_ns(self) -> list[int]:
        return [s + u for s, u in zip(self.schedule_ns, self.update_ns, strict=True)]

    def mean_ns(self) -> float:
        return self.total_ns / self.steps

    def median_ns(self) -> float:
        return statistics.median(self.step_ns())


def run_mixed_reference(
    workload: list[RequestSpec], config: SchedulerConfig, max_steps: int
) -> MixedRun:
    scheduler = Scheduler(config)
    model = FakeModel(seed=MODEL_SEED, vocab_size=VOCAB_SIZE)
    for spec in workload:
        scheduler.add_request(Request(spec.request_id, spec.prompt, spec.max_tokens))
    gc.collect()
    run = MixedRun("reference")
    while scheduler.has_unfinished_requests():
        if run.steps >= max_steps:
            raise RuntimeError(f"reference: not finished after {max_steps} steps")
        sample = timed_step(scheduler, model)
        out = sample.output
        run.add(
            sample.schedule_ns,
            sample.update_ns,
            out.total_num_scheduled_tokens,
            out.num_scheduled_tokens,
        )
        run.preemptions += len(out.preempted_req_ids)
    return run


def run_mixed_vllm(
    v: VllmNames, workload: list[RequestSpec], config: SchedulerConfig, max_steps: int
) -> MixedRun:
    driver = VllmDriver(v, config, model_seed=MODEL_SEED)
    for spec in workload:
        driver.add_request(spec.request_id, spec.prompt, spec.max_tokens)
    gc.collect()
    run = MixedRun("vLLM")
    while driver.has_unfinished_requests():
        if run.steps >= max_steps:
            raise RuntimeError(f"vLLM: not finished after {max_steps} steps")
        step = driver.step()
        run.add(step.schedule_ns, step.update_ns, step.total_tokens, step.num_scheduled_tokens)
        run.preemptions += step.num_preempted
    return run


def bench_mixed(
    v: VllmNames, workload: list[RequestSpec], config: SchedulerConfig, rounds: int
) -> tuple[MixedRun, MixedRun]:
    """Each engine `rounds` times, alternating; the fastest run of each."""
    max_steps = 1_000_000
    runners: dict[str, Callable[[], MixedRun]] = {
        "reference": lambda: run_mixed_reference(workload, config, max_steps),
        "vLLM": lambda: run_mixed_vllm(v, workload, config, max_steps),
    }
    best: dict[str, MixedRun] = {}
    for i in range(rounds):
        order = ("reference", "vLLM") if i % 2 == 0 else ("vLLM", "reference")
        for engine in order:
            run = runners[engine]()
            if engine not in best or run.total_ns < best[engine].total_ns:
                best[engine] = run
            gc.collect()
    return best["reference"], best["vLLM"]


def first_difference(ref: MixedRun, vl: MixedRun) -> int | None:
    """The first step at which the engines scheduled different requests or tokens
    (order included), or None if every step matches."""
    a, b = ref.step_scheduled, vl.step_scheduled
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if list(x.items()) != list(y.items()):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def report_mixed(
    ref: MixedRun, vl: MixedRun, num_requests: int, config: SchedulerConfig, rounds: int
) -> tuple[list[tuple[str, float]], bool]:
    print(
        f"B. Mixed workload: {num_requests} requests, prompts 100-2000, outputs 10-500, "
        f"{config.num_blocks} blocks of {config.block_size}, budget "
        f"{config.max_num_batched_tokens}, max_num_seqs {config.max_num_seqs}, max_model_len "
        f"{config.max_model_len}, prefix caching "
        f"{'on' if config.enable_prefix_caching else 'off'}; run to completion "
        f"(fastest of {rounds} run{'s' if rounds > 1 else ''} per engine)"
    )
    header = (
        f"  {'engine':<11}{'steps':>7}{'sched tokens':>14}{'req-steps':>11}{'preempt':>9}"
        f"{'total s':>9}{'sched s':>9}{'update s':>10}{'mean us':>9}{'median us':>11}"
        f"{'p99 us':>9}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for r in (ref, vl):
        print(
            f"  {r.engine:<11}{r.steps:>7}{sum(r.step_tokens):>14,}{r.request_steps:>11,}"
            f"{r.preemptions:>9}{r.total_ns / 1e9:>9.3f}{sum(r.schedule_ns) / 1e9:>9.3f}"
            f"{sum(r.update_ns) / 1e9:>10.3f}{us(r.mean_ns()):>9}{us(r.median_ns()):>11}"
            f"{us(percentile(sorted(r.step_ns()), 99)):>9}"
        )
    print()
    differ = first_difference(ref, vl)
    same = differ is None and ref.preemptions == vl.preemptions
    per_step = "identical" if differ is None else f"first differ at step {differ}"
    print(
        f"  Same schedule? steps {ref.steps} / {vl.steps}, scheduled tokens "
        f"{sum(ref.step_tokens):,} / {sum(vl.step_tokens):,}, request-steps "
        f"{ref.request_steps:,} / {vl.request_steps:,}, preemptions {ref.preemptions} / "
        f"{vl.preemptions} (reference / vLLM)"
    )
    print(
        f"  Per step, the requests scheduled and their token counts (in order): {per_step}"
        f" -> {'SAME' if same else 'DIFFERENT'}"
    )
    print()
    ratios = [
        ("mixed total time", ref.total_ns / vl.total_ns),
        ("mixed mean step", ref.mean_ns() / vl.mean_ns()),
        ("mixed median step", ref.median_ns() / vl.median_ns()),
    ]
    print("  Ratios reference / vLLM (same run):")
    print(
        f"    total scheduler time {ratios[0][1]:.2f}, mean step {ratios[1][1]:.2f}, "
        f"median step {ratios[2][1]:.2f}  (schedule "
        f"{sum(ref.schedule_ns) / sum(vl.schedule_ns):.2f}, update "
        f"{sum(ref.update_ns) / sum(vl.update_ns):.2f})"
    )
    print()
    return ratios, same


# ------------------------------------------------------- part C: async scheduling


@dataclass
class InFlight:
    """A scheduled batch whose output has not landed: both engines' outputs are
    opaque here (a spec SchedulerOutput, a vLLM one) with the model's answer."""

    output: Any
    answer: Any


class Pipelined:
    """An engine driven as vLLM's engine core drives it under async scheduling: each
    step schedules a batch (when there is anything to schedule), puts it in flight with
    the model's answer (untimed: the "GPU" runs it now), and lands the oldest batch once
    the queue is full or nothing more can be scheduled (pipeline.BatchQueue's rule)."""

    def __init__(
        self,
        config: SchedulerConfig,
        schedule: Callable[[], Any],
        answer: Callable[[Any], Any],
        update: Callable[[Any, Any], object],
        has_requests: Callable[[], bool],
    ) -> None:
        self.queue: BatchQueue[InFlight] = BatchQueue(config)
        self.schedule = schedule
        self.answer = answer
        self.update = update
        self.has_requests = has_requests

    def step(self) -> tuple[int, int, Mapping[str, int]]:
        """One engine step: (schedule ns, update ns, tokens scheduled per request); only
        schedule() and update_from_output() are timed, 0 for a call not made."""
        clock = step_clock()
        schedule_ns = update_ns = 0
        scheduled: Mapping[str, int] = {}
        if self.queue.schedules(self.has_requests()):
            t0 = clock()
            out = self.schedule()
            schedule_ns = clock() - t0
            scheduled = out.num_scheduled_tokens
            executed = out.total_num_scheduled_tokens > 0
            if not self.queue.push(InFlight(out, self.answer(out)), executed, self.has_requests()):
                return schedule_ns, update_ns, scheduled
        if self.queue:
            landing = self.queue.pop()
            t0 = clock()
            self.update(landing.output, landing.answer)
            update_ns = clock() - t0
        return schedule_ns, update_ns, scheduled


def reference_pipeline(config: SchedulerConfig, model_seed: int) -> tuple[Scheduler, Pipelined]:
    scheduler = Scheduler(config)
    model = FakeModel(seed=model_seed, vocab_size=VOCAB_SIZE)
    pipeline = Pipelined(
        config,
        scheduler.schedule,
        model.execute,
        scheduler.update_from_output,
        scheduler.has_unfinished_requests,
    )
    return scheduler, pipeline


def vllm_pipeline(
    v: VllmNames, config: SchedulerConfig, model_seed: int
) -> tuple[VllmDriver, Pipelined]:
    driver = VllmDriver(v, config, model_seed)
    scheduler = driver.scheduler
    pipeline = Pipelined(
        config,
        scheduler.schedule,
        driver.model_output,
        scheduler.update_from_output,
        scheduler.has_requests,
    )
    return driver, pipeline


@dataclass
class AsyncPair:
    """One steady-decode case on both engines, async; per round, each engine's step times."""

    name: str
    num_decoding: int
    reference: Pipelined
    vllm: Pipelined
    ref_rounds: list[StepTimes] = field(default_factory=list)
    vllm_rounds: list[StepTimes] = field(default_factory=list)

    def ratios(self) -> list[float]:
        """Per round: the reference's median step / vLLM's."""
        return [
            r.median_ns() / vl.median_ns()
            for r, vl in zip(self.ref_rounds, self.vllm_rounds, strict=True)
        ]


def build_async_pair(
    v: VllmNames, name: str, num_decoding: int, num_steps: int, seed: int
) -> AsyncPair:
    """Part A's steady-decode config with async scheduling on, both engines brought to
    steady decode under the pipeline; room for num_steps more steps."""
    config = replace(
        build_decode_case(name, num_decoding, num_steps, seed=seed).scheduler.config,
        async_scheduling=True,
    )
    reference, ref_pipeline = reference_pipeline(config, seed)
    driver, vllm_pipeline_ = vllm_pipeline(v, config, seed)
    rng = random.Random(seed)
    for i in range(num_decoding):
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(DECODE_PROMPT_LEN)]
        reference.add_request(Request(f"{name}-{i}", prompt, config.max_model_len))
        driver.add_request(f"{name}-{i}", prompt, config.max_model_len)
    for engine, pipeline, running in (
        ("reference", ref_pipeline, lambda: reference.running),
        ("vLLM", vllm_pipeline_, lambda: driver.scheduler.running),
    ):
        for _ in range(10 * DECODE_PROMPT_LEN):
            pipeline.step()
            if len(running()) == num_decoding and all(r.num_output_tokens > 0 for r in running()):
                break
        else:
            raise RuntimeError(f"{name} ({engine}): did not reach steady decode")
    return AsyncPair(name, num_decoding, ref_pipeline, vllm_pipeline_)


def run_async_block(pair: AsyncPair, engine: str, num_steps: int, times: StepTimes | None) -> None:
    pipeline = pair.reference if engine == "reference" else pair.vllm
    for _ in range(num_steps):
        schedule_ns, update_ns, scheduled = pipeline.step()
        if len(scheduled) != pair.num_decoding or sum(scheduled.values()) != pair.num_decoding:
            raise RuntimeError(f"{pair.name} ({engine}, async): left steady decode")
        if times is not None:
            times.add(schedule_ns, update_ns)


def bench_async(
    v: VllmNames, sizes: Sequence[int], warmup: int, rounds: int, steps: int
) -> list[AsyncPair]:
    total = warmup + rounds * steps
    pairs = [build_async_pair(v, f"async-{n}", n, total, seed) for seed, n in enumerate(sizes)]
    for pair in pairs:
        for engine in ("reference", "vllm"):
            run_async_block(pair, engine, warmup, None)
    gc.collect()
    for _ in range(rounds):
        for pair in pairs:  # round-robin: noise hits every case alike
            ref, vl = StepTimes(), StepTimes()
            run_async_block(pair, "reference", steps, ref)
            run_async_block(pair, "vllm", steps, vl)
            pair.ref_rounds.append(ref)
            pair.vllm_rounds.append(vl)
    return pairs


def report_async(pairs: list[AsyncPair], steps: int) -> list[tuple[str, float]]:
    rounds = len(pairs[0].ref_rounds) if pairs else 0
    print(
        f"C. Async scheduling, steady decode (batch queue of 2; step = schedule + the update "
        f"that lands with it): {rounds} rounds of {steps} steps per engine"
    )
    header = (
        f"  {'case':<13}{'engine':<11}{'median us (of round medians)':>30}"
        f"{'sched us':>10}{'update us':>11}{'us/req':>8}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for p in pairs:
        for engine, runs in (("reference", p.ref_rounds), ("vLLM", p.vllm_rounds)):
            median = statistics.median(t.median_ns() for t in runs)
            schedule = statistics.median(statistics.median(t.schedule_ns) for t in runs)
            update = statistics.median(statistics.median(t.update_ns) for t in runs)
            print(
                f"  {p.name:<13}{engine:<11}{us(median):>30}{us(schedule):>10}{us(update):>11}"
                f"{median / p.num_decoding / 1e3:>8.2f}"
            )
    print()
    print("  Ratios reference / vLLM, per round (median step of each), and their median:")
    ratios: list[tuple[str, float]] = []
    for p in pairs:
        per_round = p.ratios()
        median = statistics.median(per_round)
        listed = " ".join(f"{r:.2f}" for r in per_round)
        print(f"    {p.name:<13} rounds {listed}  -> median {median:.2f}")
        ratios.append((f"{p.name} median step", median))
    print()
    return ratios


# ------------------------------------------------------------------------ main


@dataclass(frozen=True)
class Plan:
    decode_sizes: tuple[int, ...]
    decode_warmup: int
    decode_steps: int
    decode_block: int
    mixed_requests: int
    mixed_rounds: int
    warmup_requests: int
    async_rounds: int
    async_steps: int  # per round, per engine


DEFAULT = Plan(
    decode_sizes=(256, 1024),
    decode_warmup=100,
    decode_steps=1000,
    decode_block=50,
    mixed_requests=2000,
    mixed_rounds=3,
    warmup_requests=150,
    async_rounds=5,
    async_steps=200,
)
QUICK = Plan(
    decode_sizes=(256, 1024),
    decode_warmup=10,
    decode_steps=60,
    decode_block=20,
    mixed_requests=150,
    mixed_rounds=1,
    warmup_requests=20,
    async_rounds=3,
    async_steps=20,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (seconds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mixed workload")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="what a timed call counts: this process's CPU time [cpu], or wall time",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else DEFAULT
    set_step_clock(args.clock)
    v = load_vllm()
    started = time.perf_counter_ns()
    print(
        f"reference vs vLLM {v.version} Scheduler, per-step time "
        f"({'quick' if args.quick else 'default'}); Python {platform.python_version()} "
        f"{platform.machine()}, gc {'on' if gc.isenabled() else 'off'} "
        "(start-up heap frozen, env lookups cached, as vLLM's EngineCore does); "
        f"{args.clock} time, load {os.getloadavg()}"
    )
    print()

    # Warm-up: prefill, decode and preemption paths of both engines, once.
    config = mixed_config(2048, False, 4096)
    warm = make_mixed_workload(plan.warmup_requests, seed=args.seed + 1000)
    bench_mixed(v, warm, config, rounds=1)
    # As vLLM's EngineCore does after start-up, for both engines alike: the heap
    # so far (modules, vLLM's config objects) is left out of gc's oldest
    # generation, and vLLM's environment variables are read once.
    v.enable_envs_cache()
    gc.collect()
    gc.freeze()

    ratios = report_decode(
        bench_decode(v, plan.decode_sizes, plan.decode_warmup, plan.decode_steps, plan.decode_block)
    )
    gc.collect()

    workload = make_mixed_workload(plan.mixed_requests, seed=args.seed)
    ref, vl = bench_mixed(v, workload, config, plan.mixed_rounds)
    mixed_ratios, same = report_mixed(ref, vl, plan.mixed_requests, config, plan.mixed_rounds)
    ratios += mixed_ratios
    gc.collect()

    ratios += report_async(
        bench_async(v, plan.decode_sizes, plan.decode_warmup, plan.async_rounds, plan.async_steps),
        plan.async_steps,
    )

    print(
        f"Target: reference time per step <= {TARGET_RATIO:.2f}x vLLM's "
        f"({MIXED_TARGET_RATIO:.2f}x on the mixed workload)"
    )
    met = True
    for what, ratio in ratios:
        target = MIXED_TARGET_RATIO if what.startswith("mixed") else TARGET_RATIO
        met = met and ratio <= target
        verdict = "met" if ratio <= target else "NOT met"
        print(f"  {what:<27} {ratio:>5.2f}x  <= {target:.2f}x {verdict}")
    print(f"  -> target {'MET' if met else 'NOT MET'} on every measure")
    if not same:
        print("  (the engines did not schedule the mixed workload alike: see part B)")
    print()
    elapsed = (time.perf_counter_ns() - started) / 1e9
    print(f"wall time of the whole benchmark (setup and fake model included): {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
