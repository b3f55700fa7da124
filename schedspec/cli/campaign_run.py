"""`check` and `diff` on several workers: local processes or a Ray cluster, for a count of
examples or for a time (a campaign, --duration). Swarm mode (swarm.py) opens its backend
and reports what it covered through the same functions (open_backend, echo_coverage,
echo_findings).

The run is planned and merged by campaign/parallel.py whatever the backend: chunks of
examples on seeds seed, seed + 1, ..., the first failure in chunk order replayed here
into the same trace, report and exit code as a run in one process. A campaign goes on
past failures and keeps each distinct one's trace; it ends at its deadline, or on
Ctrl-C or SIGTERM, which stop every worker (the report is still written). Afterwards it
says what it covered: the chunks, examples and steps (the named corners every chunk
reached are merged into the run's corner table, properties/corners.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import click

from schedspec.campaign.chunk_work import NamedEngines
from schedspec.campaign.example_db import DatabaseSource, LocalDirectory, campaign_namespace
from schedspec.campaign.parallel import (
    CAMPAIGN_CHUNK_EXAMPLES,
    CampaignResult,
    Finding,
    run_campaign,
    timed_chunks,
)
from schedspec.campaign.workers import ChunkRunner, ForkedWorkers
from schedspec.cli.options import format_duration
from schedspec.cli.printing.progress import campaign_progress
from schedspec.cli.suite_run import SuiteRunOptions
from schedspec.properties.failure_report import plural
from schedspec.properties.harness import Target
from schedspec.properties.suite import MAX_CHUNK_EXAMPLES, Chunk, SuiteSettings, plan_chunks


@dataclass(frozen=True)
class ParallelRun:
    """A finished parallel run and where it ran."""

    campaign: CampaignResult
    backend: str  # "2 local processes", "a local Ray cluster (2 CPUs), 2 workers", ...
    workers: int


def runs_in_parallel(options: SuiteRunOptions) -> bool:
    """More than one worker, Ray, or a time budget: the run goes through parallel.py."""
    return (options.workers or 1) > 1 or options.ray is not None or options.duration is not None


def examples_phrase(options: SuiteRunOptions, chosen: SuiteSettings) -> str:
    """How much the run searches, for its first line: a count, or a time."""
    if options.duration is None:
        return f"{chosen.examples} examples"
    cap = f" (at most {options.examples})" if options.examples is not None else ""
    return f"examples for {format_duration(options.duration)}{cap}"


def database_source(options: SuiteRunOptions, recipe: NamedEngines) -> LocalDirectory | None:
    """--example-db as this machine opens it, under the run's namespace (campaign/example_db.py)."""
    if options.example_db is None:
        return None
    namespace = campaign_namespace(recipe.command, recipe.engines, recipe.profile, recipe.configs)
    return LocalDirectory(options.example_db, namespace)


def with_database(
    chosen: SuiteSettings, options: SuiteRunOptions, recipe: NamedEngines
) -> SuiteSettings:
    """A one-process run's settings, with --example-db opened when given."""
    source = database_source(options, recipe)
    return chosen if source is None else replace(chosen, database=source.open())


@dataclass(frozen=True)
class Backend:
    """Where a parallel run's chunks go: the runner, open, and how to name it."""

    runner: ChunkRunner
    name: str  # "2 local processes", "a local Ray cluster (2 CPUs), 2 workers", ...
    workers: int
    on_ray: bool


@contextmanager
def open_backend(options: SuiteRunOptions) -> Iterator[Backend]:
    """The runner the options name (--workers, --ray), open for the duration: forked
    local processes, or Ray tasks on a cluster (a local one started here, or the one at
    the address, which is a usage error of --ray if it does not answer). Every parallel
    run of `check`, `diff` and swarm mode goes through here."""
    if options.ray is None:
        workers = options.workers or 1
        name = f"{workers} local process" + ("es" if workers != 1 else "")
        yield Backend(ForkedWorkers(workers), name, workers, on_ray=False)
        return
    from schedspec.campaign.ray_cluster import RayClusterError, ray_cluster

    address = None if options.ray == "local" else options.ray
    try:
        with ray_cluster(address, options.workers) as cluster:
            # Only now: importing Ray's runner before the cluster is up would fix its address.
            from schedspec.campaign.ray_workers import RayWorkers

            workers = options.workers or cluster.cpus
            name = f"{cluster.describe()}, {plural(workers, 'worker')}"
            click.echo(f"on {name}")
            yield Backend(RayWorkers(workers), name, workers, on_ray=True)
    except RayClusterError as err:
        if address is None:
            raise  # a local cluster that does not start is no usage error
        raise click.BadParameter(str(err), param_hint="'--ray'") from None


def campaign_deadline(options: SuiteRunOptions) -> float | None:
    """The time (time.time()) a --duration campaign ends: taken once the backend is up (a
    local Ray cluster takes seconds to start), so a short campaign is not spent before
    its first chunk."""
    return None if options.duration is None else time.time() + options.duration


def run_parallel(
    options: SuiteRunOptions, recipe: NamedEngines, local: Target, chosen: SuiteSettings
) -> ParallelRun:
    """The run on the backend the options name; `local` is the recipe's target built
    here (replaying the first failure)."""
    assert chosen.seed is not None
    local_db = database_source(options, recipe)
    with open_backend(options) as backend:
        database: DatabaseSource | None = local_db
        if backend.on_ray and local_db is not None:
            from schedspec.campaign.ray_workers import serve_directory

            database = serve_directory(local_db.path, local_db.namespace)
        return _run(options, recipe, local, chosen, backend, database)


def planned_chunks(
    options: SuiteRunOptions,
    count: int,
    seed: int,
    deadline: float | None,
    workers: int,
    sizes: tuple[int, int] = (MAX_CHUNK_EXAMPLES, CAMPAIGN_CHUNK_EXAMPLES),
) -> Iterable[Chunk]:
    """A parallel run's chunks on seeds seed, seed + 1, ...: `count` examples over the
    workers in chunks of at most sizes[0] (plan_chunks), or for a campaign (a deadline),
    chunks of sizes[1] until the deadline, --examples capping them (timed_chunks)."""
    if deadline is None:
        return plan_chunks(count, seed, workers, sizes[0])
    return timed_chunks(seed, deadline, options.examples, workers, sizes[1])


def _run(
    options: SuiteRunOptions,
    recipe: NamedEngines,
    local: Target,
    chosen: SuiteSettings,
    backend: Backend,
    database: DatabaseSource | None,
) -> ParallelRun:
    settings = replace(chosen, deadline=campaign_deadline(options))
    assert settings.seed is not None
    chunks = planned_chunks(
        options, settings.examples, settings.seed, settings.deadline, backend.workers
    )
    # A campaign's bar measures its time, or its --examples cap if that runs out first.
    counted = settings.examples if options.duration is None else options.examples
    with campaign_progress(counted, options.duration, options.progress) as on_progress:
        campaign = run_campaign(
            recipe,
            local,
            settings,
            chunks,
            backend.runner,
            keep_going=options.duration is not None,
            database=database,
            trace_dir=options.trace_dir,
            on_progress=on_progress,
        )
    return ParallelRun(campaign, backend.name, backend.workers)


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
