"""`schedspec conform`: an adapter's own protocol, checked before any invariant.

Runs the adapter kit's conformance script (schedspec.adapters.kit.conformance) on the
engine named and prints each check it passed; the first broken promise is printed with
the adapter method at fault, and the command exits 1 (a violation, of the protocol).
An engine that cannot be loaded is a usage error (2). Run it first, then `schedspec
check`: a malformed snapshot or a refusal that is not a ValueError would otherwise be
reported as a broken scheduling invariant.
"""

from __future__ import annotations

import click

from schedspec.cli.exit_codes import EXIT_CODES, Outcome
from schedspec.cli.loading import load_engine
from schedspec.cli.options import ENGINE_HELP
from schedspec.spec import FAMILIES, Family


@click.command()
@click.option("--engine", required=True, help=ENGINE_HELP)
@click.option(
    "--family",
    type=click.Choice(FAMILIES),
    default="vllm",
    show_default=True,
    help="The policy family whose config the engine is built with.",
)
def conform(engine: str, family: Family) -> None:
    """Check an adapter's own protocol (snapshot shape, ids, queues, block hashes,
    refusals) and name the adapter method at fault."""
    raise SystemExit(run_conform(engine, family))


def run_conform(engine: str, family: Family) -> int:
    from schedspec.adapters.kit.conformance import ConformanceError, conform

    factory = load_engine(engine)
    click.echo(f"conformance of {engine} (family {family}):")
    try:
        passed = conform(factory, family)
    except ConformanceError as err:
        for check in err.passed:
            click.echo(f"  ok      {check}")
        click.echo(f"  FAILED  {err.check}: the adapter's {err.method}: {err.message}")
        click.echo(f"FAILED: fix the adapter's {err.method} first (then run schedspec check)")
        return EXIT_CODES[Outcome.VIOLATION]
    for check in passed:
        click.echo(f"  ok      {check}")
    click.echo("PASSED: the adapter keeps its protocol; now run schedspec check on it")
    return EXIT_CODES[Outcome.PASSED]
