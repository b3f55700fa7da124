"""Run chunks of work somewhere else and hand their results back: the worker layer.

ChunkRunner is the one interface the suite needs for parallelism: run `work` on each
chunk, yield the results in chunk order, and stop everything still running when the
caller stops reading (or is interrupted). ForkedWorkers runs each chunk in a fresh
forked process (Linux, macOS), at most `processes` at a time:

- a fresh process per chunk: memory is returned to the system after every chunk;
- a worker that ends without a result (an engine that calls os._exit from native code
  or a thread of its own, a crash, the OOM killer) yields WorkerLost for its chunk,
  never a hang of the parent or a silent gap;
- workers ignore Ctrl-C (the parent handles it and stops them) and exit on their own
  when the parent process is gone, killed even with SIGKILL: they poll their parent.

`work` need not pickle (fork copies it); its result must.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkProcess
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
C = TypeVar("C")

# How often a worker checks that its parent is alive (seconds), and how long a stopped
# worker gets to exit on SIGTERM before SIGKILL.
PARENT_POLL_SECONDS = 0.5
STOP_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class WorkerLost(Generic[C]):
    """A chunk whose worker ended without handing back a result."""

    chunk: C
    exitcode: int | None  # negative: ended by that signal

    def describe(self) -> str:
        if self.exitcode is not None and self.exitcode < 0:
            return f"was ended by {signal.Signals(-self.exitcode).name}"
        return f"exited with status {self.exitcode}"


@dataclass(frozen=True)
class WorkerCrashed(Generic[C]):
    """A chunk whose work raised in the worker (the traceback, as text)."""

    chunk: C
    traceback: str


class ChunkRunner(Protocol):
    def map_chunks(
        self, work: Callable[[C], T], chunks: Sequence[C]
    ) -> Iterator[T | WorkerLost[C] | WorkerCrashed[C]]:
        """work(chunk) for every chunk, results in chunk order. Closing the iterator
        early (or an exception in the caller while it is open) stops the work left."""
        ...


class ForkedWorkers:
    """A ChunkRunner of forked processes, one per chunk, `processes` at a time."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"processes: must be >= 1, got {processes}")
        self.processes = processes

    def map_chunks(
        self, work: Callable[[C], T], chunks: Sequence[C]
    ) -> Iterator[T | WorkerLost[C] | WorkerCrashed[C]]:
        context = multiprocessing.get_context("fork")
        parent = os.getpid()
        waiting = list(enumerate(chunks))
        running: dict[int, tuple[ForkProcess, Connection]] = {}
        done: dict[int, T | WorkerLost[C] | WorkerCrashed[C]] = {}
        next_index = 0
        try:
            while next_index < len(chunks):
                while waiting and len(running) < self.processes:
                    index, chunk = waiting.pop(0)
                    # Output buffered here would be written again by the worker at exit.
                    sys.stdout.flush()
                    sys.stderr.flush()
                    receiver, sender = context.Pipe(duplex=False)
                    process = context.Process(
                        target=_worker, args=(work, chunk, sender, parent), daemon=False
                    )
                    process.start()
                    sender.close()  # the worker's end: EOF here once it is gone
                    running[index] = (process, receiver)
                while next_index not in done:
                    _collect(running, done, chunks)
                yield done.pop(next_index)
                next_index += 1
        finally:
            _stop(running)


def _collect(
    running: dict[int, tuple[ForkProcess, Connection]],
    done: dict[int, T | WorkerLost[C] | WorkerCrashed[C]],
    chunks: Sequence[C],
) -> None:
    """Wait until at least one running worker has finished; file its result."""
    by_handle: dict[object, int] = {}
    handles: list[Connection | int] = []
    for index, (process, receiver) in running.items():
        by_handle[receiver] = by_handle[process.sentinel] = index
        handles += [receiver, process.sentinel]
    for ready in wait(handles):
        index = by_handle[ready]
        if index not in running:
            continue  # its pipe and its sentinel were both ready
        process, receiver = running.pop(index)
        result: T | WorkerLost[C] | WorkerCrashed[C]
        try:
            result = receiver.recv()
        except (EOFError, OSError):
            process.join()
            result = WorkerLost(chunks[index], process.exitcode)
        finally:
            receiver.close()
        process.join()
        done[index] = result


def _stop(running: dict[int, tuple[ForkProcess, Connection]]) -> None:
    """Stop every worker still running: SIGTERM, then SIGKILL after a grace period."""
    for process, _ in running.values():
        if process.is_alive():
            process.terminate()
    for process, receiver in running.values():
        process.join(STOP_GRACE_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
        receiver.close()
    running.clear()


def _worker(work: Callable[[C], T], chunk: C, sender: Connection, parent: int) -> None:
    """A worker's whole life: leave interrupts to the parent, follow it if it dies, run
    the chunk, send back its result (or the traceback of what it raised)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    _follow_parent(parent)
    try:
        outcome: T | WorkerCrashed[C] = work(chunk)
    except BaseException:
        outcome = WorkerCrashed(chunk, traceback.format_exc())
    with contextlib.suppress(BrokenPipeError):
        sender.send(outcome)
    sender.close()


def _follow_parent(parent: int) -> None:
    """A daemon thread that ends this process once its parent is gone (re-parented).
    It holds on to the real os._exit: engine calls stand in for it while they run."""
    exit_now = os._exit

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        exit_now(1)

    threading.Thread(target=watch, name="schedspec-follow-parent", daemon=True).start()
