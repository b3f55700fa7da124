"""CPU seconds of `schedspec simulate --compare`, whole and by phase, in one run.

Issue 35 asks for the default comparison (every family in it: on the reference, six
vLLM-family presets and two of SGLang's) within 30 CPU seconds. CPU time, not wall
time: on a shared machine the wall clock also counts other processes.

1. The command itself, in a fresh process, as a user runs it (imports, simulation,
   pictures in PNG and SVG, summary.json), and again with --no-plots: the CPU seconds
   (user + system) of each child process, and the difference, which is what the
   pictures cost. With --baseline CHECKOUT, the same two commands run from that
   checkout too (its schedspec first on the import path), alternating with this one's,
   so that before and after are measured in one run.
2. The same work in this process, phase by phase: each config's simulation (metrics
   included), then matplotlib's import and each picture (drawing the figure, then
   writing it in every format, as the command does).

    .venv/bin/python benchmarks/bench_simulate_compare.py
    .venv/bin/python benchmarks/bench_simulate_compare.py --phases-only   # skip part 1
    .venv/bin/python benchmarks/bench_simulate_compare.py --baseline ../main --repeat 2

The machine's load average is printed beside the figures. The numbers are for reading,
never for asserting: nothing here checks a time.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from schedspec.engines.registry import load_engine_factory, named_engine
from schedspec.simulate.configs import resolve_configs
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.runs import FORMATS, ConfigRun, pictures, run_configs
from schedspec.simulate.workloads import SyntheticWorkload, builtin_workload

TARGET_CPU_S = 30.0
ENGINE = "reference"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def command_cpu(checkout: Path, extra: Sequence[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `schedspec simulate --compare` process run
    from checkout's schedspec."""
    inherited = os.environ.get("PYTHONPATH")
    path = os.pathsep.join([str(checkout), *([inherited] if inherited else [])])
    env = {**os.environ, "PYTHONPATH": path}
    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable, "-m", "schedspec", "simulate", "--compare", "--out", folder]
        cpu, wall = children_cpu(), time.perf_counter()
        subprocess.run([*argv, *extra], check=True, stdout=subprocess.DEVNULL, env=env)
        return children_cpu() - cpu, time.perf_counter() - wall


def bench_command(checkouts: dict[str, Path], repeat: int) -> None:
    print(
        "1. The command, a fresh process each (CPU = user + system of the process); "
        f"{repeat} round{'s' if repeat > 1 else ''}, the least CPU of each counts"
    )
    figures: dict[str, dict[str, float]] = {name: {} for name in checkouts}
    for _ in range(repeat):
        for label, extra in (("--compare", []), ("--compare --no-plots", ["--no-plots"])):
            for name, checkout in checkouts.items():
                before = load()
                cpu, wall = command_cpu(checkout, extra)
                figures[name][label] = min(cpu, figures[name].get(label, cpu))
                print(
                    f"  {name:<9} simulate {label:<22} {cpu:7.2f} CPU s  {wall:7.2f} wall s  "
                    f"({before})"
                )
    for name, measured in figures.items():
        total = measured["--compare"]
        pictures_cpu = total - measured["--compare --no-plots"]
        verdict = "met" if total <= TARGET_CPU_S else "NOT met"
        print(
            f"  {name:<9} pictures (the difference) {pictures_cpu:6.2f} CPU s; "
            f"target --compare within {TARGET_CPU_S:.0f} CPU s: {total:.2f} -> {verdict}"
        )
    if "baseline" in figures:
        ratio = figures["this"]["--compare"] / figures["baseline"]["--compare"]
        print(f"  this / baseline, --compare CPU s: {ratio:.2f}")
    print()


def simulate_phases() -> list[ConfigRun]:
    """Each config of the default comparison, timed alone; the runs, for the pictures."""
    cost = CostModel()
    registered = named_engine(ENGINE)
    families = registered.families if registered is not None else ("vllm",)
    configs = resolve_configs((), True, False, {}, cost, families)
    max_model_len = min(c.config.max_model_len for c in configs)
    workload = builtin_workload("mixed", 0, max_model_len, SyntheticWorkload())
    factory = load_engine_factory(ENGINE)
    print(f"2. Phases in this process ({load()})")
    runs: list[ConfigRun] = []
    total = 0.0
    for named in configs:
        started = time.process_time()
        (run,) = run_configs([named], workload, factory, cost, 0, 10**8)
        cpu = time.process_time() - started
        total += cpu
        runs.append(run)
        print(f"  simulate {named.name:<24} {cpu:6.2f} CPU s  ({len(run.result.steps)} iterations)")
    print(f"  simulation, every config        {total:6.2f} CPU s")
    return runs


def picture_phases(runs: Sequence[ConfigRun]) -> None:
    started = time.process_time()
    from schedspec.simulate.plots import save_figure

    imported = time.process_time() - started
    print(f"  import matplotlib and the plots {imported:6.2f} CPU s")
    total = imported
    formats = " + ".join(FORMATS)
    print(f"  {'picture':<30}{'draw':>8}{'write ' + formats:>16}   (CPU s)")
    with tempfile.TemporaryDirectory() as folder:
        for stem, draw in pictures(runs):
            started = time.process_time()
            figure = draw()
            drawn = time.process_time()
            save_figure(figure, Path(folder), stem, FORMATS)  # as the command writes them
            written = time.process_time()
            total += written - started
            print(f"  {stem:<30}{drawn - started:8.2f}{written - drawn:16.2f}")
    print(f"  pictures, every one (import included) {total:6.2f} CPU s  ({load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases-only", action="store_true", help="skip the fresh processes")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the commands [1]")
    parser.add_argument(
        "--baseline", type=Path, help="a checkout whose command runs beside this one's"
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    here = Path(__file__).resolve().parent.parent
    checkouts = {"this": here}
    if args.baseline is not None:
        if not (args.baseline / "schedspec" / "__init__.py").is_file():
            parser.error(f"--baseline: no schedspec package in {args.baseline}")
        checkouts["baseline"] = args.baseline.resolve()
    print(f"python {platform.python_version()} on {platform.machine()}, engine {ENGINE}")
    print()
    if not args.phases_only:
        bench_command(checkouts, args.repeat)
    picture_phases(simulate_phases())


if __name__ == "__main__":
    main()
