"""Interrupts: Ctrl-C, and SIGTERM and SIGHUP treated the same way.

Python turns SIGINT into KeyboardInterrupt in the main thread; a CI runner that
cancels a job sends SIGTERM instead, and a closed terminal SIGHUP, whose default
action ends the process on the spot: no report, no trace, and worker processes left
running. While a command runs, terminations_interrupt() makes both raise
TerminationInterrupt, a KeyboardInterrupt, so every layer that cleans up after Ctrl-C
(the suite keeps the failure found so far, the worker pool stops its processes, the
reports are written) does the same for them. The command then exits 128 + the signal's
number, as a shell reports a process that signal ended.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from schedspec.engines.signals import count_interrupt_signal, interrupt_signals_counted

# The signals turned into interrupts, where the platform has them.
TERMINATIONS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class TerminationInterrupt(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread as Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The first termination signal received while terminations_interrupt() is active. Native
# code that checks for signals while it blocks (Ray's ray.wait) may turn the handler's
# TerminationInterrupt into a plain KeyboardInterrupt; the signal behind it is kept here.
_received: list[int] = []


def interrupt_signal(err: KeyboardInterrupt) -> int:
    """The signal behind an interrupt: a plain KeyboardInterrupt is SIGINT's unless a
    termination signal was received (and turned into it on the way)."""
    if isinstance(err, TerminationInterrupt):
        return err.signum
    return _received[0] if _received else int(signal.SIGINT)


def interrupt_exit_code(err: KeyboardInterrupt) -> int:
    return 128 + interrupt_signal(err)


def interrupt_name(err: KeyboardInterrupt) -> str:
    return signal.Signals(interrupt_signal(err)).name


def _raise_termination(signum: int, frame: FrameType | None) -> None:
    count_interrupt_signal()
    if not _received:
        _received.append(signum)
    raise TerminationInterrupt(signum)


@contextmanager
def terminations_interrupt() -> Iterator[None]:
    """For the duration, SIGTERM and SIGHUP raise TerminationInterrupt (main thread only:
    elsewhere signal handlers cannot be set, and the defaults stay)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.signal(signum, _raise_termination) for signum in TERMINATIONS}
    _received.clear()
    try:
        with interrupt_signals_counted():  # so the engine's own KeyboardInterrupt is its error
            yield
    finally:
        _received.clear()
        for signum, handler in saved.items():
            signal.signal(signum, handler)
