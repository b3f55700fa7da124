"""Every catalogued mutant under `schedspec check` as a user runs it, on many seeds: the kill table.

tests/mutants runs each mutant under the CI profile on one pinned seed. This
benchmark asks the harder question of issue #19: does `schedspec check` alone (no
lockstep diff, no targeted config strategy: the suite's default configs, or the configs
a user of the feature passes (a KV connector's: `--configs ...:connector_configs`,
the mutant's `user_configs`), the CI profile's 100 examples of up to 40 actions, the
profile the engine claims) kill every mutant on its first run, whatever the seed? For
each mutant and each seed it runs what `schedspec check --engine MUTANT --seed SEED
--no-shrink` runs (run_suite with those configs; shrinking off, since only the verdict
counts here) and replays any
counterexample on the real reference, which must pass it (else the "kill" is the
suite's false alarm, shown as F).

    .venv/bin/python benchmarks/bench_mutants.py                  # 10 seeds, 2 processes
    .venv/bin/python benchmarks/bench_mutants.py --seeds 3 --only watermark-ignored

Cells: K killed by an invariant violation, C killed by an engine crash, . survived,
F a false alarm (the reference fails the same trace), E the harness itself failed.
The numbers are for reading, never for asserting.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

# The mutants live in tests/mutants: import them, and schedspec, from this checkout.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schedspec.campaign.workers import ForkedWorkers, WorkerCrashed, WorkerLost
from schedspec.engines.registry import load_attribute
from schedspec.properties.suite import SuiteSettings
from tests.mutants.mutation import Mutant, SeedVerdict, check_as_a_user

# The catalogues, by family: `--catalogue sglang` runs the SGLang family's seeded bugs
# under `schedspec check --profile sglang`; any other value is a module:attribute.
CATALOGUES = {
    "vllm": "tests.mutants.catalogue:MUTANTS",
    "sglang": "tests.mutants.sglang_catalogue:SGLANG_MUTANTS",
}

FIRST_SEED = 1


@dataclass(frozen=True)
class Job:
    mutant: Mutant
    seed: int


def run_job(job: Job) -> SeedVerdict:
    """One mutant on one seed, in a fresh directory of its own (the process is forked)."""
    with tempfile.TemporaryDirectory(prefix="schedspec-mutant-") as root:
        return check_as_a_user(job.mutant, Path(root), job.seed, SuiteSettings.quick())


def kill_grid(
    mutants: Sequence[Mutant],
    seeds: Sequence[int],
    cells: dict[Job, str],
    caught_by: dict[str, set[str]] | None = None,
) -> str:
    """One row per mutant (a cell per seed, then the invariants that caught it on any
    seed), the kills per seed, and the totals."""
    caught = caught_by or {}
    width = max(len("mutant"), *(len(m.id) for m in mutants))
    lines = [f"{'mutant':<{width}}  {' '.join(f'{s:>2}' for s in seeds)}  killed  caught by"]
    lines.append("-" * len(lines[0]))
    for m in mutants:
        row = [cells[Job(m, s)] for s in seeds]
        kills = sum(c in "KC" for c in row)
        ids = ",".join(sorted(caught.get(m.id, ())))
        cells_text = " ".join(f"{c:>2}" for c in row)
        lines.append(f"{m.id:<{width}}  {cells_text}  {kills}/{len(seeds)}  {ids}".rstrip())
    per_seed = [sum(cells[Job(m, s)] in "KC" for m in mutants) for s in seeds]
    lines.append("-" * len(lines[0]))
    lines.append(f"{'killed per seed':<{width}}  {' '.join(f'{k:>2}' for k in per_seed)}")
    total = sum(per_seed)
    runs = len(mutants) * len(seeds)
    every_seed = sum(all(cells[Job(m, s)] in "KC" for s in seeds) for m in mutants)
    lines.append(
        f"kill rate: {total}/{runs} runs ({100 * total / max(runs, 1):.1f}%); "
        f"{every_seed}/{len(mutants)} mutants killed on every seed; "
        f"worst seed {min(per_seed, default=0)}/{len(mutants)}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=10, help="seeds per mutant (default 10)")
    parser.add_argument("--first-seed", type=int, default=FIRST_SEED, help="the first seed")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--only", nargs="*", default=None, help="mutant ids to run")
    parser.add_argument(
        "--catalogue",
        default="vllm",
        help="vllm (default), sglang, or module:attribute naming a tuple of Mutants",
    )
    args = parser.parse_args(argv)
    try:
        found = load_attribute(
            CATALOGUES.get(args.catalogue, args.catalogue),
            "--catalogue",
            "vllm, sglang or module:attribute",
            "catalogue of mutants",
        )
    except ValueError as err:
        parser.error(str(err))
    catalogue = tuple(cast("Sequence[Mutant]", found))
    mutants = [m for m in catalogue if args.only is None or m.id in args.only]
    unknown = set(args.only or ()) - {m.id for m in catalogue}
    if unknown:
        parser.error(f"unknown mutant ids: {sorted(unknown)}")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    jobs = [Job(m, s) for m in mutants for s in seeds]
    settings = SuiteSettings.quick()
    print(
        f"{len(mutants)} mutants x {len(seeds)} seeds ({seeds[0]}-{seeds[-1]}) under "
        f"`schedspec check`: the CI profile ({settings.examples} examples of up to "
        f"{settings.rules_per_example} actions), default or user configs, no shrinking; "
        f"{args.workers} processes, {os.cpu_count()} CPUs"
    )
    started = time.perf_counter()
    cells: dict[Job, str] = {}
    caught_by: dict[str, set[str]] = {}
    notes: list[str] = []
    for job, verdict in zip(
        jobs, ForkedWorkers(args.workers).map_chunks(run_job, jobs), strict=True
    ):
        if isinstance(verdict, WorkerLost | WorkerCrashed):
            cells[job] = "E"
            notes.append(f"{job.mutant.id} seed {job.seed}: the worker failed: {verdict}")
            continue
        cells[job] = verdict.cell
        caught_by.setdefault(job.mutant.id, set()).update(verdict.invariant_ids)
        if verdict.cell in "FE":
            notes.append(f"{job.mutant.id} seed {job.seed}: {verdict.detail}")
    print(kill_grid(mutants, seeds, cells, caught_by))
    for note in notes:
        print(note)
    print(f"wall time: {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
