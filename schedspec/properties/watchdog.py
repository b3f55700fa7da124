"""A time limit on every engine call, so a hung engine is reported instead of waited on.

SIGALRM interrupts the main thread wherever it is, inside time.sleep or a
busy loop in the engine's own code alike, and the handler raises
StepTimeoutError right there: the traceback shows where the engine was stuck.

StepTimeoutError derives from BaseException on purpose. An engine's own
`except Exception` must not swallow it; the harness must not take it for
a refused request (CheckedEngine treats an Exception from add_request as
one); and Hypothesis then stops at once instead of shrinking, where every
shrink attempt of a hang would cost the whole limit again.

Where SIGALRM is missing (Windows) or the harness runs off the main thread
(signal handlers can only be set there), the limit is off and calls run
unguarded.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, TypeVar

from schedspec.properties.adapter import EngineAdapter, EngineFactory
from schedspec.properties.profiles import claimed_profiles
from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
    State,
)

T = TypeVar("T")

# Seconds one engine call may take before it counts as hung: far above any
# real step (milliseconds), low enough that CI reports a hang, not a timeout.
DEFAULT_STEP_TIMEOUT = 10.0


class StepTimeoutError(BaseException):
    """An engine call ran past the step time limit."""

    def __init__(self, call: str, seconds: float) -> None:
        super().__init__(f"{call} ran past the step time limit of {seconds:g} s")
        self.call = call
        self.seconds = seconds


class Watchdog:
    """A context that arms SIGALRM around each guarded call.

    The handler is installed once for the whole run (entering the context)
    and only the timer is set per call: two setitimer calls per engine call.
    """

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds if seconds else None  # 0 or None: no limit
        self.active = False
        self._call = ""
        self._previous: Any = None

    def __enter__(self) -> Watchdog:
        usable = (
            hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
        )
        if self.seconds is not None and usable:
            self._previous = signal.signal(signal.SIGALRM, self._expired)
            self.active = True
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            self.active = False

    def _expired(self, signum: int, frame: FrameType | None) -> None:
        assert self.seconds is not None
        raise StepTimeoutError(self._call, self.seconds)

    def run(self, call: str, function: Callable[..., T], *args: Any) -> T:
        """function(*args), interrupted by StepTimeoutError if it runs past the limit."""
        if not self.active:
            return function(*args)
        assert self.seconds is not None
        self._call = call
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            return function(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


class TimedEngine:
    """Passes every call through to the engine under the watchdog's limit."""

    def __init__(self, inner: EngineAdapter, watchdog: Watchdog) -> None:
        self.inner = inner
        self.watchdog = watchdog
        self.profiles = claimed_profiles(inner)

    def add_request(self, request: Request) -> None:
        self.watchdog.run("add_request()", self.inner.add_request, request)

    def schedule(self) -> SchedulerOutput:
        return self.watchdog.run("schedule()", self.inner.schedule)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        return self.watchdog.run(
            "update_from_output()",
            self.inner.update_from_output,
            scheduler_output,
            model_runner_output,
        )

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        self.watchdog.run(
            "update_draft_token_ids()", self.inner.update_draft_token_ids, draft_token_ids
        )

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        self.watchdog.run("finish_requests()", self.inner.finish_requests, request_ids)

    def snapshot(self) -> State:
        return self.watchdog.run("snapshot()", self.inner.snapshot)


def time_limited(factory: EngineFactory, watchdog: Watchdog) -> EngineFactory:
    """The factory's engines, each call guarded by the watchdog.

    Building an engine is not guarded: a real engine's first build may
    import and initialize far more than any one step does.
    """

    def build(config: SchedulerConfig) -> EngineAdapter:
        return TimedEngine(factory(config), watchdog)

    return build
