"""What an engine in another interpreter costs: checked steps per second of the suite on
one engine in this process and over the pipe (schedspec/engines/remote/), in one run,
and their ratio; then one round trip on its own.

The engine runs the suite as `schedspec check --engine NAME [--python PATH]` runs it
(the run plan's factories, profile, configs and the quick profile's sizes), for
--examples examples at one seed, no shrinking, in alternating rounds (in-process,
over the pipe, ...) so that others' load on the machine falls on both alike; each
side's best round is shown. Wall time, not CPU time: over the pipe the work is split
between two processes, and the harness waits on the engine's. Both sides must check
the same steps (the same seed gives the same examples); the script says if they do
not. The numbers are for reading, never for asserting.

    .venv/bin/python benchmarks/bench_remote_engine.py                  # the reference
    .venv/bin/python benchmarks/bench_remote_engine.py --engine vllm --examples 30
    .venv-sglang/bin/python benchmarks/bench_remote_engine.py --engine sglang \\
        --python .venv-sglang/bin/python
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from collections.abc import Callable

from schedspec.engines.profiles import probe_config
from schedspec.engines.protocol import EngineAdapter
from schedspec.properties.run_plan import RunPlan, RunRequest, one_engine, resolve_plan
from schedspec.properties.suite import run_suite

SEED = 4
ROUND_TRIPS = 2000


@dataclasses.dataclass(frozen=True)
class Round:
    steps: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.steps / self.seconds


def plan_for(engine: str, python: str | None, examples: int) -> RunPlan:
    request = RunRequest(engines=one_engine(engine, python), seed=SEED, examples=examples)
    plan = resolve_plan(request)
    settings = dataclasses.replace(plan.settings, shrink=False)
    return dataclasses.replace(plan, settings=settings)


def run_round(plan: RunPlan) -> Round:
    (factory,) = plan.factories
    factory(probe_config(plan.family))  # imports and the first build, untimed
    started = time.perf_counter()
    result = run_suite(factory, plan.profile, plan.settings, plan.config_strategy)
    seconds = time.perf_counter() - started
    if not result.passed:
        sys.exit(f"the run failed; fix that first: {result.error or result.other_error}")
    return Round(result.stats.steps, seconds)


def per_call_us(engine: EngineAdapter, call: Callable[[EngineAdapter], object]) -> float:
    started = time.perf_counter()
    for _ in range(ROUND_TRIPS):
        call(engine)
    return (time.perf_counter() - started) / ROUND_TRIPS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="reference")
    parser.add_argument(
        "--python", default=sys.executable, help="the other interpreter [default: this one]"
    )
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    here = plan_for(args.engine, None, args.examples)
    there = plan_for(args.engine, args.python, args.examples)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(
        f"{args.engine}, profile {here.profile}, seed {SEED}, {args.examples} examples; "
        f"over the pipe: {args.python}"
    )
    sides: dict[str, list[Round]] = {"in-process": [], "over the pipe": []}
    for _ in range(args.rounds):
        sides["in-process"].append(run_round(here))
        sides["over the pipe"].append(run_round(there))
    best = {side: max(rounds, key=lambda r: r.rate) for side, rounds in sides.items()}
    print(f"{'where':<14} {'steps':>7} {'seconds':>8} {'steps/s':>8}   rounds (steps/s)")
    for side, rounds in sides.items():
        shown = " ".join(f"{r.rate:.0f}" for r in rounds)
        b = best[side]
        print(f"{side:<14} {b.steps:>7} {b.seconds:>8.1f} {b.rate:>8.0f}   {shown}")
    if best["in-process"].steps != best["over the pipe"].steps:
        print("WARNING: the two sides checked different steps: the pipe changed the run")
    ratio = best["over the pipe"].rate / best["in-process"].rate
    print(f"over the pipe / in-process: {ratio:.2f} of the steps per second")

    config = probe_config(here.family)
    local, remote = here.factories[0](config), there.factories[0](config)
    for name, call in (
        ("finish_requests([]) (no work)", lambda e: e.finish_requests([])),
        ("snapshot() of an idle engine", lambda e: e.snapshot()),
    ):
        print(
            f"{name}: {per_call_us(local, call):.0f} us in-process, "
            f"{per_call_us(remote, call):.0f} us over the pipe"
        )


if __name__ == "__main__":
    main()
