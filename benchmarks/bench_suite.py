"""Invariant-checked steps per second through the reference, and where the time goes.

Part A runs the suite as `schedspec check` does: `run_suite` on the reference with every
invariant of the vllm-v1 profile, and the quick profile's sizes (100 examples of up to 40
actions, two per state-machine rule; --long: 2000 of 100), once per seed for --suite-seeds
fixed seeds, totalled (one seed's examples vary a lot in size). Part B drives the same
CheckedEngine from a seeded `random` event loop shaped like the state machine (same
config ranges, same request decoding, initial arrivals, the same actions with their steps,
at most 32 live requests, a drain at the end of each example) with no Hypothesis at all,
so that Hypothesis' share shows as a ratio of the two. Rates are per CPU second of this
process (time.process_time), which others' load on the machine disturbs less than wall
time; the load average is printed first.

Time is split by wrapping, in this script only, with time.perf_counter_ns accumulators:

  (a) engine calls   schedule, update_from_output, add_request, finish_requests,
                     update_draft_token_ids (wrapped on each engine the factory builds)
  (b) snapshots      the engine's snapshot() (the refinement mapping)
  (c) checks         every CHECKS entry, per invariant id (wrapped before any
                     CheckedEngine copies them), and the fused state fast path
  (d) fake model     FakeModel.execute and FakeModel.drafts_for
  (e1) harness       the rest of CheckedEngine.apply: building transitions, the KV
                     content oracle, the loop over the checks
  (e2) driver        wall time outside CheckedEngine.apply: Hypothesis and the state
                     machine's rules (or the random driver), garbage collection

Each part also runs once unwrapped with the same seed, to show what the wrappers cost.
The numbers are for reading, never for asserting.

    .venv/bin/python benchmarks/bench_suite.py           # quick sizes (about a minute)
    .venv/bin/python benchmarks/bench_suite.py --long    # the long profile's sizes
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import Abort, AddRequest, Drain, ProposeDrafts, Step
from schedspec.engines.fake_model import FakeModel, StepDecisions
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.properties.checked_engine import CheckedEngine, CheckStats
from schedspec.properties.state_machine import MAX_INITIAL_ARRIVALS, MAX_LIVE_REQUESTS
from schedspec.properties.strategies.actions import (
    MAX_STEPS_AFTER_EVENT,
    MAX_STEPS_PER_ACTION,
    REQUEST_DRAW_RANGES,
    build_add_request,
    decode_request_draw,
)
from schedspec.properties.strategies.configs import BLOCK_SIZES
from schedspec.properties.strategies.regimes import PLAIN_WEIGHT, REGIMES, Regime
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.spec import SchedulerConfig, SchedulerOutput
from schedspec.spec.invariants import CHECKS, Profile
from schedspec.spec.invariants.safety import state_fast_path
from schedspec.traces.trace import ModelParams

PROFILE: Profile = "vllm-v1"
ENGINE_CALLS = (
    "schedule",
    "update_from_output",
    "add_request",
    "finish_requests",
    "update_draft_token_ids",
)
SNAPSHOT = ("snapshot",)
MODEL_CALLS = ("execute", "drafts_for")
# The fused pass that vouches for most state invariants (the named ones then run
# only when it cannot), timed as a check.
FAST_PATH_KEY = "(state fast path)"

F = TypeVar("F", bound=Callable[..., Any])


# ------------------------------------------------------------------ accounting


@dataclass
class Account:
    ns: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def total(self) -> int:
        return sum(self.ns.values())

    def wrap(self, key: str, fn: F) -> F:
        clock = time.perf_counter_ns
        ns = self.ns
        calls = self.calls
        ns.setdefault(key, 0)
        calls.setdefault(key, 0)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                ns[key] += clock() - start
                calls[key] += 1

        return timed  # type: ignore[return-value]


@dataclass
class Shape:
    """What the workload looked like: engines built, their KV blocks, and the live and
    running requests each schedule() saw (recorded in the instrumented run only)."""

    engines: int = 0
    blocks: int = 0
    schedules: int = 0
    empty: int = 0  # schedule() calls with no live request
    live: int = 0
    running: int = 0

    def line(self) -> str:
        steps = max(1, self.schedules)
        return (
            f"{self.blocks / max(1, self.engines):.0f} KV blocks per engine on average; "
            f"at schedule(): {self.live / steps:.1f} live requests, "
            f"{self.running / steps:.1f} running, {100 * self.empty / steps:.0f} % of steps "
            "on an empty engine"
        )


@dataclass
class Accounts:
    engine: Account = field(default_factory=Account)
    snapshot: Account = field(default_factory=Account)
    checks: Account = field(default_factory=Account)
    model: Account = field(default_factory=Account)
    harness: Account = field(default_factory=Account)  # all of CheckedEngine.apply
    shape: Shape = field(default_factory=Shape)


def instrumented_factory(accounts: Accounts) -> EngineFactory:
    """reference_engine, with each engine's calls timed on the instance."""
    shape = accounts.shape

    def factory(config: SchedulerConfig) -> EngineAdapter:
        engine = reference_engine(config)
        shape.engines += 1
        shape.blocks += config.num_blocks
        schedule = engine.schedule

        def observed_schedule() -> SchedulerOutput:
            shape.schedules += 1
            shape.live += len(engine.requests)
            shape.empty += not engine.requests
            shape.running += len(engine.running)
            return schedule()

        setattr(engine, "schedule", observed_schedule)  # noqa: B010  (timed below, outside this)
        for account, names in ((accounts.engine, ENGINE_CALLS), (accounts.snapshot, SNAPSHOT)):
            for name in names:
                setattr(engine, name, account.wrap(name, getattr(engine, name)))
        return engine

    return factory


@contextmanager
def instrumented(accounts: Accounts) -> Iterator[None]:
    """CHECKS entries, FakeModel's methods and CheckedEngine.apply timed for the
    duration; restored after."""
    saved_checks = dict(CHECKS)
    saved_model = {name: getattr(FakeModel, name) for name in MODEL_CALLS}
    saved_apply = CheckedEngine.apply
    saved_fast_path = state_fast_path.StateFastPath.holds
    try:
        for invariant_id, check in saved_checks.items():
            CHECKS[invariant_id] = accounts.checks.wrap(invariant_id, check)
        fast_path = accounts.checks.wrap(FAST_PATH_KEY, saved_fast_path)
        setattr(state_fast_path.StateFastPath, "holds", fast_path)  # noqa: B010
        for name, method in saved_model.items():
            setattr(FakeModel, name, accounts.model.wrap(name, method))
        setattr(CheckedEngine, "apply", accounts.harness.wrap("apply", saved_apply))  # noqa: B010
        yield
    finally:
        CHECKS.update(saved_checks)
        setattr(state_fast_path.StateFastPath, "holds", saved_fast_path)  # noqa: B010
        for name, method in saved_model.items():
            setattr(FakeModel, name, method)
        setattr(CheckedEngine, "apply", saved_apply)  # noqa: B010


# ------------------------------------------------------------------- the runs


@dataclass
class RunResult:
    label: str
    wall_ns: int
    cpu_ns: int  # this process's CPU time: steady on a machine others share
    steps: int
    events: int
    examples: int
    accounts: Accounts | None

    def steps_per_s(self) -> float:
        return self.steps / (self.wall_ns / 1e9)

    def steps_per_cpu_s(self) -> float:
        return self.steps / (self.cpu_ns / 1e9)


def run_hypothesis(settings: SuiteSettings, seeds: int, accounts: Accounts | None) -> RunResult:
    """run_suite once per seed (settings.seed, + 1, ...), totalled: one seed's examples
    vary a lot in size, so one seed alone says little about the rate."""
    factory: EngineFactory = instrumented_factory(accounts) if accounts else reference_engine
    assert settings.seed is not None
    total = RunResult("suite", 0, 0, 0, 0, 0, accounts)
    for offset in range(seeds):
        one_seed = dataclasses.replace(settings, seed=settings.seed + offset)
        gc.collect()
        start, cpu_start = time.perf_counter_ns(), time.process_time_ns()
        if accounts is not None:
            with instrumented(accounts):
                result = run_suite(factory, PROFILE, one_seed)
        else:
            result = run_suite(factory, PROFILE, one_seed)
        total.wall_ns += time.perf_counter_ns() - start
        total.cpu_ns += time.process_time_ns() - cpu_start
        if not result.passed:
            raise RuntimeError(f"the suite failed: {result.error or result.other_error}")
        total.steps += result.stats.steps
        total.events += result.stats.events
        total.examples += result.examples
    return total


def random_config(rng: random.Random, max_model_len_cap: int = 96) -> SchedulerConfig:
    """strategies.configs(), drawn from `random` instead of Hypothesis."""
    block_size = rng.choice(BLOCK_SIZES)
    max_model_len = rng.randint(2, max_model_len_cap)
    min_blocks = -(-max_model_len // block_size)
    max_num_seqs = rng.randint(1, 8)
    chunked = rng.random() < 0.5
    low = max_num_seqs if chunked else max(max_num_seqs, max_model_len)
    num_spec = rng.choice([0, 0, 1, 2, 4])
    threshold = rng.choice([0, 0, 1]) if rng.random() < 0.5 else rng.randint(0, max_model_len)
    drawn = SchedulerConfig(
        block_size=block_size,
        num_blocks=rng.randint(min_blocks, 4 * min_blocks + 2),
        max_num_batched_tokens=rng.randint(low, max(low, 2 * max_model_len)),
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=rng.random() < 0.5,
        watermark=rng.choice([0.0, 0.0, 0.1, 0.3]),
        policy=rng.choice(["fcfs", "priority"]),
        num_speculative_tokens=num_spec,
        num_lookahead_tokens=rng.choice([None, 0]) if num_spec else None,
    )
    # The regimes of strategies/regimes.py, as often as configs() narrows by them.
    regimes: list[Regime | None] = [None, *REGIMES]
    regime = rng.choices(regimes, weights=[PLAIN_WEIGHT, *(r.weight for r in REGIMES)])[0]
    return drawn if regime is None else regime.narrow(drawn)


def random_add(rng: random.Random, checked: CheckedEngine, request_id: str) -> AddRequest:
    """The state machine's add_request, its five integers drawn from `random` and decoded
    by the same strategies code (door cases and urgent arrivals included)."""
    drawn = decode_request_draw(*(rng.randrange(size) for size in REQUEST_DRAW_RANGES))
    live = checked.state.requests
    priorities = [r.priority for r in live.values()]
    return build_add_request(checked.config, request_id, live, drawn, priorities)


def random_decisions(rng: random.Random, checked: CheckedEngine) -> StepDecisions:
    """The state machine's step decisions: now and then a forced stop or a fixed count
    of accepted drafts."""
    running = [checked.state.requests[r] for r in checked.state.running]
    stops: dict[str, int] = {}
    stoppable = [r for r in running if r.eos_token_id is not None or r.stop_token_ids]
    if stoppable and rng.random() < 0.25:
        request = rng.choice(stoppable)
        eos = request.eos_token_id
        stops[request.request_id] = eos if eos is not None else request.stop_token_ids[0]
    accepted: dict[str, int] = {}
    if rng.random() < 0.5:
        count = min(rng.randint(0, 7), checked.config.num_speculative_tokens)
        accepted = {r.request_id: count for r in running if r.spec_token_ids}
    return StepDecisions(stops=stops, accepted=accepted)


# Action weights (step, add, abort, drafts), most steps per step action, and most
# steps after another action's event. "like the state machine": its single rule's
# four kinds, drawn uniformly, 1-12 steps per step action, 0-8 after an event.
# "busy": arrivals outpace steps, so the engine holds many requests (up to 32).
LOOPS: dict[str, tuple[tuple[int, int, int, int], int, int]] = {
    "like the state machine": ((1, 1, 1, 1), MAX_STEPS_PER_ACTION, MAX_STEPS_AFTER_EVENT),
    "busy": ((2, 6, 1, 1), 2, 0),
}


def steps_while_busy(checked: CheckedEngine, count: int) -> None:
    """Up to `count` steps, stopping once the engine is idle (as the state machine)."""
    for _ in range(count):
        if not checked.state.requests:
            break
        checked.apply(Step())


def random_example(
    rng: random.Random, factory: EngineFactory, stats: CheckStats, rules: int, loop: str
) -> None:
    """One example: a config, initial arrivals, `rules` actions, each as the state
    machine's rule does it (an event, then a few steps, never on an idle engine
    except a step action's first), then a drain."""
    checked = CheckedEngine.from_factory(
        factory, random_config(rng), PROFILE, ModelParams(seed=rng.randint(0, 2**16)), stats
    )
    weights, max_steps, max_then = LOOPS[loop]
    for next_id in range(rng.randint(1, MAX_INITIAL_ARRIVALS)):
        checked.apply(random_add(rng, checked, f"r{next_id}"))
    next_id += 1
    for _ in range(rules):
        state = checked.state
        kind = rng.choices(("step", "add", "abort", "drafts"), weights)[0]
        if kind == "step":
            # The drawn decisions shape the first step, which runs even on an idle engine.
            checked.apply(Step(random_decisions(rng, checked)))
            steps_while_busy(checked, rng.randint(1, max_steps) - 1)
            continue
        if kind == "add" and len(state.requests) >= MAX_LIVE_REQUESTS:
            checked.apply(Step())  # full: the engine makes room instead
            continue
        if kind == "add":
            checked.apply(random_add(rng, checked, f"r{next_id}"))
            next_id += 1
        elif kind == "abort":
            live = sorted(state.requests)
            ids = (rng.choice(live),) if live else ()
            if not ids or rng.random() < 0.25:
                ids = (*ids, "no-such-request")
            checked.apply(Abort(ids))
        elif checked.config.num_speculative_tokens:
            drafts = rng.randint(0, checked.config.num_speculative_tokens)
            checked.apply(ProposeDrafts(dict.fromkeys(state.running, drafts)))
        steps_while_busy(checked, rng.randint(0, max_then))
    checked.apply(Drain())


def run_random(
    settings: SuiteSettings, seed: int, accounts: Accounts | None, min_steps: int, loop: str
) -> RunResult:
    """Examples until at least min_steps checked steps (the suite run's count), so that
    every part checks about the same number of steps."""
    factory: EngineFactory = instrumented_factory(accounts) if accounts else reference_engine
    rng = random.Random(seed)
    stats = CheckStats()
    examples = 0
    gc.collect()
    start, cpu_start = time.perf_counter_ns(), time.process_time_ns()
    if accounts is not None:
        with instrumented(accounts):
            while stats.steps < min_steps:
                random_example(rng, factory, stats, settings.rules_per_example, loop)
                examples += 1
    else:
        while stats.steps < min_steps:
            random_example(rng, factory, stats, settings.rules_per_example, loop)
            examples += 1
    wall, cpu = time.perf_counter_ns() - start, time.process_time_ns() - cpu_start
    return RunResult(loop, wall, cpu, stats.steps, stats.events, examples, accounts)


# ------------------------------------------------------------------ reporting


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f} %"


def report(run: RunResult, plain: RunResult, title: str, driver: str) -> None:
    accounts = run.accounts
    assert accounts is not None
    wall = run.wall_ns
    print(title)
    print(
        f"  {run.examples} examples, {run.events:,} events, {run.steps:,} checked steps; "
        f"{accounts.shape.line()}"
    )
    print(
        f"  not instrumented (same seed): {plain.steps_per_cpu_s():,.0f} checked steps per CPU "
        f"second ({plain.steps_per_s():,.0f} per wall second, {plain.cpu_ns / 1e9:.2f} CPU s)"
    )
    print(
        f"  instrumented: {run.steps_per_cpu_s():,.0f} per CPU second; the wrappers cost "
        f"{run.cpu_ns / plain.cpu_ns:.2f}x. Shares below are of the instrumented run's wall "
        f"time, {wall / 1e9:.2f} s, {wall / run.steps / 1e3:,.1f} us per checked step"
    )
    print("  share of wall time:")
    engine = accounts.engine
    measured = engine.total() + accounts.snapshot.total()
    measured += accounts.checks.total() + accounts.model.total()
    engine_detail = ", ".join(
        f"{name} {pct(engine.ns[name], wall).strip()}" for name in ENGINE_CALLS
    )
    snapshots = max(1, accounts.snapshot.calls["snapshot"])
    rows = (
        ("(a) engine calls", engine.total(), engine_detail),
        (
            "(b) snapshots",
            accounts.snapshot.total(),
            f"{snapshots:,} calls, {accounts.snapshot.total() / snapshots / 1e3:.1f} us each",
        ),
        (
            "(c) invariant checks",
            accounts.checks.total(),
            f"{sum(accounts.checks.calls.values()):,} predicate calls",
        ),
        (
            "(d) fake model",
            accounts.model.total(),
            ", ".join(f"{n} {pct(accounts.model.ns[n], wall).strip()}" for n in MODEL_CALLS),
        ),
        (
            "(e1) harness bookkeeping",
            accounts.harness.total() - measured,
            "CheckedEngine.apply minus (a)-(d): transitions, KV oracle, check loop",
        ),
        (
            f"(e2) {driver}",
            wall - accounts.harness.total(),
            "wall minus CheckedEngine.apply: drawing events, picking rules, gc",
        ),
    )
    for name, ns, detail in rows:
        print(f"    {name:<30}{pct(ns, wall)}   {ns / run.steps / 1e3:8.1f} us/step   {detail}")
    print("  top 10 invariant checks by time:")
    print(f"    {'id':<24}{'calls':>9}{'us/call':>9}{'us/step':>9}{'% wall':>9}")
    checks = accounts.checks
    for invariant_id in sorted(checks.ns, key=lambda i: -checks.ns[i])[:10]:
        ns = checks.ns[invariant_id]
        calls = max(1, checks.calls[invariant_id])
        print(
            f"    {invariant_id:<24}{checks.calls[invariant_id]:>9,}{ns / calls / 1e3:>9.1f}"
            f"{ns / run.steps / 1e3:>9.1f}{pct(ns, wall):>9}"
        )
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--long", action="store_true", help="the long profile's sizes")
    parser.add_argument("--seed", type=int, default=20261129, help="seed of all parts")
    parser.add_argument(
        "--suite-seeds",
        type=int,
        default=4,
        help="suite runs in part A (seeds seed, seed + 1, ...)",
    )
    args = parser.parse_args(argv)
    chosen = SuiteSettings.long() if args.long else SuiteSettings.quick()
    settings = SuiteSettings(
        examples=chosen.examples, rules_per_example=chosen.rules_per_example, seed=args.seed
    )
    started = time.perf_counter_ns()
    print(
        f"schedspec suite benchmark ({'long' if args.long else 'quick'}: {settings.examples} "
        f"examples x {settings.rules_per_example} actions, seed {args.seed}, profile {PROFILE}, "
        f"load average {os.getloadavg()[0]:.1f} at the start, "
        f"at most {MAX_LIVE_REQUESTS} live requests); Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    print()

    suite = run_hypothesis(settings, args.suite_seeds, Accounts())
    suite_plain = run_hypothesis(settings, args.suite_seeds, None)
    report(
        suite,
        suite_plain,
        f"A. run_suite: the Hypothesis state machine, every invariant on ({args.suite_seeds} "
        "seeds, totalled)",
        "Hypothesis + state machine",
    )

    plain_runs = [("suite (Hypothesis)", suite_plain, suite)]
    for part, loop in zip("BC", LOOPS, strict=True):
        raw = run_random(settings, args.seed, Accounts(), suite.steps, loop)
        raw_plain = run_random(settings, args.seed, None, suite.steps, loop)
        title = f"{part}. CheckedEngine from a seeded random event loop, {loop} (no Hypothesis)"
        report(raw, raw_plain, title, "random driver")
        plain_runs.append((f"random loop, {loop}", raw_plain, raw))

    like = plain_runs[1]

    def in_apply_per_step(run: RunResult) -> float:
        assert run.accounts is not None
        return run.accounts.harness.total() / run.steps

    print("D. Ratios (same run)")
    print(
        "  suite wall / time inside CheckedEngine.apply = "
        f"{suite.wall_ns / (in_apply_per_step(suite) * suite.steps):.2f}"
        "   (the factor Hypothesis and the rules put on top of the checked engine)"
    )
    print(
        "  CPU per checked step, suite / random loop like the state machine = "
        f"{suite_plain.cpu_ns / suite_plain.steps / (like[1].cpu_ns / like[1].steps):.2f}"
        " (not instrumented)"
    )
    print(
        "  time inside CheckedEngine.apply per step, suite / that loop = "
        f"{in_apply_per_step(suite) / in_apply_per_step(like[2]):.2f}"
        "   (1.00 if the two workloads had the same shape)"
    )
    # A rate alone says little on a machine whose speed drifts: bench_suite_baseline.py
    # sets it against another checkout's, measured in the same run.
    for label, run, _ in plain_runs:
        print(f"  {label:<38}{run.steps_per_cpu_s():>8,.0f} checked steps per CPU second")
    elapsed = (time.perf_counter_ns() - started) / 1e9
    print()
    print(f"wall time of the whole benchmark: {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
