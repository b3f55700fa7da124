"""Which KeyboardInterrupt a signal raised, and which the engine raised itself.

A KeyboardInterrupt that leaves an engine call is either Ctrl-C (or SIGTERM, SIGHUP:
cli/interrupts.py) arriving while the engine ran, which stops the run (128 + N), or the
engine's own `raise KeyboardInterrupt`, which is a bug of the engine's like any other
exception (exit 4). While interrupt_signals_counted() is active, every such signal is
counted before it raises, so the door (boundary.py) can tell the two apart by whether
the count moved during the call. Outside it (the library used on its own, the pytest
plugin) nothing is counted and every KeyboardInterrupt is taken for a signal, as before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# [signals counted so far], or [] while nothing counts them.
_count: list[int] = []


def count_interrupt_signal() -> None:
    """Count a signal that is about to raise KeyboardInterrupt (its handler calls this)."""
    if _count:
        _count[0] += 1


def interrupt_signals() -> int | None:
    """The signals counted so far, or None while nothing counts them."""
    return _count[0] if _count else None


def raise_if_signalled_since(before: int | None) -> None:
    """Raise KeyboardInterrupt if a signal was counted since interrupt_signals() gave
    `before`. A loop that would have stopped on that signal's KeyboardInterrupt calls
    this: the handler raises wherever the main thread happens to be, and where that is a
    finalizer (a __del__, a weakref callback, the garbage collector's) Python can only
    report the exception as unraisable and carry on, so without this the Ctrl-C is lost.
    Nothing is raised while signals are not counted (`before` or the count is None)."""
    now = interrupt_signals()
    if before is not None and now is not None and now > before:
        raise KeyboardInterrupt


def _sigint(signum: int, frame: FrameType | None) -> None:
    count_interrupt_signal()
    raise KeyboardInterrupt


@contextmanager
def interrupt_signals_counted() -> Iterator[None]:
    """For the duration, SIGINT is counted before it raises KeyboardInterrupt (main
    thread only, and only where Python's own SIGINT handler was installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    replace = previous is signal.default_int_handler
    if replace:
        signal.signal(signal.SIGINT, _sigint)
    _count[:] = [0]
    try:
        yield
    finally:
        _count.clear()
        if replace:
            signal.signal(signal.SIGINT, previous)
