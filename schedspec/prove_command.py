"""`schedspec prove`: the Z3 proofs of the counts model, as a table.

Exit status: 0 everything proved, 1 a counterexample (or a cross-check that
disagrees with the proof for all N), 3 a query Z3 could not decide in time.
On a counterexample it prints the state and, when a run of the same model
from fresh requests reaches the violation, writes that run as a trace.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from schedspec.properties.formal_traces import to_trace
from schedspec.prove_report import HEADER, row_line, state_lines, summary
from schedspec.spec.formal.bmc import search
from schedspec.spec.formal.progress import PROGRESS_ID
from schedspec.spec.formal.properties import ORDER_ID
from schedspec.spec.formal.prover import (
    ALL_IDS,
    ProofRow,
    ProveSettings,
    disagreements,
    prove,
)
from schedspec.spec.formal.variants import FAITHFUL, Bug, Variant

EXIT_PROVED, EXIT_COUNTEREXAMPLE, EXIT_UNKNOWN = 0, 1, 3


def write_counterexample_trace(row: ProofRow, variant: Variant, trace_dir: Path) -> Path | None:
    """Search a run from fresh requests that reaches the violation; write it as a trace."""
    if row.invariant in (PROGRESS_ID, ORDER_ID):
        return None
    reached = search(row.invariant, variant)
    if reached is None:
        return None
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / f"schedspec-formal-{row.invariant}-{variant.name}.json"
    to_trace(reached).save(path)
    return path


@click.command("prove")
@click.option(
    "--max-n",
    type=click.IntRange(0, 16),
    default=8,
    show_default=True,
    help="Monolithic cross-checks for N = 1..max-n slots (0: none).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds per Z3 query.",
)
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(ALL_IDS),
    help="Prove only this invariant (repeatable).",
)
@click.option(
    "--block-size",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="Block size of the monolithic cross-checks (the proofs for all N keep it symbolic).",
)
@click.option(
    "--variant",
    type=click.Choice([b.value for b in Bug]),
    default=None,
    help="Prove a deliberately broken variant instead (it must yield counterexamples).",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=os.cpu_count() or 1,
    show_default="the number of CPUs",
    help="Processes that discharge rows side by side (the table keeps its order).",
)
@click.option(
    "--trace-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Where counterexample traces are written.",
)
def prove_command(
    max_n: int,
    timeout: float,
    only: tuple[str, ...],
    block_size: int,
    variant: str | None,
    jobs: int,
    trace_dir: Path,
) -> None:
    """Prove the invariants of one scheduling step with Z3, for every N and for N <= max-n."""
    chosen = FAITHFUL if variant is None else Variant(Bug(variant))
    settings = ProveSettings(
        max_n=max_n,
        timeout_s=timeout,
        block_size=block_size,
        only=only or ALL_IDS,
        variant=chosen,
    )
    click.echo(f"model: {chosen.name}; cross-checks at block_size {block_size}")
    click.echo(HEADER)
    started = time.perf_counter()
    traced: set[str] = set()

    def on_row(row: ProofRow) -> None:
        click.echo(row_line(row))
        failure = row.failure
        if failure is None:
            return
        click.echo(f"  {failure.verdict}: {failure.claim} {failure.reason}".rstrip())
        for line in state_lines(failure):
            click.echo(line)
        if row.verdict == "counterexample" and row.invariant not in traced:
            traced.add(row.invariant)
            path = write_counterexample_trace(row, chosen, trace_dir)
            if path is None:
                click.echo("  no run from fresh requests reaches it within the search bound")
            else:
                click.echo(f"  trace of a run that reaches it: {path}")
                click.echo(
                    f"  replay it on an engine: schedspec replay {path} --engine MODULE:FACTORY"
                )

    rows = prove(settings, on_row, jobs)
    disagree = disagreements(rows)
    click.echo(summary(rows, time.perf_counter() - started, disagree))
    verdicts = {r.verdict for r in rows}
    if "counterexample" in verdicts or disagree:
        raise SystemExit(EXIT_COUNTEREXAMPLE)
    if "unknown" in verdicts:
        raise SystemExit(EXIT_UNKNOWN)
