"""Every call into the engine under test goes through one door: GuardedEngine.

On the way back from each adapter call it
- stops a call at the watchdog's time limit (watchdog.StepTimeoutError);
- tags whatever the engine raised with the call (engine_errors.engine_call_of), so a
  report can tell the engine's failures from the harness's own;
- turns an attempt to end the process, sys.exit or os._exit, into EngineExitError: a
  run must never end with exit status 0 having checked nothing. (os._exit is trapped
  by standing in for it during the call; an engine that ends the process from native
  code, or from a thread of its own, is beyond reach: a run in `--workers` processes
  reports that as an engine error too, parallel.py.)
- refuses a return value of the wrong type (EngineContractError);
- turns a KeyboardInterrupt the engine raised itself, with no signal behind it, into
  EngineInterruptError: the engine's bug, not the user's Ctrl-C (engines/signals.py);
  and raises one for a signal that came during the call but whose KeyboardInterrupt a
  finalizer swallowed (signals.raise_if_signalled_since).

guarded(factory, watchdog) builds engines behind the door. Building is guarded the
same way, under a limit of its own (watchdog.BUILD_TIMEOUT, ten minutes): a real
engine's first build may import and initialize far more than any step does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from schedspec.engines.capabilities import claimed_capabilities
from schedspec.engines.errors import (
    BUILDING,
    EngineContractError,
    EngineExitError,
    EngineHalt,
    EngineInterruptError,
    mark_engine_call,
)
from schedspec.engines.profiles import claimed_profiles
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.engines.signals import interrupt_signals, raise_if_signalled_since
from schedspec.engines.watchdog import BUILD_TIMEOUT, Watchdog
from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
    State,
)

T = TypeVar("T")


def through_the_door(
    call: str,
    function: Callable[..., T],
    *args: Any,
    watchdog: Watchdog | None = None,
    limit: float | None = None,
) -> T:
    """function(*args) as an engine call named `call` (see the module docstring), under
    the watchdog's step limit, or `limit` seconds where given."""
    real_exit = os._exit
    signals_before = interrupt_signals()

    def trapped_exit(status: int) -> NoReturn:
        raise EngineExitError(call, status)

    setattr(os, "_exit", trapped_exit)  # noqa: B010  (standing in for a module function)
    try:
        if watchdog is None:
            result = function(*args)
        else:
            result = watchdog.run(call, function, *args, limit=limit)
        # A signal came during the call, and its KeyboardInterrupt was raised inside a
        # finalizer the call ran, where Python only reports it: the user's Ctrl-C all the same.
        raise_if_signalled_since(signals_before)
        return result
    except SystemExit as err:
        raise EngineExitError(call, err.code) from None
    except KeyboardInterrupt as err:
        if signals_before is not None and interrupt_signals() == signals_before:
            raise EngineInterruptError(call) from err  # no signal came: the engine's own
        raise
    except EngineHalt:
        raise
    except BaseException as err:
        mark_engine_call(err, call)
        raise
    finally:
        setattr(os, "_exit", real_exit)  # noqa: B010


def _expect(call: str, value: object, kind: type, what: str) -> None:
    if not isinstance(value, kind):
        raise EngineContractError(call, f"returned {type(value).__name__}, not {what}")


class GuardedEngine:
    """Passes every call through to the engine, through the door."""

    def __init__(self, inner: EngineAdapter, watchdog: Watchdog | None = None) -> None:
        self.inner = inner
        self.watchdog = watchdog
        self.profiles = through_the_door(BUILDING, claimed_profiles, inner)
        self.capabilities = through_the_door(BUILDING, claimed_capabilities, inner)

    def _call(self, call: str, function: Callable[..., T], *args: Any) -> T:
        return through_the_door(call, function, *args, watchdog=self.watchdog)

    def add_request(self, request: Request) -> None:
        self._call("add_request()", self.inner.add_request, request)

    def schedule(self) -> SchedulerOutput:
        output = self._call("schedule()", self.inner.schedule)
        _expect("schedule()", output, SchedulerOutput, "a SchedulerOutput")
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        reported = self._call(
            "update_from_output()",
            self.inner.update_from_output,
            scheduler_output,
            model_runner_output,
        )
        if reported is not None:
            _expect(
                "update_from_output()", reported, Mapping, "a mapping of RequestOutputs or None"
            )
        return reported

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        self._call("update_draft_token_ids()", self.inner.update_draft_token_ids, draft_token_ids)

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        self._call("finish_requests()", self.inner.finish_requests, request_ids)

    def snapshot(self) -> State:
        state = self._call("snapshot()", self.inner.snapshot)
        _expect("snapshot()", state, State, "a State")
        return state


# Set on the factories guarded() returns, so that guarding one again changes nothing.
_GUARDED = "schedspec_guarded"


def guarded(factory: EngineFactory, watchdog: Watchdog | None = None) -> EngineFactory:
    """The factory's engines behind the door (building them too, under BUILD_TIMEOUT
    rather than the step limit).
    A factory guarded already is returned as it is: the command line guards with its
    watchdog first, and the library's own guarding (CheckedEngine.from_factory) then
    adds nothing."""
    if getattr(factory, _GUARDED, False):
        return factory

    def build(config: SchedulerConfig) -> EngineAdapter:
        inner = through_the_door(BUILDING, factory, config, watchdog=watchdog, limit=BUILD_TIMEOUT)
        return GuardedEngine(inner, watchdog)

    setattr(build, _GUARDED, True)
    return build
