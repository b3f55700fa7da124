"""`schedspec prove`: the Z3 proofs of the counts model, as a table; with --contracts,
CrossHair over the reference's arithmetic instead.

Exit status: 0 everything proved, 1 a counterexample (or a cross-check that
disagrees with the proof for all N), 3 a query Z3 (or a condition CrossHair)
could not decide in time; 2, 6 and 128 + N as for every command (exit_codes.py).
On a Z3 counterexample it prints the state and, when a run of the same model from
fresh requests reaches the violation, writes that run as a trace.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import click

from schedspec.cli.loading import require_for
from schedspec.cli.options import refuse_flags
from schedspec.cli.printing.prove_report import (
    HEADER,
    contracts_summary,
    row_line,
    state_lines,
    summary,
)
from schedspec.engines.dependencies import CROSSHAIR
from schedspec.files import OutputPathError, prepare_output_dir
from schedspec.reference.contracts import SIZING, check_contracts
from schedspec.spec.formal.bmc import search
from schedspec.spec.formal.determined import DETERMINED_ID
from schedspec.spec.formal.profile import STRENGTHENINGS
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
from schedspec.traces.formal_traces import to_trace
from schedspec.traces.trace import FORMAL_TRACE_STEM, trace_file_name

EXIT_PROVED, EXIT_COUNTEREXAMPLE, EXIT_UNKNOWN = 0, 1, 3


def write_counterexample_trace(row: ProofRow, variant: Variant, trace_dir: Path) -> Path | None:
    """Search a run from fresh requests that reaches the violation; write it as a trace."""
    if row.invariant in (PROGRESS_ID, ORDER_ID, DETERMINED_ID):
        return None
    reached = search(row.invariant, variant)
    if reached is None:
        return None
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = trace_dir / trace_file_name(FORMAL_TRACE_STEM, row.invariant, variant.name)
    to_trace(reached).save(path)
    return path


# Flags of the Z3 run, which --contracts does not use.
Z3_FLAGS = [
    "--max-n",
    "--determined-max-n",
    "--timeout",
    "--only",
    "--block-size",
    "--variant",
    "--drop",
    "--jobs",
    "--trace-dir",
]


# The longest a single Z3 query may be given: a day (Z3 takes milliseconds as an integer,
# so nan and inf cannot even be passed on).
MAX_QUERY_TIMEOUT = 86_400.0


def _query_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """Seconds per query: finite, more than 0, at most MAX_QUERY_TIMEOUT (click's
    FloatRange lets nan through)."""
    if not (math.isfinite(value) and 0 < value <= MAX_QUERY_TIMEOUT):
        raise click.BadParameter(
            f"must be more than 0 and at most {MAX_QUERY_TIMEOUT:g} seconds, got {value!r}"
        )
    return value


@click.command("prove")
@click.option(
    "--contracts",
    is_flag=True,
    help="Instead of the Z3 proofs, check the PEP 316 contracts of the reference's "
    "arithmetic (schedspec/reference/sizing.py) with CrossHair over all paths, reporting "
    "each condition (needs CrossHair, the formal extra; without it the error says how to "
    "install it).",
)
@click.option(
    "--max-n",
    type=click.IntRange(0, 16),
    default=8,
    show_default=True,
    help="Monolithic cross-checks for N = 1..max-n slots (0: none; DETERMINED has its own).",
)
@click.option(
    "--determined-max-n",
    type=click.IntRange(0, 3),
    default=1,
    show_default=True,
    help=f"{DETERMINED_ID}'s cross-checks, two engines over N = 1..this slots (N = 2 takes "
    "20 s to minutes, N = 3 over ten minutes).",
)
@click.option(
    "--timeout",
    type=float,
    callback=_query_timeout,
    default=300.0,
    show_default=True,
    help=f"Seconds per Z3 query (more than 0, at most {MAX_QUERY_TIMEOUT:g}).",
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
    "--drop",
    multiple=True,
    type=click.Choice(list(STRENGTHENINGS)),
    help=f"With --only {DETERMINED_ID}: leave this strengthening out of the vllm-v1 profile "
    "(repeatable); the profile then leaves a decision open and the proof must fail.",
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
@click.pass_context
def prove_command(
    ctx: click.Context,
    /,
    contracts: bool,
    max_n: int,
    determined_max_n: int,
    timeout: float,
    only: tuple[str, ...],
    block_size: int,
    variant: str | None,
    drop: tuple[str, ...],
    jobs: int,
    trace_dir: Path,
) -> None:
    """Prove the invariants of one scheduling step with Z3, for every N and for N <= max-n.

    Exit 0 if everything was proved, 1 on a counterexample, 3 if a query could
    not be decided in time.
    """
    if contracts:
        refuse_flags(ctx, Z3_FLAGS, "flags of the Z3 proofs, which --contracts does not run")
        require_for("--contracts", CROSSHAIR)
        raise SystemExit(prove_contracts())
    try:  # a counterexample's trace must not be lost to a bad path at the end
        prepare_output_dir(trace_dir)
    except OutputPathError as err:
        raise click.BadParameter(str(err), param_hint="'--trace-dir'") from None
    chosen = FAITHFUL if variant is None else Variant(Bug(variant))
    if drop and DETERMINED_ID not in only:
        raise click.BadParameter(
            f"it weakens the profile of {DETERMINED_ID} only; add --only {DETERMINED_ID}",
            param_hint="'--drop'",
        )
    settings = ProveSettings(
        max_n=max_n,
        determined_max_n=determined_max_n,
        timeout_s=timeout,
        block_size=block_size,
        only=only or ALL_IDS,
        variant=chosen,
        dropped=drop,
    )
    profile = f"; vllm-v1 profile without {', '.join(drop)}" if drop else ""
    click.echo(f"model: {chosen.name}; cross-checks at block_size {block_size}{profile}")
    click.echo(HEADER)
    started = time.perf_counter()
    traced: set[str] = set()

    def on_row(row: ProofRow) -> None:
        click.echo(row_line(row))
        failure = row.failure
        if failure is None:
            return
        click.echo(f"  {failure.verdict}: {failure.claim} {failure.reason}".rstrip())
        for line in state_lines(failure, row.invariant):
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


def prove_contracts() -> int:
    """CrossHair over sizing.py, every condition reported; exit as for the Z3 proofs."""
    click.echo(f"CrossHair: the contracts of {SIZING} over all paths")
    checked = check_contracts()
    for line in checked.lines:
        click.echo(line)
    if checked.failed and not checked.errors:  # CrossHair itself failed: show why
        click.echo(checked.stderr.rstrip())
    click.echo(contracts_summary(checked))
    if checked.failed:
        return EXIT_COUNTEREXAMPLE
    if checked.unconfirmed or not checked.confirmed:
        return EXIT_UNKNOWN
    return EXIT_PROVED
