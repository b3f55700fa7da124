"""`schedspec export-test`: a trace as a standalone pytest file for the engine's own test
suite (schedspec/export/). Exit 0 with the file written (to standard output, or -o), 2
when the trace holds what the engine's file cannot express (naming the trace's field)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from schedspec.cli.loading import load_trace
from schedspec.export.lowering import ExportError
from schedspec.export.writers import WRITERS, export_test
from schedspec.files import write_atomically


def engine_arg(text: str) -> tuple[str, object]:
    """NAME=VALUE, the value read as JSON (a bare word is a string)."""
    name, equals, raw = text.partition("=")
    if not equals or not name.isidentifier():
        raise click.BadParameter(f"{text!r}: must be NAME=VALUE", param_hint="'--engine-arg'")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


@click.command("export-test")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--for",
    "engine",
    type=click.Choice(sorted(WRITERS)),
    required=True,
    help="The engine whose own scheduler the test drives.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the file here [default: standard output].",
)
@click.option(
    "--finding",
    default="",
    help="What the bug is called (an issue, a finding's id), for the file's docstring.",
)
@click.option(
    "--engine-arg",
    "engine_args",
    multiple=True,
    metavar="NAME=VALUE",
    help="An engine argument the trace's config cannot state, set as given (vLLM: a "
    "keyword of its SchedulerConfig; SGLang: of its ServerArgs); repeatable.",
)
def export_test_command(
    trace: Path, engine: str, output: Path | None, finding: str, engine_args: tuple[str, ...]
) -> None:
    """Write a trace as a pytest file that drives the engine's own scheduler, with no
    schedspec import: it fails where the trace's bug is and passes on a fixed engine."""
    args = dict(engine_arg(text) for text in engine_args)
    try:
        text = export_test(load_trace(trace), str(trace), engine, finding, args)
    except ExportError as err:
        raise click.UsageError(f"cannot export {trace} for {engine}: {err}") from None
    if output is None:
        click.echo(text, nl=False)
    else:
        write_atomically(output, text)
        click.echo(f"wrote {output}", err=True)
