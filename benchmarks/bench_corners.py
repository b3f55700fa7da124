"""Corner coverage of the CI profile, seed by seed: is every named corner reached in every run?

Runs what `schedspec check` runs on the reference (run_suite, the vllm-v1 profile or
with --profile sglang the SGLang family's, the CI profile's 100 examples of up to 40
actions, the default config strategy, no shrinking) once per seed, and prints one row
per named corner of the profile's family (schedspec/properties/corners.py) with the
times each run reached it, then each run's checked steps per CPU
second of this process (time.process_time: others' load on the machine disturbs it
less than wall time). The numbers are for reading, never for asserting.

    .venv/bin/python benchmarks/bench_corners.py              # seeds 1-10
    .venv/bin/python benchmarks/bench_corners.py --seeds 20 --first-seed 100
    .venv/bin/python benchmarks/bench_corners.py --profile sglang
    .venv/bin/python benchmarks/bench_corners.py --hybrid   # engine_configs:hybrid_configs
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from schedspec.adapters.reference import reference_engine
from schedspec.properties.corners import corners_for
from schedspec.properties.strategies.engine_configs import hybrid_configs
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.spec.invariants import Profile


@dataclasses.dataclass(frozen=True)
class SeedRun:
    seed: int
    corners: dict[str, int]
    steps: int
    cpu_seconds: float
    passed: bool


def run_seed(seed: int, profile: Profile, hybrid: bool = False) -> SeedRun:
    settings = dataclasses.replace(SuiteSettings.quick(), seed=seed, shrink=False)
    started = time.process_time()
    strategy = hybrid_configs() if hybrid else None
    result = run_suite(reference_engine, profile, settings, strategy)
    cpu = time.process_time() - started
    return SeedRun(seed, dict(result.stats.corners), result.stats.steps, cpu, result.passed)


def corner_grid(runs: list[SeedRun], profile: Profile) -> list[str]:
    names = [c.name for c in corners_for(profile)]
    width = max(len("corner"), *(len(n) for n in names))
    lines = [f"{'corner':<{width}}  " + " ".join(f"{r.seed:>6}" for r in runs) + "  runs"]
    lines.append("-" * len(lines[0]))
    for name in names:
        counts = [r.corners.get(name, 0) for r in runs]
        reached = sum(c > 0 for c in counts)
        cells = " ".join(f"{c:>6}" for c in counts)
        lines.append(f"{name:<{width}}  {cells}  {reached}/{len(runs)}")
    lines.append("-" * len(lines[0]))
    rates = " ".join(f"{r.steps / max(r.cpu_seconds, 1e-9):>6.0f}" for r in runs)
    lines.append(f"{'checked steps/CPU s':<{width}}  {rates}")
    steps = " ".join(f"{r.steps:>6}" for r in runs)
    lines.append(f"{'checked steps':<{width}}  {steps}")
    every = sum(all(r.corners.get(n, 0) > 0 for r in runs) for n in names)
    total_steps = sum(r.steps for r in runs)
    total_cpu = sum(r.cpu_seconds for r in runs)
    lines.append(
        f"corners reached in every run: {every}/{len(names)}; runs that passed: "
        f"{sum(r.passed for r in runs)}/{len(runs)}; overall {total_steps / total_cpu:,.0f} "
        "checked steps per CPU second"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="runs (default 10)")
    parser.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument(
        "--profile", choices=("vllm-v1", "sglang"), default="vllm-v1", help="the family profile"
    )
    parser.add_argument(
        "--hybrid",
        action="store_true",
        help="draw hybrid KV cache groups too (engine_configs:hybrid_configs, vllm-v1)",
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    load = os.getloadavg()[0]
    print(
        f"corner coverage of `schedspec check` (CI profile, reference, {args.profile}), seeds "
        f"{args.first_seed}-{args.first_seed + args.seeds - 1}; load average {load:.1f}, "
        f"{os.cpu_count()} CPUs"
    )
    profile: Profile = args.profile
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs = [run_seed(seed, profile, args.hybrid) for seed in seeds]
    for line in corner_grid(runs, profile):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
