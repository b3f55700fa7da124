"""Step-time benchmark of the reference scheduler (schedspec.reference.Scheduler).

A step is schedule() + update_from_output(); only those two calls are timed
(time.perf_counter_ns). The model's answer is built outside the timed region
by FakeModel.execute, and drafts (if any) are applied outside it too.

Part A, steady-state decode: N requests, all prefilled, each decoding one
token per step; the KV cache, budget and max_num_seqs are big enough that
nothing is preempted or admitted. N = 256 and N = 1024, plus probes that keep
the scheduled set at 256 and grow what is *not* scheduled (waiting requests,
KV blocks) or turn prefix caching on. Cases are timed round-robin, in blocks
of steps, so that a noisy machine slows all of them alike; the ratios are
taken within the run.

Part B, a mixed workload: prompts of 100-2000 tokens (half of them start with
one of a few shared system prompts), outputs of 10-500 tokens, from a seeded
RNG, run to completion with a budget of 2048 and of 8192 tokens, each with
prefix caching off and on.

    .venv/bin/python benchmarks/bench_reference.py            # default (< ~2 min)
    .venv/bin/python benchmarks/bench_reference.py --quick    # smoke run (seconds)

The numbers are for reading, never for asserting: nothing here checks a time.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schedspec.engines.fake_model import FakeModel
from schedspec.reference import Scheduler
from schedspec.spec import Request, SchedulerConfig, SchedulerOutput

BLOCK_SIZE = 16
VOCAB_SIZE = 32_000


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def percentile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile (q in [0, 100]) of an ascending sequence."""
    if not sorted_values:
        return 0
    rank = max(1, cdiv(int(q * len(sorted_values)), 100))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def us(ns: float) -> str:
    return f"{ns / 1e3:.1f}"


# --------------------------------------------------------------------- stepping


@dataclass
class StepSample:
    schedule_ns: int
    update_ns: int
    output: SchedulerOutput

    @property
    def total_ns(self) -> int:
        return self.schedule_ns + self.update_ns


# The clock the timed calls read: wall time (perf_counter_ns) here; bench_vs_vllm.py
# counts this process's CPU time instead by default (its --clock), so that other jobs
# on a shared machine disturb its ratios less. One clock serves every timed call.
STEP_CLOCKS: dict[str, Callable[[], int]] = {
    "wall": time.perf_counter_ns,
    "cpu": time.process_time_ns,
}
_step_clock: list[Callable[[], int]] = [STEP_CLOCKS["wall"]]


def set_step_clock(name: str) -> None:
    """Time every step from now on with STEP_CLOCKS[name]."""
    _step_clock[0] = STEP_CLOCKS[name]


def step_clock() -> Callable[[], int]:
    """The clock timed steps read (set_step_clock)."""
    return _step_clock[0]


def timed_step(scheduler: Scheduler, model: FakeModel) -> StepSample:
    """One engine iteration; only schedule() and update_from_output() are timed."""
    clock = step_clock()
    t0 = clock()
    scheduler_output = scheduler.schedule()
    t1 = clock()
    model_output = model.execute(scheduler_output)  # untimed: the "GPU"
    t2 = clock()
    scheduler.update_from_output(scheduler_output, model_output)
    t3 = clock()
    drafts = model.propose_drafts(model_output)  # untimed: the drafter
    if drafts:
        scheduler.update_draft_token_ids(drafts)
    return StepSample(t1 - t0, t3 - t2, scheduler_output)


# ------------------------------------------------------- part A: steady decode


@dataclass
class DecodeCase:
    name: str
    num_decoding: int  # running requests, all scheduled every step
    scheduler: Scheduler
    model: FakeModel
    step_ns: list[int] = field(default_factory=list)
    schedule_ns: list[int] = field(default_factory=list)
    update_ns: list[int] = field(default_factory=list)

    def median_ns(self) -> float:
        return statistics.median(self.step_ns)

    def per_request_ns(self) -> float:
        return self.median_ns() / self.num_decoding


DECODE_PROMPT_LEN = 32


def build_decode_case(
    name: str,
    num_decoding: int,
    num_steps: int,
    *,
    extra_waiting: int = 0,
    block_factor: int = 1,
    prefix_caching: bool = False,
    seed: int = 0,
) -> DecodeCase:
    """num_decoding requests brought to steady decode; room for num_steps more steps.

    extra_waiting requests sit in the waiting queue for good (max_num_seqs is
    num_decoding and nothing finishes); block_factor multiplies the KV pool.
    """
    max_model_len = DECODE_PROMPT_LEN + num_steps + 64
    blocks_per_request = cdiv(max_model_len, BLOCK_SIZE)
    config = SchedulerConfig(
        block_size=BLOCK_SIZE,
        num_blocks=num_decoding * blocks_per_request * block_factor,
        # >= num_decoding, with room left so the admission path is entered
        # (and refused by max_num_seqs) every step.
        max_num_batched_tokens=2 * num_decoding,
        max_num_seqs=num_decoding,
        max_model_len=max_model_len,
        enable_prefix_caching=prefix_caching,
    )
    scheduler = Scheduler(config)
    model = FakeModel(seed=seed, vocab_size=VOCAB_SIZE)
    rng = random.Random(seed)
    max_tokens = max_model_len  # capped by max_model_len; never reached in the run
    for i in range(num_decoding + extra_waiting):
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(DECODE_PROMPT_LEN)]
        scheduler.add_request(Request(f"{name}-{i}", prompt, max_tokens))
    # Prefill until every running request has emitted a token: steady decode.
    for _ in range(10 * DECODE_PROMPT_LEN):
        timed_step(scheduler, model)
        running = scheduler.running
        if len(running) == num_decoding and all(r.num_output_tokens > 0 for r in running):
            break
    else:
        raise RuntimeError(f"{name}: did not reach steady decode")
    return DecodeCase(name, num_decoding, scheduler, model)


def run_decode_case_block(case: DecodeCase, num_steps: int, record: bool) -> None:
    for _ in range(num_steps):
        sample = timed_step(case.scheduler, case.model)
        out = sample.output
        # Steady decode: every request one token, nobody admitted, preempted or finished.
        if (
            out.preempted_req_ids
            or out.scheduled_new_reqs
            or out.finished_req_ids
            or len(out.num_scheduled_tokens) != case.num_decoding
            or out.total_num_scheduled_tokens != case.num_decoding
        ):
            raise RuntimeError(f"{case.name}: left steady decode")
        if record:
            case.step_ns.append(sample.total_ns)
            case.schedule_ns.append(sample.schedule_ns)
            case.update_ns.append(sample.update_ns)


@dataclass(frozen=True)
class DecodeSpec:
    name: str
    num_decoding: int
    extra_waiting: int = 0
    block_factor: int = 1
    prefix_caching: bool = False


DECODE_SPECS = (
    DecodeSpec("decode-256", 256),
    DecodeSpec("decode-1024", 1024),
    # Same scheduled set as decode-256; more that is not scheduled.
    DecodeSpec("decode-256 +4096 waiting", 256, extra_waiting=4096),
    DecodeSpec("decode-256 x16 KV blocks", 256, block_factor=16),
    DecodeSpec("decode-256 prefix caching", 256, prefix_caching=True),
)


def bench_decode(warmup_steps: int, timed_steps: int, block: int) -> list[DecodeCase]:
    cases = [
        build_decode_case(
            spec.name,
            spec.num_decoding,
            warmup_steps + timed_steps,
            extra_waiting=spec.extra_waiting,
            block_factor=spec.block_factor,
            prefix_caching=spec.prefix_caching,
            seed=seed,
        )
        for seed, spec in enumerate(DECODE_SPECS)
    ]
    for case in cases:
        run_decode_case_block(case, warmup_steps, record=False)
    gc.collect()
    done = 0
    while done < timed_steps:
        n = min(block, timed_steps - done)
        for case in cases:  # round-robin: noise hits every case alike
            run_decode_case_block(case, n, record=True)
        done += n
    return cases


def report_decode(cases: list[DecodeCase]) -> None:
    print("A. Steady-state decode (1 token per request per step; step = schedule + update)")
    header = (
        f"  {'case':<27}{'reqs':>6}{'steps':>7}{'median us':>11}{'p99 us':>9}"
        f"{'sched us':>10}{'update us':>11}{'us/req':>8}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for c in cases:
        ordered = sorted(c.step_ns)
        print(
            f"  {c.name:<27}{c.num_decoding:>6}{len(c.step_ns):>7}"
            f"{us(c.median_ns()):>11}{us(percentile(ordered, 99)):>9}"
            f"{us(statistics.median(c.schedule_ns)):>10}{us(statistics.median(c.update_ns)):>11}"
            f"{c.per_request_ns() / 1e3:>8.2f}"
        )
    by_name = {c.name: c for c in cases}
    base = by_name["decode-256"]
    big = by_name["decode-1024"]
    print()
    print("  Ratios (same run):")
    print(
        f"    median step, decode-1024 / decode-256              = "
        f"{big.median_ns() / base.median_ns():.2f}   (4.00 if a step is O(scheduled requests))"
    )
    print(
        f"    per-request cost, decode-1024 / decode-256         = "
        f"{big.per_request_ns() / base.per_request_ns():.2f}   (1.00 if O(scheduled requests))"
    )
    for name, what in (
        ("decode-256 +4096 waiting", "1.00 if independent of waiting requests"),
        ("decode-256 x16 KV blocks", "1.00 if independent of the number of blocks"),
        ("decode-256 prefix caching", "the cost of prefix-cache bookkeeping"),
    ):
        ratio = by_name[name].median_ns() / base.median_ns()
        print(f"    median step, {name:<25} / decode-256 = {ratio:.2f}   ({what})")
    print()


# ------------------------------------------------------ part B: mixed workload


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int


def make_mixed_workload(num_requests: int, seed: int) -> list[RequestSpec]:
    """Prompts 100-2000 tokens, outputs 10-500 tokens; half share a system prompt.

    A shared prompt is one of 8 fixed token sequences of 256-1024 tokens; a
    request that uses one takes up to half its prompt from it and the rest
    is its own, so prefix-cache hits are partial and of varied length.
    """
    rng = random.Random(seed)
    shared = [[rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(256, 1024))] for _ in range(8)]
    specs: list[RequestSpec] = []
    for i in range(num_requests):
        prompt_len = rng.randint(100, 2000)
        prefix: list[int] = []
        if rng.random() < 0.5:
            source = rng.choice(shared)
            prefix = source[: min(len(source), prompt_len // 2)]
        own = [rng.randrange(VOCAB_SIZE) for _ in range(prompt_len - len(prefix))]
        specs.append(RequestSpec(f"r{i}", tuple(prefix + own), rng.randint(10, 500)))
    return specs


@dataclass
class MixedResult:
    label: str
    budget: int
    prefix_caching: bool
    num_blocks: int
    step_ns: list[int]
    scheduled_tokens: int
    scheduled_request_steps: int
    preemptions: int
    full_budget_steps: int  # steps that used the whole token budget
    prefix_hit_rate: float

    @property
    def total_ns(self) -> int:
        return sum(self.step_ns)

    def median_ns(self) -> float:
        return statistics.median(self.step_ns)

    def p99_ns(self) -> int:
        return percentile(sorted(self.step_ns), 99)

    def tokens_per_s(self) -> float:
        return self.scheduled_tokens / (self.total_ns / 1e9)

    def ns_per_scheduled_request(self) -> float:
        return self.total_ns / self.scheduled_request_steps


def mixed_config(budget: int, prefix_caching: bool, num_blocks: int) -> SchedulerConfig:
    return SchedulerConfig(
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=256,
        max_model_len=4096,
        enable_prefix_caching=prefix_caching,
    )


def run_mixed(
    label: str,
    workload: list[RequestSpec],
    budget: int,
    prefix_caching: bool,
    num_blocks: int,
    max_steps: int = 1_000_000,
) -> MixedResult:
    """Add every request up front, then step until all have finished."""
    scheduler = Scheduler(mixed_config(budget, prefix_caching, num_blocks))
    model = FakeModel(seed=1, vocab_size=VOCAB_SIZE)
    for spec in workload:
        scheduler.add_request(Request(spec.request_id, spec.prompt, spec.max_tokens))
    gc.collect()
    step_ns: list[int] = []
    tokens = request_steps = preemptions = full_budget_steps = 0
    while scheduler.has_unfinished_requests():
        if len(step_ns) >= max_steps:
            raise RuntimeError(f"{label}: not finished after {max_steps} steps")
        sample = timed_step(scheduler, model)
        out = sample.output
        step_ns.append(sample.total_ns)
        tokens += out.total_num_scheduled_tokens
        request_steps += len(out.num_scheduled_tokens)
        preemptions += len(out.preempted_req_ids)
        full_budget_steps += out.total_num_scheduled_tokens == budget
    kv = scheduler.kv_cache_manager
    hit_rate = kv.prefix_cache_hits / kv.prefix_cache_queries if kv.prefix_cache_queries else 0.0
    return MixedResult(
        label=label,
        budget=budget,
        prefix_caching=prefix_caching,
        num_blocks=num_blocks,
        step_ns=step_ns,
        scheduled_tokens=tokens,
        scheduled_request_steps=request_steps,
        preemptions=preemptions,
        full_budget_steps=full_budget_steps,
        prefix_hit_rate=hit_rate,
    )


def report_mixed(results: list[MixedResult], num_requests: int) -> None:
    print(
        f"B. Mixed workload: {num_requests} requests, prompts 100-2000, outputs 10-500 "
        f"(half share one of 8 system prompts), block_size {BLOCK_SIZE}, max_num_seqs 256, "
        "max_model_len 4096; run to completion"
    )
    header = (
        f"  {'blocks':>6}{'budget':>7} {'caching':<8}{'steps':>7}{'reqs/step':>10}"
        f"{'median us':>11}{'p99 us':>9}{'total s':>9}{'preempt':>9}{'sched tok/s':>13}"
        f"{'us/sched req':>14}{'full %':>8}{'hit %':>7}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    print(
        "  (reqs/step: requests scheduled per step; full %: steps that used the whole budget; "
        "hit %: tokens looked up at admission that hit the prefix cache)"
    )
    for r in results:
        print(
            f"  {r.num_blocks:>6}{r.budget:>7} {'on' if r.prefix_caching else 'off':<8}"
            f"{len(r.step_ns):>7}{r.scheduled_request_steps / len(r.step_ns):>10.1f}"
            f"{us(r.median_ns()):>11}{us(r.p99_ns()):>9}{r.total_ns / 1e9:>9.3f}"
            f"{r.preemptions:>9}{r.tokens_per_s():>13,.0f}"
            f"{r.ns_per_scheduled_request() / 1e3:>14.2f}"
            f"{100 * r.full_budget_steps / len(r.step_ns):>8.1f}{100 * r.prefix_hit_rate:>7.1f}"
        )
    by_key = {(r.num_blocks, r.budget, r.prefix_caching): r for r in results}
    print()
    print("  Ratios (same run):")
    for blocks in sorted({r.num_blocks for r in results}):
        small, large = by_key.get((blocks, 2048, False)), by_key.get((blocks, 8192, False))
        if small is not None and large is not None:
            print(
                f"    {blocks} blocks, caching off, budget 8192 / 2048: median step "
                f"{large.median_ns() / small.median_ns():.2f}, total "
                f"{large.total_ns / small.total_ns:.2f}, us/sched req "
                f"{large.ns_per_scheduled_request() / small.ns_per_scheduled_request():.2f}"
            )
        for budget in sorted({r.budget for r in results}):
            off, on = by_key.get((blocks, budget, False)), by_key.get((blocks, budget, True))
            if off is None or on is None:
                continue
            per_token_on = on.total_ns / on.scheduled_tokens
            per_token_off = off.total_ns / off.scheduled_tokens
            print(
                f"    {blocks} blocks, budget {budget}, caching on / off: median step "
                f"{on.median_ns() / off.median_ns():.2f}, total "
                f"{on.total_ns / off.total_ns:.2f}, us/sched req "
                f"{on.ns_per_scheduled_request() / off.ns_per_scheduled_request():.2f}, "
                f"ns/sched token {per_token_on / per_token_off:.2f}"
            )
    print()


# ------------------------------------------------------------------------ main


@dataclass(frozen=True)
class Plan:
    decode_warmup: int
    decode_steps: int
    decode_block: int
    mixed_requests: int
    mixed_blocks: tuple[int, ...]
    warmup_requests: int


DEFAULT = Plan(
    decode_warmup=100,
    decode_steps=600,
    decode_block=50,
    mixed_requests=2000,
    # 4096 blocks: KV binds (~50 requests run at once); 16384: ~4x as many run.
    mixed_blocks=(4096, 16384),
    warmup_requests=150,
)
QUICK = Plan(
    decode_warmup=10,
    decode_steps=60,
    decode_block=20,
    mixed_requests=150,
    mixed_blocks=(4096,),
    warmup_requests=20,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (seconds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mixed workload")
    parser.add_argument(
        "--skip-decode", action="store_true", help="run only part B (the mixed workload)"
    )
    parser.add_argument(
        "--skip-mixed", action="store_true", help="run only part A (steady-state decode)"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else DEFAULT
    started = time.perf_counter_ns()
    print(
        f"schedspec reference scheduler benchmark ({'quick' if args.quick else 'default'}); "
        f"Python {platform.python_version()} {platform.machine()}, "
        f"gc {'on' if gc.isenabled() else 'off'}"
    )
    print()

    # Warm-up: every code path (prefill, decode, preemption, prefix hits) once.
    warm = make_mixed_workload(plan.warmup_requests, seed=args.seed + 1000)
    for caching in (False, True):
        run_mixed("warmup", warm, 2048, caching, plan.mixed_blocks[0])

    if not args.skip_decode:
        cases = bench_decode(plan.decode_warmup, plan.decode_steps, plan.decode_block)
        report_decode(cases)
        del cases
        gc.collect()

    if not args.skip_mixed:
        workload = make_mixed_workload(plan.mixed_requests, seed=args.seed)
        results = [
            run_mixed(f"{blocks}-{budget}-{caching}", workload, budget, caching, blocks)
            for blocks in plan.mixed_blocks
            for budget in (2048, 8192)
            for caching in (False, True)
        ]
        report_mixed(results, plan.mixed_requests)

    elapsed = (time.perf_counter_ns() - started) / 1e9
    print(f"wall time of the whole benchmark (setup and fake model included): {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
