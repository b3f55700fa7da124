"""What the harness calls an engine's failure, as opposed to its own.

A verdict is only as good as its attribution: a crash inside the engine under test is a
finding (exit 4), a crash of schedspec itself is not (a harness error). Every call into
an engine crosses engine_boundary.GuardedEngine, which tags what the engine raised
with the call (engine_call_of) and turns the two ways an engine can end a run without
raising into errors of their own here: a call that never returns (a hang,
watchdog.StepTimeoutError) and a call that ends the process (EngineExitError). Both
derive from EngineHalt, a BaseException: an engine's own `except Exception` must not
swallow them, CheckedEngine must not take them for a refused request, and Hypothesis
stops at once instead of shrinking.
"""

from __future__ import annotations

from collections.abc import Callable

# Set on an exception raised inside an engine call: the call, e.g. "schedule()".
_ENGINE_CALL = "schedspec_engine_call"
# What building an engine (the factory's call) is called in messages.
BUILDING = "building the engine"


class EngineHalt(BaseException):
    """An engine call that did not return: it hung, or it ended the process."""

    call: str


class EngineExitError(EngineHalt):
    """The engine tried to end the process (sys.exit, os._exit) inside a call."""

    def __init__(self, call: str, status: object) -> None:
        super().__init__(f"the engine tried to end the process (exit status {status!r}) in {call}")
        self.call = call
        self.status = status


class EngineContractError(Exception):
    """An engine call returned something the adapter protocol rules out (the wrong type,
    or a State or SchedulerOutput the harness cannot read)."""

    def __init__(self, call: str, detail: str) -> None:
        super().__init__(f"{call} {detail}")
        self.call = call


class EngineInterruptError(Exception):
    """The engine raised KeyboardInterrupt itself in a call, with no signal behind it
    (engines/signals.py): its error, not the user's Ctrl-C."""

    def __init__(self, call: str) -> None:
        super().__init__(f"the engine raised KeyboardInterrupt in {call}, with no signal behind it")
        self.call = call


def mark_engine_call(err: BaseException, call: str) -> None:
    """Record that `err` was raised by the engine inside `call` (the first call wins:
    an error re-raised through an outer call keeps where it started)."""
    if getattr(err, _ENGINE_CALL, None) is None:
        setattr(err, _ENGINE_CALL, call)  # every exception instance has a __dict__


def engine_call_of(err: BaseException) -> str | None:
    """The engine call `err` came out of, or None if the engine did not raise it."""
    if isinstance(err, EngineHalt | EngineContractError | EngineInterruptError):
        return err.call
    call = getattr(err, _ENGINE_CALL, None)
    return call if isinstance(call, str) else None


def engine_error_in(err: BaseException) -> BaseException | None:
    """The engine's own error in `err`: err itself, or the first one inside an exception
    group (Hypothesis raises a group for several distinct failures, and a FlakyFailure
    holding the engine's error when replaying the example did not repeat it)."""
    return first_in_groups(err, lambda inner: engine_call_of(inner) is not None)


def first_in_groups(
    err: BaseException, wanted: Callable[[BaseException], bool]
) -> BaseException | None:
    """err if it is wanted, else the first wanted exception inside it where err is an
    exception group (depth first, in order); None if there is none."""
    if wanted(err):
        return err
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = first_in_groups(inner, wanted)
            if found is not None:
                return found
    return None
