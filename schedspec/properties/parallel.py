"""run_suite over several processes: one Hypothesis run per core, each with its own seed.

Hypothesis itself is single-threaded, and the checked engine is pure Python, so
the way to use a multi-core CI machine is more processes. Worker i runs seed + i
on its share of the examples; the first failing worker (lowest index) is
reported, its trace replayed here to rebuild the error (exceptions need not
cross the process boundary, traces do).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from schedspec.properties.adapter import EngineFactory
from schedspec.properties.checked_engine import CheckStats, InvariantViolationError, replay
from schedspec.properties.suite import SuiteResult, SuiteSettings, run_suite
from schedspec.properties.trace import FAILURE_TRACE_STEM, Trace, trace_file_name, trace_from_json
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile


@dataclass(frozen=True)
class _Job:
    factory: EngineFactory
    profile: Profile
    settings: SuiteSettings
    config_strategy: st.SearchStrategy[SchedulerConfig] | None


@dataclass(frozen=True)
class _Outcome:
    """What a worker sends back: plain data only."""

    kind_runs: dict[Any, int]
    steps: int
    events: int
    examples: int
    failed: bool
    trace: dict[str, Any] | None


# Set in the parent before forking: factories and strategies need not pickle.
_JOB: _Job | None = None


def _work(index: int, examples: int) -> _Outcome:
    assert _JOB is not None
    seed = (_JOB.settings.seed or 0) + index
    share = replace(_JOB.settings, examples=examples, seed=seed)
    result = run_suite(_JOB.factory, _JOB.profile, share, _JOB.config_strategy)
    return _Outcome(
        dict(result.stats.kind_runs),
        result.stats.steps,
        result.stats.events,
        result.examples,
        not result.passed,
        result.trace.to_json() if result.trace is not None else None,
    )


def run_suite_parallel(
    factory: EngineFactory,
    profile: Profile,
    suite_settings: SuiteSettings,
    workers: int,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    trace_dir: Path | None = None,
) -> SuiteResult:
    """run_suite split over `workers` forked processes (Linux); the same result type."""
    global _JOB
    seed = suite_settings.seed if suite_settings.seed is not None else random.randrange(2**32)
    _JOB = _Job(factory, profile, replace(suite_settings, seed=seed), config_strategy)
    shares = [suite_settings.examples // workers] * workers
    shares[0] += suite_settings.examples - sum(shares)
    started = time.perf_counter()
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            outcomes = pool.starmap(_work, enumerate(shares))
    finally:
        _JOB = None
    stats = CheckStats()
    for outcome in outcomes:
        for key, runs in outcome.kind_runs.items():
            stats.kind_runs[key] = stats.kind_runs.get(key, 0) + runs
        stats.steps += outcome.steps
        stats.events += outcome.events
    result = SuiteResult(
        profile, seed, sum(o.examples for o in outcomes), stats, time.perf_counter() - started
    )
    failed = next((o for o in outcomes if o.failed), None)
    if failed is not None and failed.trace is not None:
        _rebuild_failure(result, trace_from_json(failed.trace), factory, profile, trace_dir)
    return result


def _rebuild_failure(
    result: SuiteResult,
    trace: Trace,
    factory: EngineFactory,
    profile: Profile,
    trace_dir: Path | None,
) -> None:
    """Replay the worker's minimal trace here, so the result carries a real error."""
    result.trace = trace
    try:
        replay(trace, factory, profile)
    except InvariantViolationError as err:
        result.error = err
    except Exception as err:
        result.other_error = err
    else:
        result.other_error = RuntimeError(f"the failing trace passed on replay: {trace.note}")
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        result.trace_path = trace_dir / trace_file_name(FAILURE_TRACE_STEM, result.seed)
        trace.save(result.trace_path)
