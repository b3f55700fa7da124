"""A parallel run of a RunPlan: its backend opened, its deadline, its chunks, its example
database, and for `check` and `diff` the run itself (run_parallel; swarm mode's is
swarm_chunks.run_swarm_parallel, started the same way).

The chunks are on seeds seed, seed + 1, ...: a count of examples (or of swarm mode's
configs) over the backend's workers (suite.plan_chunks), or for a campaign (a time
budget) chunks of a fixed size until its deadline, the request's examples capping them
(parallel.timed_chunks). The deadline is taken once the backend is up (a local Ray
cluster takes seconds to start), so a short campaign is not spent before its first
chunk. A count run stops at its first failure in chunk order; a campaign goes on and
keeps every distinct failure. What is printed meanwhile is the caller's: it is told
the backend once open (on_backend), and gives the progress bar (ProgressBar).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from schedspec.campaign.backend import Backend, open_backend, ran_on
from schedspec.campaign.chunk_work import NamedEngines
from schedspec.campaign.example_db import DatabaseSource, LocalDirectory, campaign_namespace
from schedspec.campaign.parallel import (
    CAMPAIGN_CHUNK_EXAMPLES,
    CampaignResult,
    CampaignTally,
    run_campaign,
    timed_chunks,
)
from schedspec.properties.harness import Target
from schedspec.properties.run_plan import BackendChoice, RunPlan
from schedspec.properties.suite import MAX_CHUNK_EXAMPLES, Chunk, SuiteSettings, plan_chunks

OnProgress = Callable[[CampaignTally], None]
# The caller's progress bar for a parallel run, given what it counts (examples or
# configs; None: a campaign's time only), open for the run.
ProgressBar = Callable[[int | None], AbstractContextManager[OnProgress | None]]


def no_progress(counted: int | None) -> AbstractContextManager[OnProgress | None]:
    """No bar: a library caller's default."""
    return nullcontext(None)


@dataclass(frozen=True)
class CampaignStart:
    """A parallel run ready to go: the backend open, its chunks planned."""

    backend: Backend
    database: DatabaseSource | None  # as the workers open it (served from here on Ray)
    deadline: float | None  # time.time() at which a campaign ends
    chunks: Iterable[Chunk]
    keep_going: bool  # a campaign: on past failures until its deadline
    on_progress: OnProgress | None

    @property
    def where(self) -> str:
        """Where the run runs, as it runs: a count of chunks (a list) fewer than the
        workers asked for uses one worker a chunk (backend.ran_on); a campaign's chunks
        come until its deadline, on every worker."""
        if isinstance(self.chunks, Sized):
            return ran_on(self.backend, len(self.chunks))
        return self.backend.name


@contextmanager
def started_campaign(
    plan: RunPlan,
    count: int,
    *,
    sizes: tuple[int, int] = (MAX_CHUNK_EXAMPLES, CAMPAIGN_CHUNK_EXAMPLES),
    database: LocalDirectory | None = None,
    on_backend: Callable[[Backend], None] | None = None,
    progress: ProgressBar = no_progress,
) -> Iterator[CampaignStart]:
    """The plan's backend open, and `count` examples (or configs) planned on it in
    chunks (planned_chunks, of `sizes`), for the duration; `database` is served to
    the workers from here if they run on Ray."""
    choice = plan.request.backend
    with open_backend(choice) as backend:
        if on_backend is not None:
            on_backend(backend)
        served = _served(database, backend)
        deadline = campaign_deadline(choice)
        chunks = planned_chunks(plan, count, deadline, backend.workers, sizes)
        with progress(progress_count(plan, count)) as on_progress:
            keep_going = choice.duration is not None
            yield CampaignStart(backend, served, deadline, chunks, keep_going, on_progress)


def campaign_deadline(choice: BackendChoice) -> float | None:
    """The time (time.time()) a campaign with a time budget ends, counted from now."""
    return None if choice.duration is None else time.time() + choice.duration


def planned_chunks(
    plan: RunPlan,
    count: int,
    deadline: float | None,
    workers: int,
    sizes: tuple[int, int] = (MAX_CHUNK_EXAMPLES, CAMPAIGN_CHUNK_EXAMPLES),
) -> Iterable[Chunk]:
    """A parallel run's chunks on the plan's seed, seed + 1, ...: `count` over the workers
    in chunks of at most sizes[0] (plan_chunks), or for a campaign (a deadline) chunks of
    sizes[1] until the deadline, the request's examples capping them (timed_chunks)."""
    if deadline is None:
        return plan_chunks(count, plan.seed, workers, sizes[0])
    return timed_chunks(plan.seed, deadline, plan.request.examples, workers, sizes[1])


def progress_count(plan: RunPlan, count: int) -> int | None:
    """What a parallel run's progress counts: its `count`, or a campaign's cap (the
    request's examples; None: the campaign's time alone)."""
    return count if plan.request.backend.duration is None else plan.request.examples


def database_source(plan: RunPlan, recipe: NamedEngines) -> LocalDirectory | None:
    """The plan's example database as this machine opens it, under the namespace of
    what the run checks (campaign/example_db.py); None: none asked for."""
    path = plan.request.backend.example_db
    if path is None:
        return None
    namespace = campaign_namespace(recipe.command, recipe.engines, recipe.profile, recipe.configs)
    return LocalDirectory(path, namespace)


def with_database(plan: RunPlan, recipe: NamedEngines) -> SuiteSettings:
    """A run in one process: the plan's settings, with its example database opened."""
    source = database_source(plan, recipe)
    return plan.settings if source is None else replace(plan.settings, database=source.open())


def _served(database: LocalDirectory | None, backend: Backend) -> DatabaseSource | None:
    """The database as the backend's workers open it: a directory here for forked
    workers; for Ray ones, which may run elsewhere, served from here."""
    if database is None or not backend.on_ray:
        return database
    from schedspec.campaign.ray_workers import serve_directory

    return serve_directory(database.path, database.namespace)


@dataclass(frozen=True)
class ParallelRun:
    """A finished parallel run and where it ran."""

    campaign: CampaignResult
    backend: str  # where it ran, as it ran (backend.ran_on)
    workers: int


def run_parallel(
    plan: RunPlan,
    recipe: NamedEngines,
    local: Target,
    trace_dir: Path,
    *,
    on_backend: Callable[[Backend], None] | None = None,
    progress: ProgressBar = no_progress,
) -> ParallelRun:
    """`check` or `diff` of the plan on its backend (`recipe` names the engines to the
    workers; `local` is its target built here, to replay the first failure on): the
    first failure in chunk order is the run's, as in one process."""
    database = database_source(plan, recipe)
    count = plan.settings.examples
    with started_campaign(
        plan, count, database=database, on_backend=on_backend, progress=progress
    ) as start:
        campaign = run_campaign(
            recipe,
            local,
            replace(plan.settings, deadline=start.deadline),
            start.chunks,
            start.backend.runner,
            keep_going=start.keep_going,
            database=start.database,
            trace_dir=trace_dir,
            on_progress=start.on_progress,
        )
    return ParallelRun(campaign, start.where, start.backend.workers)
