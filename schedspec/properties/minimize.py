"""Make a failing trace 1-minimal: no single event can be dropped or simplified.

Hypothesis shrinks the choices behind a state-machine run, but its deletions
often misalign the rules that follow (an earlier add changes which request a
later rule picks). Traces replay on any engine, so a last pass over the
events themselves is cheap and exact: drop one event, or reset one step's
decisions to the defaults, replay, and keep the change if the same
invariant still breaks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from schedspec.properties.adapter import EngineFactory
from schedspec.properties.checked_engine import InvariantViolationError, replay
from schedspec.properties.events import Event, Step
from schedspec.properties.trace import Trace
from schedspec.spec.invariants import Profile


def failing_ids(trace: Trace, factory: EngineFactory, profile: Profile) -> frozenset[str]:
    """The invariants the trace breaks at its first broken event (empty if it passes)."""
    try:
        replay(trace, factory, profile)
    except InvariantViolationError as err:
        return frozenset(v.invariant for v in err.violations)
    return frozenset()


def minimize_trace(
    trace: Trace,
    factory: EngineFactory,
    profile: Profile,
    time_limit: float = 20.0,
    clock: Callable[[], float] = time.monotonic,
) -> Trace:
    """The smallest trace reachable by single-event drops and step simplifications
    that still breaks one of the invariants the original broke."""
    target = failing_ids(trace, factory, profile)
    if not target:
        return trace  # it does not fail here: nothing to keep failing
    deadline = clock() + time_limit
    events = list(trace.events)
    changed = True
    while changed and clock() < deadline:
        changed = False
        index = len(events) - 1
        while index >= 0 and clock() < deadline:
            for candidate in _simpler(events, index):
                if target & failing_ids(_with(trace, candidate), factory, profile):
                    events = candidate
                    changed = True
                    break
            index = min(index, len(events)) - 1
    return _with(trace, events)


def _simpler(events: list[Event], index: int) -> list[list[Event]]:
    """Candidates one change simpler at `index`: without it, or (a step) with default decisions."""
    without = events[:index] + events[index + 1 :]
    event = events[index]
    if isinstance(event, Step) and event != Step():
        return [without, [*events[:index], Step(), *events[index + 1 :]]]
    return [without]


def _with(trace: Trace, events: list[Event]) -> Trace:
    return Trace(trace.config, tuple(events), trace.model, trace.note)
