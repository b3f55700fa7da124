"""A time limit on every engine call, so a hung engine is reported instead of waited on.

SIGALRM interrupts the main thread wherever it is, inside time.sleep or a
busy loop in the engine's own code alike, and the handler raises
StepTimeoutError right there: the traceback shows where the engine was stuck.

StepTimeoutError is an engine_errors.EngineHalt, a BaseException on purpose:
an engine's own `except Exception` must not swallow it; the harness must not
take it for a refused request (CheckedEngine treats an Exception from
add_request as one); and Hypothesis then stops at once instead of shrinking,
where every shrink attempt of a hang would cost the whole limit again.
engine_boundary.GuardedEngine runs every engine call through Watchdog.run.

Where SIGALRM is missing (Windows) or the harness runs off the main thread
(signal handlers can only be set there), the limit is off and calls run
unguarded.
"""

from __future__ import annotations

import importlib
import math
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, TypeVar

from schedspec.engines.errors import BUILDING, EngineHalt

T = TypeVar("T")

# Seconds one engine call may take before it counts as hung: far above any
# real step (milliseconds), low enough that CI reports a hang, not a timeout.
DEFAULT_STEP_TIMEOUT = 10.0
# The longest limit accepted: a day. setitimer takes any finite float, but a limit
# past the length of any CI job is no limit, and 0 says that plainly.
MAX_STEP_TIMEOUT = 86_400.0
# How long building an engine may take while a step limit is on: a real engine's first
# build imports and initializes far more than any step does (seconds to a minute for
# vLLM's scheduler), so not the step limit, but not forever either: an __init__ that
# hangs is reported as a hang (exit 5) after ten minutes.
BUILD_TIMEOUT = 600.0

# The handler installed for SIGALRM, as the C function behind signal.getsignal returns
# it: getsignal turns it into a signal.Handlers member where it can, and for a Python
# handler that costs a ValueError raised and caught, about 12 us, paid before every
# engine call (half a second of a `simulate --compare`). Same object, same comparison.
_current_handler: Callable[[int], object] = importlib.import_module("_signal").getsignal


class StepTimeoutError(EngineHalt):
    """An engine call ran past the step time limit."""

    def __init__(self, call: str, seconds: float) -> None:
        kind = "the build time limit" if call == BUILDING else "the step time limit"
        super().__init__(f"{call} ran past {kind} of {seconds:g} s")
        self.call = call
        self.seconds = seconds


class Watchdog:
    """A context that arms SIGALRM around each guarded call.

    The handler is installed once for the whole run (entering the context)
    and only the timer is set per call: two setitimer calls per engine call.
    """

    def __init__(self, seconds: float | None) -> None:
        check_step_timeout(seconds)
        self.seconds = seconds if seconds else None  # 0 or None: no limit
        self.active = False
        self._call = ""
        self._limit = 0.0  # seconds the call under way may take
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
        raise StepTimeoutError(self._call, self._limit)

    def run(
        self, call: str, function: Callable[..., T], *args: Any, limit: float | None = None
    ) -> T:
        """function(*args), interrupted by StepTimeoutError if it runs past the limit
        (the step limit, or `limit` seconds: building an engine, BUILD_TIMEOUT)."""
        if not self.active:
            return function(*args)
        assert self.seconds is not None
        self._call = call
        self._limit = limit if limit is not None else self.seconds
        if _current_handler(signal.SIGALRM) != self._expired:
            # The engine installed a SIGALRM handler of its own (building it, or in an
            # earlier call): ours again, or its hangs would escape the limit.
            signal.signal(signal.SIGALRM, self._expired)
        signal.setitimer(signal.ITIMER_REAL, self._limit)
        try:
            return function(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def check_step_timeout(seconds: float | None) -> None:
    """ValueError naming the bound unless seconds is None or in [0, MAX_STEP_TIMEOUT]."""
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"step timeout: must be a number of seconds, got {seconds!r}")
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_STEP_TIMEOUT):
        raise ValueError(
            f"step timeout: must be in [0, {MAX_STEP_TIMEOUT:g}] seconds (0: no limit), "
            f"got {seconds!r}"
        )
