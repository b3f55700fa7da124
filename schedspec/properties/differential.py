"""The lockstep differential runner: one trace into two engines, compared after every call.

Each engine sits in its own CheckedEngine (so every invariant of the
profile is checked on both) over a RecordingEngine (so every schedule()
output, model answer and snapshot is kept). Lockstep applies each event to
the left engine, then to the right, and compares what the two recorded,
call by call: the first disagreement raises DivergenceError.

Two engines given the same events see the same model: each CheckedEngine
builds its own FakeModel from the trace's ModelParams, and a FakeModel's
answers depend only on those parameters and the SchedulerOutputs it is
shown, so identical decisions get identical tokens (the comparison checks
that too, as "model output").

Lockstep is a harness target like CheckedEngine, so the Hypothesis state
machine, run_target and the minimizer drive it unchanged: run_diff finds,
shrinks and writes divergences exactly as run_suite does violations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from schedspec.engines.capabilities import Capability
from schedspec.engines.errors import EngineHalt
from schedspec.engines.events import Event
from schedspec.engines.profiles import ProfileError, probe_capabilities
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.recording import Observation, RecordingEngine, Scheduled
from schedspec.properties.checked_engine import CheckedEngine, CheckStats, InvariantViolationError
from schedspec.properties.state_machine import SuiteRecorder
from schedspec.properties.suite import SuiteResult, SuiteSettings, run_target
from schedspec.spec import SchedulerConfig, SchedulerOutput, State
from schedspec.spec.invariants import Profile, family_of
from schedspec.traces.divergence import Divergence, DivergenceError, first_difference
from schedspec.traces.trace import DIFF_TRACE_STEM, ModelParams, Trace

SIDES = ("left", "right")


@dataclass(frozen=True)
class DiffOptions:
    # Off by default: two pools may number blocks differently and still make
    # the same decisions; the block counts per request are compared always.
    compare_block_ids: bool = False


class SideViolationError(InvariantViolationError):
    """An invariant broke in one engine of a lockstep pair; says which."""

    def __init__(self, side: str, err: InvariantViolationError) -> None:
        super().__init__(err.event_index, err.event, err.violations)
        self.side = side
        self.args = (f"({side} engine) {err}",)


class Lockstep:
    """Two engines driven event by event and compared after every engine call.

    Within one event a broken invariant or an engine error on either side
    is reported before a divergence: it is a bug in that engine whatever
    the other one does. The left engine's state feeds the state machine's
    rules (both are the same until they diverge).
    """

    def __init__(
        self,
        left: EngineFactory,
        right: EngineFactory,
        config: SchedulerConfig,
        profile: Profile,
        model: ModelParams,
        options: DiffOptions = DiffOptions(),
        stats: CheckStats | None = None,
    ) -> None:
        self.config = config
        self.options = options
        self.event_index = -1
        self.recorders: list[RecordingEngine] = []
        self.checked: list[CheckedEngine] = []
        # Check counts are per engine: the left engine's go to the run's stats.
        for side, factory, side_stats in zip(SIDES, (left, right), (stats, None), strict=True):
            try:
                recorder = RecordingEngine(factory(config))
                checked = CheckedEngine(recorder, config, profile, model, side_stats)
            except ProfileError:
                raise
            except (Exception, EngineHalt) as err:
                err.add_note(_note(side))
                raise
            self.recorders.append(recorder)
            self.checked.append(checked)
        self._compare(None, [None, None])

    @property
    def state(self) -> State:
        return self.checked[0].state

    @property
    def stats(self) -> CheckStats:
        return self.checked[0].stats

    def trace(self, note: str = "") -> Trace:
        return self.checked[0].trace(note)

    def observations(self, side: int) -> list[Observation]:
        """What that engine did during the latest event (or its first snapshot)."""
        return self.recorders[side].observations

    def outputs(self, side: int) -> list[SchedulerOutput]:
        return [o.output for o in self.observations(side) if isinstance(o, Scheduled)]

    def apply(self, event: Event) -> None:
        self.event_index += 1
        errors: list[BaseException | None] = []
        for recorder, checked in zip(self.recorders, self.checked, strict=True):
            recorder.observations = []  # one event's worth: the pair compares it, then drops it
            try:
                checked.apply(event)
                errors.append(None)
            except (Exception, EngineHalt) as err:
                errors.append(err)
        self._compare(event, errors)

    def _compare(self, event: Event | None, errors: list[BaseException | None]) -> None:
        logs = [self.observations(0), self.observations(1)]
        failures = [
            (len(log), side, err)
            for log, side, err in zip(logs, SIDES, errors, strict=True)
            if err is not None
        ]
        if failures:
            # The side that stopped first (fewer calls made) failed first; left on a tie.
            _, side, err = min(failures, key=lambda f: f[0])
            raise _labelled(side, err)
        schedules = 0  # schedule() calls seen so far: a drain makes many
        for left, right in zip(*logs, strict=False):
            schedules += isinstance(left, Scheduled)
            found = first_difference(left, right, self.options.compare_block_ids)
            if found is not None:
                observed, name, lv, rv, request_id = found
                step = max(schedules - 1, 0)  # the step the differing call belongs to
                raise DivergenceError(
                    Divergence(self.event_index, event, step, observed, name, lv, rv, request_id)
                )
        if len(logs[0]) != len(logs[1]):  # agreed on everything, yet one made more calls
            left_calls, right_calls = len(logs[0]), len(logs[1])
            step = max(schedules - 1, 0)
            extra = Divergence(
                self.event_index, event, step, "engine calls", "count", left_calls, right_calls
            )
            raise DivergenceError(extra)


def _labelled(side: str, err: BaseException) -> BaseException:
    if isinstance(err, InvariantViolationError):
        return SideViolationError(side, err)
    err.add_note(_note(side))
    return err


def _note(side: str) -> str:
    return f"raised by the {side} engine"


def failing_side(err: BaseException) -> str | None:
    """Which engine of a lockstep pair a violation or an engine error came from."""
    if isinstance(err, SideViolationError):
        return err.side
    notes = getattr(err, "__notes__", ())
    return next((side for side in SIDES if _note(side) in notes), None)


@dataclass(frozen=True)
class LockstepTarget:
    """Two engines in lockstep, as a target for the state machine and the minimizer."""

    left: EngineFactory
    right: EngineFactory
    profile: Profile
    options: DiffOptions = DiffOptions()

    def capabilities(self) -> frozenset[Capability]:
        family = family_of(self.profile) or "vllm"
        return probe_capabilities([self.left, self.right], family)

    def start(self, config: SchedulerConfig, model: ModelParams, stats: CheckStats) -> Lockstep:
        return Lockstep(self.left, self.right, config, self.profile, model, self.options, stats)


# ----------------------------------------------------------- one trace


@dataclass
class DiffEntry:
    index: int
    event: Event
    outputs: tuple[list[SchedulerOutput], list[SchedulerOutput]]  # left's, right's


@dataclass
class DiffResult:
    entries: list[DiffEntry]
    stats: CheckStats  # the left engine's checks (the right made the same, until a failure)
    divergence: Divergence | None = None
    violation: InvariantViolationError | None = None
    error: BaseException | None = field(default=None, repr=False)  # an engine crash or hang

    @property
    def passed(self) -> bool:
        return self.divergence is None and self.violation is None and self.error is None

    @property
    def side(self) -> str | None:
        """The engine that broke an invariant or raised, if one did."""
        failure = self.violation or self.error
        return None if failure is None else failing_side(failure)


def diff_trace(
    trace: Trace,
    left: EngineFactory,
    right: EngineFactory,
    profile: Profile,
    options: DiffOptions = DiffOptions(),
) -> DiffResult:
    """Replay a trace on two engines in lockstep, stopping at the first failure.

    Never raises for what the engines do (a ProfileError is the caller's).
    """
    result = DiffResult([], CheckStats())
    try:
        lockstep = Lockstep(left, right, trace.config, profile, trace.model, options, result.stats)
    except (Exception, EngineHalt) as err:
        if isinstance(err, ProfileError):
            raise
        _file(result, err)
        return result
    for index, event in enumerate(trace.events):
        try:
            lockstep.apply(event)
        except (Exception, EngineHalt) as err:
            _file(result, err)
        result.entries.append(DiffEntry(index, event, (lockstep.outputs(0), lockstep.outputs(1))))
        if not result.passed:
            break
    return result


def _file(result: DiffResult, err: BaseException) -> None:
    if isinstance(err, DivergenceError):
        result.divergence = err.divergence
    elif isinstance(err, InvariantViolationError):
        result.violation = err
    else:
        result.error = err


# ------------------------------------------------------- random workloads


def run_diff(
    left: EngineFactory,
    right: EngineFactory,
    profile: Profile,
    suite_settings: SuiteSettings | None = None,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    options: DiffOptions = DiffOptions(),
    trace_dir: Path | None = None,
    on_example: Callable[[SuiteRecorder], None] | None = None,
) -> SuiteResult:
    """Random workloads through both engines in lockstep: run_suite's machinery, with the
    first divergence (shrunk and 1-minimal) in result.divergence."""
    target = LockstepTarget(left, right, profile, options)
    return run_target(
        target, suite_settings, config_strategy, trace_dir, on_example, DIFF_TRACE_STEM
    )
