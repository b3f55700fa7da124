"""run_suite over several processes: the examples in chunks, one Hypothesis run each.

Hypothesis itself is single-threaded, and the checked engine is pure Python, so the
way to use a multi-core CI machine is more processes. The examples are split into
chunks (suite.plan_chunks: at least one per worker, never more chunks than examples,
chunk i on seed + i) and run by a workers.ChunkRunner, forked processes by default.
The first failing chunk in chunk order is reported (so a run is the same for a seed
whatever the timing); the chunks after it are stopped. Its trace is replayed here to
rebuild the error (exceptions need not cross the process boundary, traces do): a
violation, an engine error, a hang (StepTimeoutError, as in one process), an engine
that ended its worker, or an error of the harness's own.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from schedspec.properties.adapter import EngineFactory
from schedspec.properties.checked_engine import CheckStats, InvariantViolationError, replay
from schedspec.properties.engine_errors import EngineHalt, mark_engine_call
from schedspec.properties.strategies import ConfigStrategyError
from schedspec.properties.suite import (
    Chunk,
    SuiteResult,
    SuiteSettings,
    plan_chunks,
    run_suite,
    save_trace,
)
from schedspec.properties.trace import FAILURE_TRACE_STEM, Trace, trace_file_name, trace_from_json
from schedspec.properties.workers import ChunkRunner, ForkedWorkers, WorkerCrashed, WorkerLost
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile


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
class ChunkOutcome:
    """What a worker sends back: plain data only."""

    kind_runs: dict[Any, int]
    corners: dict[str, int]
    steps: int
    events: int
    examples: int
    failed: bool
    first_failure_example: int | None
    trace: dict[str, Any] | None
    config_strategy_error: str | None  # the --configs strategy failed: no trace to replay
    # A KeyboardInterrupt ended the chunk: workers ignore Ctrl-C, so the engine raised
    # it; reported as the same interrupt would be in one process.
    interrupted: bool


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
    chosen = replace(suite_settings, seed=seed)

    def work(chunk: Chunk) -> ChunkOutcome:
        share = replace(chosen, examples=chunk.examples, seed=chunk.seed)
        return _outcome(run_suite(factory, profile, share, config_strategy))

    started = time.perf_counter()
    result = SuiteResult(profile, seed, 0, CheckStats(), 0.0)
    chosen_runner = runner if runner is not None else ForkedWorkers(min(workers, len(chunks)))
    results = chosen_runner.map_chunks(work, chunks)
    try:
        for chunk, outcome in zip(chunks, results, strict=False):
            if _merge(result, chunk, outcome, factory, profile):
                break
    except KeyboardInterrupt as err:
        result.interrupted = err
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()  # stops the workers still running
    result.seconds = time.perf_counter() - started
    if result.trace is not None and trace_dir is not None:
        save_trace(result, trace_dir / trace_file_name(FAILURE_TRACE_STEM, seed))
    return result


def _outcome(result: SuiteResult) -> ChunkOutcome:
    config_error = result.other_error
    return ChunkOutcome(
        dict(result.stats.kind_runs),
        dict(result.stats.corners),
        result.stats.steps,
        result.stats.events,
        result.examples,
        not result.passed,
        result.first_failure_example,
        result.trace.to_json() if result.trace is not None else None,
        str(config_error) if isinstance(config_error, ConfigStrategyError) else None,
        result.interrupted is not None,
    )


def _merge(
    result: SuiteResult,
    chunk: Chunk,
    outcome: ChunkOutcome | WorkerLost[Chunk] | WorkerCrashed[Chunk],
    factory: EngineFactory,
    profile: Profile,
) -> bool:
    """Add a chunk's outcome to the result; True if it failed (the run stops there)."""
    if isinstance(outcome, WorkerLost):
        result.other_error = WorkerLostError(outcome)
        return True
    if isinstance(outcome, WorkerCrashed):
        result.other_error = WorkerCrashedError(
            f"the harness raised in the worker of seed {chunk.seed}:\n{outcome.traceback}"
        )
        return True
    stats = result.stats
    for key, runs in outcome.kind_runs.items():
        stats.kind_runs[key] = stats.kind_runs.get(key, 0) + runs
    for name, reached in outcome.corners.items():
        stats.corners[name] = stats.corners.get(name, 0) + reached
    stats.steps += outcome.steps
    stats.events += outcome.events
    if outcome.failed and outcome.first_failure_example is not None:
        result.first_failure_example = result.examples + outcome.first_failure_example
    result.examples += outcome.examples
    if outcome.config_strategy_error is not None:
        result.other_error = ConfigStrategyError(outcome.config_strategy_error)
        return True
    if outcome.interrupted:
        result.interrupted = KeyboardInterrupt()
    if outcome.failed and outcome.trace is not None:
        _rebuild_failure(result, trace_from_json(outcome.trace), factory, profile)
    return outcome.failed


def _rebuild_failure(
    result: SuiteResult, trace: Trace, factory: EngineFactory, profile: Profile
) -> None:
    """Replay the worker's minimal trace here, so the result carries a real error."""
    result.trace = trace
    try:
        replay(trace, factory, profile)
    except InvariantViolationError as err:
        result.error = err
    except (Exception, EngineHalt) as err:
        result.other_error = err
    else:
        unrepeated = RuntimeError(
            f"the failing trace passed on replay (is the engine deterministic?): {trace.note}"
        )
        mark_engine_call(unrepeated, "a replay of its failing trace")
        result.other_error = unrepeated
