"""The public entry point: run the invariant suite against an engine factory."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from schedspec.properties.adapter import EngineFactory
from schedspec.properties.checked_engine import CheckStats, InvariantViolationError, replay
from schedspec.properties.minimize import minimize_trace
from schedspec.properties.state_machine import SuiteRecorder, make_state_machine
from schedspec.properties.trace import Trace
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile

ALL_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)


@dataclass(frozen=True)
class SuiteSettings:
    """How hard to look: Hypothesis examples, rules per example, and the seed."""

    examples: int = 100
    rules_per_example: int = 40
    seed: int | None = None  # None: a fresh random seed, reported in the result
    shrink: bool = True  # off: report the first failure found, unshrunk (faster)

    @staticmethod
    def quick() -> SuiteSettings:
        """The CI profile."""
        return SuiteSettings(examples=100, rules_per_example=40)

    @staticmethod
    def long() -> SuiteSettings:
        """The long profile (SCHEDSPEC_LONG=1 or --long)."""
        return SuiteSettings(examples=2000, rules_per_example=100)


@dataclass
class SuiteResult:
    profile: Profile
    seed: int
    examples: int
    stats: CheckStats
    seconds: float
    error: InvariantViolationError | None = None
    trace: Trace | None = None  # the shrunk counterexample, when a failure is set
    trace_path: Path | None = None
    other_error: BaseException | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        return self.error is None and self.other_error is None


def run_suite(
    factory: EngineFactory,
    profile: Profile = "vllm-v1",
    suite_settings: SuiteSettings | None = None,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    trace_dir: Path | None = None,
    on_example: Callable[[SuiteRecorder], None] | None = None,
) -> SuiteResult:
    """Drive the engine through random workloads, checking every invariant of `profile`.

    Returns a result rather than raising: on failure it holds the shrunk
    counterexample as a trace (written to trace_dir when given).
    """
    chosen = suite_settings or SuiteSettings.quick()
    seed = chosen.seed if chosen.seed is not None else random.randrange(2**32)
    recorder = SuiteRecorder()
    machine = make_state_machine(factory, profile, config_strategy, recorder)
    if on_example is not None:
        _report_each_example(machine, recorder, on_example)
    hypothesis.seed(seed)(machine)
    run_settings = settings(
        max_examples=chosen.examples,
        stateful_step_count=chosen.rules_per_example,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        # report_multiple_bugs stays on: turning it off also cut shrinking short
        # here (a 33-event counterexample instead of 2). Distinct failures then
        # arrive as an exception group, unpacked below.
        phases=ALL_PHASES if chosen.shrink else NO_SHRINK,
    )
    started = time.perf_counter()
    result = SuiteResult(profile, seed, 0, recorder.stats, 0.0)
    try:
        run_state_machine_as_test(machine, settings=run_settings)
    except Exception as err:  # an engine crash is a failure too, reported as such
        violation = _first_violation(err)
        if violation is not None:
            result.error = violation
        else:
            result.other_error = err
        result.trace = recorder.last_failure
    if result.trace is not None and result.error is not None and chosen.shrink:
        result.trace, result.error = _minimized(result.trace, result.error, factory, profile)
    result.seconds = time.perf_counter() - started
    result.examples = recorder.examples
    if result.trace is not None and trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        result.trace_path = trace_dir / f"schedspec-failure-{seed}.json"
        result.trace.save(result.trace_path)
    return result


def _minimized(
    trace: Trace, error: InvariantViolationError, factory: EngineFactory, profile: Profile
) -> tuple[Trace, InvariantViolationError]:
    """Hypothesis' shrunk trace made 1-minimal over its events, with the violation
    the minimal trace shows (kept as the trace's note)."""
    smaller = minimize_trace(trace, factory, profile)
    try:
        replay(smaller, factory, profile)
    except InvariantViolationError as err:
        return Trace(smaller.config, smaller.events, smaller.model, note=str(err)), err
    return trace, error


def _first_violation(err: BaseException) -> InvariantViolationError | None:
    """The invariant violation in what Hypothesis raised (maybe inside a group)."""
    if isinstance(err, InvariantViolationError):
        return err
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = _first_violation(inner)
            if found is not None:
                return found
    return None


def _report_each_example(
    machine: type[RuleBasedStateMachine],
    recorder: SuiteRecorder,
    on_example: Callable[[SuiteRecorder], None],
) -> None:
    """Call on_example after each example's teardown (for progress bars)."""
    teardown = machine.teardown

    def reporting_teardown(self: RuleBasedStateMachine) -> None:
        try:
            teardown(self)
        finally:
            on_example(recorder)

    setattr(machine, "teardown", reporting_teardown)  # noqa: B010  (a method, patched on the class)
