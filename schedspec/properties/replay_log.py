"""A trace replayed on one engine with every schedule() output kept, for the reports.

CheckedEngine keeps only abstract states, so a thin recording wrapper around
the engine (recording.py) captures every SchedulerOutput without touching the
harness; the log stops at the first failure and says which it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schedspec.engines.errors import EngineHalt
from schedspec.engines.events import Event
from schedspec.engines.protocol import EngineAdapter
from schedspec.engines.recording import RecordingEngine
from schedspec.properties.checked_engine import CheckedEngine, CheckStats, InvariantViolationError
from schedspec.spec import SchedulerOutput
from schedspec.spec.invariants import Profile
from schedspec.traces.trace import Trace


@dataclass
class ReplayEntry:
    index: int
    event: Event
    outputs: list[SchedulerOutput] = field(default_factory=list)  # schedule() calls it made


@dataclass
class ReplayLog:
    entries: list[ReplayEntry]
    stats: CheckStats
    violation: InvariantViolationError | None = None
    crash: BaseException | None = None  # the engine raised (or hung) outside the checks

    @property
    def failed(self) -> bool:
        return self.violation is not None or self.crash is not None


def replay_with_log(trace: Trace, engine: EngineAdapter, profile: Profile) -> ReplayLog:
    """Apply the trace's events to a fresh engine, stopping at the first failure.

    The caller builds the engine (and checks it claims `profile`), so errors
    from here are the engine's, never a usage error.
    """
    recorder = RecordingEngine(engine)
    try:
        checked = CheckedEngine(recorder, trace.config, profile, trace.model)
    except (Exception, EngineHalt) as err:  # its first snapshot() failed, before any event
        return ReplayLog([], CheckStats(), crash=err)
    log = ReplayLog([], checked.stats)
    for index, event in enumerate(trace.events):
        entry = ReplayEntry(index, event)
        log.entries.append(entry)
        start = len(recorder.outputs)
        recorder.observations.clear()  # only the outputs are shown; states need not pile up
        try:
            checked.apply(event)
        except InvariantViolationError as err:
            log.violation = err
        except (Exception, EngineHalt) as err:  # a crash or a hang ends the replay too
            log.crash = err
        entry.outputs = recorder.outputs[start:]
        if log.failed:
            break
    return log
