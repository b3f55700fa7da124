"""This checkout's suite against another checkout's: checked steps per CPU second, as a ratio
measured in one run.

The machine is shared and its speed drifts by a tenth over a day, so a rate measured
today says little next to one written down last week. This runs the suite as
`schedspec check` does (run_suite on the reference, profile vllm-v1, the CI profile's 100
examples of up to 40 actions, on --suite-seeds fixed seeds, totalled) in this checkout
and in another one (a `git worktree add` of an older commit, say), each in a fresh
interpreter, in alternating rounds, and prints each round's rates and the ratio of the
totals. Each side runs its own code on its own examples: the ratio says how the cost of
a checked step moved, not why (bench_suite.py splits where the time goes).

    git worktree add /tmp/before c8f4ab4
    .venv/bin/python benchmarks/bench_suite_baseline.py /tmp/before        # 2 rounds
    .venv/bin/python benchmarks/bench_suite_baseline.py /tmp/before --rounds 3

The numbers are for reading, never for asserting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
# What each side runs, with only its own checkout on the import path: the API both have
# had since the suite began (run_suite, SuiteSettings, reference_engine).
ONE_SIDE = """
import json, sys, time
from schedspec.adapters.reference import reference_engine
from schedspec.properties.suite import SuiteSettings, run_suite
first, seeds = int(sys.argv[1]), int(sys.argv[2])
steps = 0
start = time.process_time()
for seed in range(first, first + seeds):
    result = run_suite(reference_engine, "vllm-v1", SuiteSettings(seed=seed))
    assert result.passed, result.error or result.other_error
    steps += result.stats.steps
print(json.dumps({"steps": steps, "cpu_s": time.process_time() - start}))
"""


@dataclass(frozen=True)
class SideRun:
    steps: int
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.steps / self.cpu_s


def run_side(checkout: Path, first_seed: int, seeds: int) -> SideRun:
    """The suite on `seeds` seeds from first_seed, in a fresh interpreter on `checkout`."""
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    environment.pop("SCHEDSPEC_LONG", None)
    done = subprocess.run(
        [sys.executable, "-c", ONE_SIDE, str(first_seed), str(seeds)],
        cwd=checkout,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the suite failed in {checkout}:\n{done.stderr}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return SideRun(int(measured["steps"]), float(measured["cpu_s"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("baseline", type=Path, help="another checkout of schedspec")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--seed", type=int, default=20261129, help="the first seed")
    parser.add_argument("--suite-seeds", type=int, default=4, help="seeds per side per round")
    args = parser.parse_args(argv)
    baseline = args.baseline.resolve()
    if not (baseline / "schedspec" / "properties" / "suite.py").is_file():
        parser.error(f"baseline: {baseline} is not a checkout of schedspec")
    if args.rounds < 1 or args.suite_seeds < 1:
        parser.error("--rounds and --suite-seeds must be at least 1")
    print(
        f"suite rate, this checkout ({HERE}) against {baseline}: seeds {args.seed}-"
        f"{args.seed + args.suite_seeds - 1}, {args.rounds} rounds; "
        f"load average {os.getloadavg()[0]:.1f} at the start, {os.cpu_count()} CPUs"
    )
    totals = {"this": SideRun(0, 0.0), "baseline": SideRun(0, 0.0)}
    for round_index in range(args.rounds):
        for name, checkout in (("this", HERE), ("baseline", baseline)):
            run = run_side(checkout, args.seed, args.suite_seeds)
            total = totals[name]
            totals[name] = SideRun(total.steps + run.steps, total.cpu_s + run.cpu_s)
            print(
                f"  round {round_index + 1}, {name:<8}  {run.steps:>7,} checked steps  "
                f"{run.cpu_s:6.2f} CPU s  {run.rate:7,.0f} per CPU second"
            )
    this, before = totals["this"], totals["baseline"]
    print(
        f"this checkout {this.rate:,.0f} / baseline {before.rate:,.0f} checked steps per CPU "
        f"second = {this.rate / before.rate:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
