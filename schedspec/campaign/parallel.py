"""The suite over many workers: the examples in chunks, one Hypothesis run each, run by a
workers.ChunkRunner (forked local processes, or ray_workers.RayWorkers on a Ray cluster).

Hypothesis itself is single-threaded, and the checked engine is pure Python, so the way
to use more cores, or more machines, is more processes. A run is planned as chunks on
distinct seeds (chunk i on seed + i): a count of examples (suite.plan_chunks: at least
one chunk per worker), or, for a campaign with a time budget, chunks of
CAMPAIGN_CHUNK_EXAMPLES planned as workers free up until the deadline (timed_chunks).
Each worker runs ChunkWork (campaign/chunk_work.py) and hands back plain data; the driver merges
the counts (gather_chunks: the loop over a runner's results, which swarm mode's chunks,
campaign/swarm_chunks.py, share) and, for the first failing chunk in chunk order (so a run is the
same for a seed whatever the timing), replays its shrunk trace here to rebuild the error
(exceptions need not cross the process boundary, traces do): a violation, a
divergence, an engine error, a hang (StepTimeoutError, as in one process), an engine
that ended its worker, or an error of the harness's own. That failure is the run's, as
in one process: its trace, report and exit code.

A count run stops at that failure (the chunks after it are stopped). A campaign
(keep_going) runs on: each later failure, already shrunk by its worker, is kept as a
Finding with its trace, once per failure label and shrunk trace. A lost worker loses
only its chunk.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

from hypothesis import strategies as st

from schedspec.campaign.chunk_work import (
    BuiltTarget,
    ChunkOutcome,
    ChunkProgress,
    ChunkWork,
    TargetRecipe,
)
from schedspec.campaign.example_db import DatabaseSource
from schedspec.campaign.workers import ChunkRunner, ForkedWorkers, WorkerCrashed, WorkerLost
from schedspec.engines.errors import EngineHalt, mark_engine_call
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.signals import interrupt_signals, raise_if_signalled_since
from schedspec.properties.checked_engine import CheckStats
from schedspec.properties.harness import SingleEngine, Target, replay_target
from schedspec.properties.strategies.configs import ConfigStrategyError
from schedspec.properties.suite import (
    Chunk,
    SuiteResult,
    SuiteSettings,
    plan_chunks,
    record_failure,
    save_trace,
)
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile
from schedspec.traces.trace import Trace, trace_file_name, trace_from_json

# Examples per chunk of a campaign with a time budget: small enough that a lost worker
# loses little and progress moves, large enough that a chunk's start (a process, a
# Hypothesis run) is a small part of its time.
CAMPAIGN_CHUNK_EXAMPLES = 200

ChunkResult = ChunkOutcome | WorkerLost[Chunk] | WorkerCrashed[Chunk]


class WorkerLostError(EngineHalt):
    """A worker process ended without reporting: the engine ended it (os._exit from
    native code or its own thread, a crash), or something killed it."""

    def __init__(self, lost: WorkerLost[Chunk]) -> None:
        chunk = lost.chunk
        super().__init__(
            f"the worker process running {chunk.examples} examples on seed {chunk.seed} "
            f"{lost.describe()} before reporting: the engine ended it (an exit or a crash "
            "in native code or a thread of its own) or something killed it (the OOM killer?)"
        )
        self.call = "a worker process"


class WorkerCrashedError(Exception):
    """The harness itself raised inside a worker; its traceback, as text."""


@dataclass(frozen=True)
class Finding:
    """One distinct failure of a campaign: what failed, the chunk that found it, and
    its trace (none for a lost or crashed worker)."""

    label: str
    seed: int  # the seed of the chunk that found it
    events: int | None  # events in its shrunk trace
    trace_path: Path | None
    trace_error: str | None = None  # why its trace could not be written


@dataclass
class CampaignResult:
    """A parallel run: the merged result (its failure the first in chunk order, as in
    one process) and every distinct failure found."""

    result: SuiteResult
    findings: list[Finding] = field(default_factory=list)
    chunks: int = 0  # chunks that handed back a result (or were lost)
    lost: int = 0  # chunks whose worker was lost or crashed
    # (label, shrunk trace) of every failure kept, to keep each once
    seen: set[tuple[str, str]] = field(default_factory=set, repr=False)


@dataclass
class CampaignTally:
    """Progress over every chunk: the finished ones' counts plus what each running
    chunk last reported."""

    finished_examples: int = 0
    finished_steps: int = 0
    running: dict[int, ChunkProgress] = field(default_factory=dict)
    findings: int = 0

    @property
    def examples(self) -> int:
        return self.finished_examples + sum(p.examples for p in self.running.values())

    @property
    def steps(self) -> int:
        return self.finished_steps + sum(p.steps for p in self.running.values())

    def reported(self, chunk: Chunk, progress: object) -> None:
        if isinstance(progress, ChunkProgress):
            self.running[chunk.index] = progress

    def finished(self, chunk: Chunk, examples: int, steps: int) -> None:
        self.running.pop(chunk.index, None)
        self.finished_examples += examples
        self.finished_steps += steps


def timed_chunks(
    seed: int,
    deadline: float,
    examples: int | None = None,
    parts: int = 1,
    size: int = CAMPAIGN_CHUNK_EXAMPLES,
) -> Iterator[Chunk]:
    """A campaign's chunks, chunk i on seed + i, each of at most `size` examples, until
    the deadline (time.time()) or, when `examples` is given, until they add up to it
    (plan_chunks over `parts` workers), whichever comes first. Lazy: a runner pulls the
    next one when a worker frees up."""
    planned: Iterable[Chunk] = (
        plan_chunks(examples, seed, parts, size)
        if examples is not None
        else (Chunk(i, seed + i, size) for i in itertools.count())
    )
    for chunk in planned:
        if time.time() >= deadline:
            return
        yield chunk


def run_campaign(
    recipe: TargetRecipe,
    local: Target,
    suite_settings: SuiteSettings,
    chunks: Iterable[Chunk],
    runner: ChunkRunner,
    *,
    keep_going: bool = False,
    database: DatabaseSource | None = None,
    trace_dir: Path | None = None,
    on_progress: Callable[[CampaignTally], None] | None = None,
) -> CampaignResult:
    """Run the chunks on the runner (the work: ChunkWork over the recipe) and merge what
    comes back; `local` is the same target built here, to replay the first failure on.
    suite_settings.seed must be set (it names the run and its trace). An interrupt stops
    the workers and keeps what finished."""
    assert suite_settings.seed is not None, "a campaign's seed is chosen by its caller"
    work = ChunkWork(recipe, suite_settings, database)
    started = time.perf_counter()
    campaign = CampaignResult(SuiteResult(local.profile, suite_settings.seed, 0, CheckStats(), 0.0))

    def merge(outcome: ChunkResult) -> Merged:
        stop = _merge(campaign, outcome, local, recipe, trace_dir, keep_going)
        return Merged(stop, len(campaign.findings))

    interrupted = gather_chunks(runner, work, chunks, merge, on_progress)
    if interrupted is not None:
        campaign.result.interrupted = interrupted
    result = campaign.result
    result.seconds = time.perf_counter() - started
    if result.trace is not None and trace_dir is not None:
        save_trace(result, trace_dir / trace_file_name(recipe.trace_stem, result.seed))
        if campaign.findings:
            first = campaign.findings[0]
            campaign.findings[0] = replace(
                first, trace_path=result.trace_path, trace_error=result.trace_error
            )
    return campaign


class CountedOutcome(Protocol):
    """What gather_chunks needs of a chunk's outcome: its chunk and its counts."""

    @property
    def chunk(self) -> Chunk: ...

    @property
    def examples(self) -> int: ...

    @property
    def steps(self) -> int: ...


Outcome = TypeVar("Outcome", bound=CountedOutcome)


class Merged(NamedTuple):
    """What merging one chunk's outcome decided: whether the run stops there, and how
    many distinct failures it has kept so far (for the progress bar)."""

    stop: bool
    findings: int


def gather_chunks(
    runner: ChunkRunner,
    work: Callable[[Chunk], Outcome],
    chunks: Iterable[Chunk],
    merge: Callable[[Outcome | WorkerLost[Chunk] | WorkerCrashed[Chunk]], Merged],
    on_progress: Callable[[CampaignTally], None] | None = None,
) -> KeyboardInterrupt | None:
    """The loop every parallel run shares (the suite's chunks, swarm mode's): the work on
    the runner, each outcome merged in chunk order until merge says stop or the chunks run
    out, progress over every chunk passed on as a CampaignTally. An interrupt stops the
    workers and is returned (what finished is merged already); the workers still running
    are stopped however the loop ends."""
    tally = CampaignTally()
    # Any interrupt counted from here on must stop the loop, even one whose
    # KeyboardInterrupt a finalizer swallowed (signals.raise_if_signalled_since).
    signals_before = interrupt_signals()

    def progress(chunk: Chunk, payload: object) -> None:
        raise_if_signalled_since(signals_before)
        tally.reported(chunk, payload)
        if on_progress is not None:
            on_progress(tally)

    results = runner.map_chunks(work, chunks, progress)
    try:
        for outcome in results:
            merged = merge(outcome)
            if isinstance(outcome, WorkerLost | WorkerCrashed):
                tally.finished(outcome.chunk, 0, 0)
            else:
                tally.finished(outcome.chunk, outcome.examples, outcome.steps)
            tally.findings = merged.findings
            if on_progress is not None:
                on_progress(tally)
            if merged.stop:
                break
            raise_if_signalled_since(signals_before)  # what finished is merged first
        raise_if_signalled_since(signals_before)
    except KeyboardInterrupt as err:
        return err
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # stops the workers still running
    return None


def run_suite_parallel(
    factory: EngineFactory,
    profile: Profile,
    suite_settings: SuiteSettings,
    workers: int,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    trace_dir: Path | None = None,
    runner: ChunkRunner | None = None,
) -> SuiteResult:
    """run_suite split over `workers` processes (forked, unless another runner is given);
    the same result type. An interrupt stops the workers and keeps what finished."""
    seed = suite_settings.seed if suite_settings.seed is not None else random.randrange(2**32)
    chunks = plan_chunks(suite_settings.examples, seed, parts=workers)
    target = SingleEngine(factory, profile)
    chosen_runner = runner if runner is not None else ForkedWorkers(min(workers, len(chunks)))
    campaign = run_campaign(
        BuiltTarget(target, config_strategy),
        target,
        replace(suite_settings, seed=seed),
        chunks,
        chosen_runner,
        trace_dir=trace_dir,
    )
    return campaign.result


def _merge(
    campaign: CampaignResult,
    outcome: ChunkResult,
    local: Target,
    recipe: TargetRecipe,
    trace_dir: Path | None,
    keep_going: bool,
) -> bool:
    """Add a chunk's outcome to the campaign; True when the run stops there."""
    result = campaign.result
    campaign.chunks += 1
    if isinstance(outcome, WorkerLost | WorkerCrashed):
        campaign.lost += 1
        result.other_error = lost_chunk(campaign.findings, outcome) or result.other_error
        return not keep_going
    _add_counts(result, outcome)
    if outcome.config_strategy_error is not None:
        result.other_error = ConfigStrategyError(outcome.config_strategy_error)
        return True
    if outcome.interrupted:
        result.interrupted = KeyboardInterrupt()
    if outcome.failed and outcome.label is not None and outcome.trace is not None:
        trace = trace_from_json(outcome.trace)
        key = (outcome.label, json.dumps(outcome.trace, sort_keys=True))
        if key not in campaign.seen:
            campaign.seen.add(key)
            if not campaign.findings:
                _rebuild_failure(result, trace, local)
                found = Finding(outcome.label, outcome.chunk.seed, len(trace.events), None)
            else:
                found = kept_finding(
                    outcome.label, outcome.chunk, trace, recipe.trace_stem, trace_dir
                )
            campaign.findings.append(found)
    return outcome.interrupted or (outcome.failed and not keep_going)


def _add_counts(result: SuiteResult, outcome: ChunkOutcome) -> None:
    stats = result.stats
    for key, runs in outcome.kind_runs.items():
        stats.kind_runs[key] = stats.kind_runs.get(key, 0) + runs
    for corner, steps in outcome.corners.items():
        stats.corners[corner] = stats.corners.get(corner, 0) + steps
    stats.steps += outcome.steps
    stats.events += outcome.events
    first = outcome.first_failure_example
    if outcome.failed and first is not None and result.first_failure_example is None:
        result.first_failure_example = result.examples + first
    result.examples += outcome.examples


def lost_chunk(
    findings: list[Finding], outcome: WorkerLost[Chunk] | WorkerCrashed[Chunk]
) -> BaseException | None:
    """A chunk whose worker was lost or crashed, added to a campaign's findings (with no
    trace); its error when it is the campaign's first failure, the run's then."""
    first = not findings
    label = "worker lost" if isinstance(outcome, WorkerLost) else "harness error in a worker"
    findings.append(Finding(label, outcome.chunk.seed, None, None))
    return worker_error(outcome) if first else None


def worker_error(outcome: WorkerLost[Chunk] | WorkerCrashed[Chunk]) -> BaseException:
    """What a lost or crashed worker is as the run's error: an engine error (the engine
    ended its worker) or the harness's own, with the worker's traceback."""
    if isinstance(outcome, WorkerLost):
        return WorkerLostError(outcome)
    return WorkerCrashedError(
        f"the harness raised in the worker of seed {outcome.chunk.seed}:\n{outcome.traceback}"
    )


def kept_finding(
    label: str, chunk: Chunk, trace: Trace, trace_stem: str, trace_dir: Path | None
) -> Finding:
    """A later failure of a campaign, its trace written under its chunk's seed (the
    first failure's trace has the run's seed, which no later chunk has)."""
    if trace_dir is None:
        return Finding(label, chunk.seed, len(trace.events), None)
    path = trace_dir / trace_file_name(trace_stem, chunk.seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        trace.save(path)
    except OSError as err:
        problem = f"could not write the trace {path}: {err.strerror or err}"
        return Finding(label, chunk.seed, len(trace.events), None, problem)
    return Finding(label, chunk.seed, len(trace.events), path)


def _rebuild_failure(result: SuiteResult, trace: Trace, local: Target) -> None:
    """Replay the worker's minimal trace here, so the result carries a real error."""
    result.trace = trace
    try:
        replay_target(local, trace)
    except (Exception, EngineHalt) as err:
        record_failure(result, err)
    else:
        unrepeated = RuntimeError(
            f"the failing trace passed on replay (is the engine deterministic?): {trace.note}"
        )
        mark_engine_call(unrepeated, "a replay of its failing trace")
        result.other_error = unrepeated
