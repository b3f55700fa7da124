"""Checked steps per second, engine by engine: the real engines' schedulers next to each
other (SGLang's beside vLLM's) and the references of their families.

Each engine runs the suite as `schedspec check --engine NAME` runs it (run_suite, its
default configs and the profile it claims, the quick profile's sizes), for --examples
examples at one fixed seed, and the script prints the steps it checked, the CPU seconds
it took (time.process_time of the process that ran it, which others' load disturbs less
than wall time; one engine is built first, and Hypothesis run once, untimed, so imports
and one-off set-up do not count) and their ratio. `reference` runs twice, once in each
family, so each real engine has its reference beside it.

vLLM and SGLang live in venvs of their own (their pins exclude each other: docs/ENGINES.md), so
an engine this Python cannot import runs in a child process of the Python given for it:

    .venv/bin/python benchmarks/bench_engines.py --python sglang=.venv-sglang/bin/python
    .venv-sglang/bin/python benchmarks/bench_engines.py --python vllm=.venv/bin/python
    .venv/bin/python benchmarks/bench_engines.py --quick   # a smoke run (fewer examples)

An engine that can run nowhere is listed with the reason. The numbers are for reading,
never for asserting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import hypothesis
from hypothesis import strategies as st

from schedspec.engines.dependencies import MissingDependencyError
from schedspec.engines.profiles import probe_config
from schedspec.engines.registry import (
    default_configs,
    load_config_strategy,
    load_engine_factory,
    named_engine,
)
from schedspec.properties.strategies.configs import family_configs
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.spec import Family
from schedspec.spec.invariants import FAMILY_PROFILES

SEED = 20261201
# (engine, family): the real engines, each after the reference of its family.
RUNS: tuple[tuple[str, Family], ...] = (
    ("reference", "vllm"),
    ("vllm", "vllm"),
    ("reference", "sglang"),
    ("sglang", "sglang"),
)
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Measured:
    engine: str
    family: str
    profile: str
    examples: int
    steps: int
    cpu_s: float
    passed: bool

    def line(self) -> str:
        rate = self.steps / self.cpu_s if self.cpu_s else 0.0
        outcome = "passed" if self.passed else "FAILED"
        return (
            f"{self.engine:<10} {self.family:<7} {self.profile:<8} {self.examples:>8} "
            f"{self.steps:>7} {self.cpu_s:>8.1f} {rate:>9.0f}   {outcome}"
        )


def _set_up_hypothesis() -> None:
    """Run Hypothesis once, untimed: its first run in a process registers its global
    random generator, which runs a full garbage collection (0.3 to 0.4 CPU seconds in
    a process holding torch and SGLang), paid by whichever engine ran first in that
    process (the reference in this one, the engine itself in a child)."""

    @hypothesis.settings(max_examples=1, database=None)
    @hypothesis.given(st.none())
    def once(_: None) -> None:
        pass

    once()


def measure(engine: str, family: Family, examples: int) -> Measured:
    """Run the suite on `engine` in `family` in this process (MissingDependencyError
    where it cannot be built here)."""
    factory = load_engine_factory(engine)
    named = default_configs((engine,)) if engine != "reference" else None
    configs = load_config_strategy(named) if named else family_configs(family)
    profile = FAMILY_PROFILES[family]
    # One engine built first, untimed: the engine's imports (seconds for SGLang) are not
    # steps.
    factory(probe_config(family))
    _set_up_hypothesis()
    start = time.process_time()
    result = run_suite(factory, profile, SuiteSettings(examples=examples, seed=SEED), configs)
    cpu = time.process_time() - start
    return Measured(
        engine, family, profile, result.examples, result.stats.steps, cpu, result.passed
    )


def measure_elsewhere(python: str, engine: str, family: Family, examples: int) -> Measured:
    """measure() in a child process of another venv's Python."""
    done = subprocess.run(
        [python, __file__, "--one", f"{engine}:{family}", "--examples", str(examples)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} could not run {engine}: {done.stderr.strip()[-400:]}")
    return Measured(**json.loads(done.stdout.splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="examples per engine [100]")
    parser.add_argument("--quick", action="store_true", help="10 examples per engine")
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="ENGINE=PYTHON",
        help="the Python (of a venv that has it) to run ENGINE with, where this one cannot",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # ENGINE:FAMILY, as a child
    args = parser.parse_args()
    examples = 10 if args.quick else args.examples
    if args.one:
        engine, family = args.one.split(":")
        print(json.dumps(asdict(measure(engine, family, examples))))
        return 0
    elsewhere = dict(item.split("=", 1) for item in args.python)
    print(f"python {platform.python_version()} on {platform.machine()}, load {os.getloadavg()}")
    print(f"the suite at seed {SEED}, {examples} examples per engine (quick profile's sizes)\n")
    print(
        f"{'engine':<10} {'family':<7} {'profile':<8} {'examples':>8} {'steps':>7} "
        f"{'cpu (s)':>8} {'steps/s':>9}"
    )
    for engine, family in RUNS:
        try:
            measured = measure(engine, family, examples)
        except MissingDependencyError as err:
            if engine not in elsewhere:
                needs = named_engine(engine)
                name = needs.needs[0].name if needs is not None and needs.needs else engine
                print(f"{engine:<10} {family:<7} not run: {name} is not installed here ({err})")
                continue
            measured = measure_elsewhere(elsewhere[engine], engine, family, examples)
        print(measured.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
