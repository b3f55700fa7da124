"""Make a failing trace 1-minimal: no single event can be dropped or simplified.

Hypothesis shrinks the choices behind a state-machine run, but its deletions
often misalign the rules that follow (an earlier add changes which request a
later rule picks). Traces replay on any engine, so a last pass over the
events themselves is cheap and exact: drop one event, or reset one step's
decisions to the defaults, replay, and keep the change if the same failure
still shows: one of the invariants the original broke, a divergence in the
same field (lockstep targets), or an engine error of the same type.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from schedspec.properties.adapter import EngineFactory
from schedspec.properties.checked_engine import InvariantViolationError
from schedspec.properties.divergence import DivergenceError
from schedspec.properties.engine_errors import EngineHalt
from schedspec.properties.events import Event, Step
from schedspec.properties.harness import SingleEngine, Target, replay_target
from schedspec.properties.trace import Trace
from schedspec.properties.watchdog import StepTimeoutError
from schedspec.spec.invariants import Profile


def failure_signature(trace: Trace, target: Target) -> frozenset[str]:
    """What the trace breaks on the target at its first failing event (empty if it passes):
    invariant ids, "divergence: <what> <field>", or "engine error: <type>"."""
    try:
        replay_target(target, trace)
    except InvariantViolationError as err:
        return frozenset(v.invariant for v in err.violations)
    except DivergenceError as err:
        found = err.divergence
        return frozenset({f"divergence: {found.observed} {found.field}"})
    except StepTimeoutError:
        return frozenset({"engine hang"})
    except EngineHalt as err:  # it tried to end the process
        return frozenset({f"engine halt: {type(err).__name__}"})
    except Exception as err:  # a candidate that crashes the engine is judged, not fatal
        return frozenset({f"engine error: {type(err).__name__}"})
    return frozenset()


def failing_ids(trace: Trace, factory: EngineFactory, profile: Profile) -> frozenset[str]:
    """The invariants the trace breaks at its first broken event (empty if it passes)."""
    return failure_signature(trace, SingleEngine(factory, profile))


def minimize_trace(
    trace: Trace,
    factory: EngineFactory,
    profile: Profile,
    time_limit: float = 20.0,
    clock: Callable[[], float] = time.monotonic,
) -> Trace:
    """The smallest trace reachable by single-event drops and step simplifications
    that still breaks one of the invariants the original broke."""
    return minimize_on(trace, SingleEngine(factory, profile), time_limit, clock)


def minimize_on(
    trace: Trace,
    target: Target,
    time_limit: float = 20.0,
    clock: Callable[[], float] = time.monotonic,
) -> Trace:
    """minimize_trace for any target: a single engine, or two in lockstep."""
    wanted = failure_signature(trace, target)
    if not wanted:
        return trace  # it does not fail here: nothing to keep failing
    deadline = clock() + time_limit
    events = list(trace.events)
    changed = True
    while changed and clock() < deadline:
        changed = False
        index = len(events) - 1
        while index >= 0 and clock() < deadline:
            for candidate in _simpler(events, index):
                if wanted & failure_signature(_with(trace, candidate), target):
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
