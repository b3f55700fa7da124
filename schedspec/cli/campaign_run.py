"""What `check`, `diff` and swarm mode print of a run on several workers (local processes
or a Ray cluster, for a count of examples or for a time: a campaign, --duration): the
backend once open, the progress bar, what the chunks covered and the failures a campaign
kept, and the JSON report's `campaign` section.

The backend, the deadline and the chunks are campaign/'s to choose (campaign/plan.py):
chunks of examples on seeds seed, seed + 1, ..., the first failure in chunk order
replayed into the same trace, report and exit code as a run in one process. A campaign
goes on past failures and keeps each distinct one's trace; it ends at its deadline, or
on Ctrl-C or SIGTERM, which stop every worker (the report is still written). Afterwards
it says what it covered: the chunks, examples and steps (the named corners every chunk
reached are merged into the run's corner table, properties/corners.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import click

from schedspec.campaign.backend import Backend
from schedspec.campaign.chunk_work import NamedEngines
from schedspec.campaign.parallel import Finding
from schedspec.campaign.plan import (
    OnProgress,
    ParallelRun,
    ProgressBar,
    run_parallel,
    with_database,
)
from schedspec.cli.loading import usage_errors
from schedspec.cli.options import format_duration
from schedspec.cli.printing.progress import campaign_progress, suite_progress
from schedspec.cli.printing.reports import RunReport
from schedspec.cli.suite_run import SuiteRunOptions
from schedspec.properties.failure_report import plural
from schedspec.properties.run_plan import RunPlan
from schedspec.properties.state_machine import SuiteRecorder
from schedspec.properties.suite import SuiteResult, SuiteSettings

OnExample = Callable[[SuiteRecorder], None] | None
# A run in this process on the settings given (the plan's, its example database open).
OneProcess = Callable[[SuiteSettings, OnExample], SuiteResult]


def run_planned(
    options: SuiteRunOptions,
    plan: RunPlan,
    recipe: NamedEngines,
    report: RunReport,
    in_one_process: OneProcess,
) -> tuple[SuiteResult, ParallelRun | None]:
    """The plan's run with its progress bar: in this process, or in chunks on its
    backend (campaign/plan.run_parallel; `recipe` names the engines to the workers),
    what it covered then put into the report."""
    if not plan.request.backend.parallel:
        with suite_progress(plan.settings.examples, options.progress, options.quiet) as on_example:
            return in_one_process(with_database(plan, recipe), on_example), None
    with usage_errors():  # an address given with --ray where no cluster answers
        parallel = run_parallel(
            plan,
            recipe,
            recipe.target(plan.factories),
            options.trace_dir,
            on_backend=echo_backend,
            progress=progress_bar(options),
        )
    report.campaign = campaign_report(parallel, options)
    return parallel.campaign.result, parallel


def progress_bar(
    options: SuiteRunOptions, units: tuple[str, str] = ("examples", "steps")
) -> ProgressBar:
    """The bar of a parallel run (printing/progress.campaign_progress), given what it counts."""

    def bar(counted: int | None) -> AbstractContextManager[OnProgress | None]:
        return campaign_progress(counted, options.duration, options.progress, units=units)

    return bar


def echo_backend(backend: Backend) -> None:
    """Where a run on Ray runs, once it has joined or started the cluster."""
    if backend.on_ray:
        click.echo(f"on {backend.name}")


def examples_phrase(plan: RunPlan) -> str:
    """How much the run searches, for its first line: a count, or a time."""
    return how_much(plan, f"{plan.settings.examples} examples", "examples")


def how_much(plan: RunPlan, count: str, units: str) -> str:
    """`count`, or for a campaign the time it searches `units` for, and its cap."""
    request = plan.request
    if request.backend.duration is None:
        return count
    cap = f" (at most {request.examples})" if request.examples is not None else ""
    return f"{units} for {format_duration(request.backend.duration)}{cap}"


def echo_campaign(run: ParallelRun, options: SuiteRunOptions) -> None:
    """What a parallel run covered and, for a campaign, each distinct failure it kept."""
    campaign = run.campaign
    result = campaign.result
    coverage = Coverage(result.examples, result.stats.steps, result.seconds)
    echo_coverage(run.backend, campaign.chunks, campaign.lost, coverage)
    if options.duration is not None:
        echo_findings(campaign.findings)


@dataclass(frozen=True)
class Coverage:
    """What a parallel run searched, in its own units (examples and steps for the
    suite; configs and instance-steps for swarm mode)."""

    examples: int
    steps: int
    seconds: float
    units: tuple[str, str] = ("examples", "steps")


def echo_coverage(backend: str, chunks: int, lost: int, coverage: Coverage) -> None:
    """The closing line of a parallel run: where it ran, its chunks and what they covered."""
    examples, steps = coverage.units
    rate = coverage.steps / coverage.seconds if coverage.seconds else 0.0
    lost_text = f", {lost} lost" if lost else ""
    click.echo(
        f"on {backend}: {plural(chunks, 'chunk')}{lost_text}, {coverage.examples} {examples}, "
        f"{coverage.steps} {steps} in {coverage.seconds:.1f} s ({rate:,.0f} {steps}/s)"
    )


def echo_findings(findings: list[Finding]) -> None:
    """A campaign's distinct failures, each with its chunk's seed and its trace."""
    if not findings:
        return
    click.echo(f"failures kept: {len(findings)} distinct")
    for finding in findings:
        where = (
            f"{finding.trace_path} ({plural(finding.events or 0, 'event')})"
            if finding.trace_path is not None
            else finding.trace_error or "no trace"
        )
        click.echo(f"  {finding.label} (chunk seed {finding.seed}): {where}")


def campaign_report(run: ParallelRun, options: SuiteRunOptions) -> dict[str, object]:
    """The JSON report's `campaign` section."""
    campaign = run.campaign
    return {
        "backend": run.backend,
        "ray": options.ray,
        "workers": run.workers,
        "duration": options.duration,
        "chunks": campaign.chunks,
        "lost_chunks": campaign.lost,
        "findings": [
            {
                "label": f.label,
                "seed": f.seed,
                "events": f.events,
                "trace": None if f.trace_path is None else str(f.trace_path),
            }
            for f in campaign.findings
        ],
    }
