"""Run chunks of work somewhere else and hand their results back: the worker layer.

ChunkRunner is the one interface the suite needs for parallelism: run `work` on each
chunk, yield the results in chunk order, pass on the progress the work reports while
it runs, and stop everything still running when the caller stops reading (or is
interrupted). Two runners implement it: ForkedWorkers here (local processes) and
ray_workers.RayWorkers (a Ray cluster, local or remote). ForkedWorkers runs each chunk
in a fresh forked process (Linux, macOS), at most `processes` at a time:

- a fresh process per chunk: memory is returned to the system after every chunk;
- a worker that ends without a result (an engine that calls os._exit from native code
  or a thread of its own, a crash, the OOM killer) yields WorkerLost for its chunk,
  never a hang of the parent or a silent gap;
- workers ignore Ctrl-C (the parent handles it and stops them) and exit on their own
  when the parent process is gone, killed even with SIGKILL: they poll their parent.

`work` need not pickle (fork copies it); its result must. Chunks are pulled from the
iterable only as workers free up, so an open-ended series (a campaign with a time
budget) is planned as it runs.
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
from collections.abc import Callable, Iterable, Iterator
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
# The least time between two progress reports a worker sends (seconds): the driver's
# bar needs a few updates a second, not one per example.
PROGRESS_EVERY_SECONDS = 0.5


@dataclass(frozen=True)
class WorkerLost(Generic[C]):
    """A chunk whose worker ended without handing back a result."""

    chunk: C
    exitcode: int | None  # negative: ended by that signal
    reason: str | None = None  # what the runner knows instead of an exit code (Ray's error)

    def describe(self) -> str:
        if self.reason is not None:
            return self.reason
        if self.exitcode is not None and self.exitcode < 0:
            return f"was ended by {signal.Signals(-self.exitcode).name}"
        return f"exited with status {self.exitcode}"


@dataclass(frozen=True)
class WorkerCrashed(Generic[C]):
    """A chunk whose work raised in the worker (the traceback, as text)."""

    chunk: C
    traceback: str


# (the chunk, what its work last reported) -> None; called in the driver
OnProgress = Callable[[C, object], None]


class ChunkRunner(Protocol):
    def map_chunks(
        self,
        work: Callable[[C], T],
        chunks: Iterable[C],
        on_progress: OnProgress[C] | None = None,
    ) -> Iterator[T | WorkerLost[C] | WorkerCrashed[C]]:
        """work(chunk) for every chunk, results in chunk order; what the work passes to
        report_progress while it runs reaches on_progress (in the caller's thread, while
        it waits for results). Closing the iterator early (or an exception in the caller
        while it is open) stops the work left."""
        ...


# ------------------------------------------------------------ progress from a worker

_progress_sink: Callable[[object], None] | None = None
_last_report = [0.0]


def report_progress(payload: object, final: bool = False) -> None:
    """From inside a chunk's work: hand `payload` (picklable, cumulative for the chunk)
    to the driver's on_progress, at most every PROGRESS_EVERY_SECONDS unless `final`.
    Dropped where no runner listens (work run in the caller's own process)."""
    sink = _progress_sink
    now = time.monotonic()
    if sink is None or (not final and now - _last_report[0] < PROGRESS_EVERY_SECONDS):
        return
    _last_report[0] = now
    sink(payload)


@contextlib.contextmanager
def progress_sink(sink: Callable[[object], None]) -> Iterator[None]:
    """For the duration, report_progress in this process sends through `sink` (each
    runner's worker side installs its own transport)."""
    global _progress_sink
    saved = _progress_sink
    _progress_sink = sink
    _last_report[0] = 0.0
    try:
        yield
    finally:
        _progress_sink = saved


# ------------------------------------------------------------------- forked workers


class ForkedWorkers:
    """A ChunkRunner of forked processes, one per chunk, `processes` at a time."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"processes: must be >= 1, got {processes}")
        self.processes = processes

    def map_chunks(
        self,
        work: Callable[[C], T],
        chunks: Iterable[C],
        on_progress: OnProgress[C] | None = None,
    ) -> Iterator[T | WorkerLost[C] | WorkerCrashed[C]]:
        context = multiprocessing.get_context("fork")
        parent = os.getpid()
        running: dict[int, _Running[C]] = {}  # position -> its worker

        def start(position: int, chunk: C) -> None:
            running[position] = _start(context, work, chunk, parent)

        def collect(done: dict[int, T | WorkerLost[C] | WorkerCrashed[C]]) -> None:
            _collect(running, done, on_progress)

        try:
            yield from in_chunk_order(chunks, self.processes, start, running.__len__, collect)
        finally:
            _stop(running)


R = TypeVar("R")
_END = object()


def in_chunk_order(
    chunks: Iterable[C],
    slots: int,
    start: Callable[[int, C], None],
    running: Callable[[], int],
    collect: Callable[[dict[int, R]], None],
) -> Iterator[R]:
    """The loop every runner shares: start(position, chunk) while fewer than `slots` run
    (chunks are pulled only then, so an open-ended series is planned as it runs), and
    yield the results that collect(done) files under their positions, in chunk order;
    collect waits until at least one running chunk has an outcome (or a while)."""
    source = iter(chunks)
    exhausted = False
    started = 0  # chunks started so far: the next one's position
    done: dict[int, R] = {}
    next_out = 0
    while True:
        while not exhausted and running() < slots:
            chunk = next(source, _END)
            if chunk is _END:
                exhausted = True
                break
            start(started, chunk)  # type: ignore[arg-type]
            started += 1
        if next_out in done:
            yield done.pop(next_out)
            next_out += 1
        elif running():
            collect(done)
        else:
            return


@dataclass
class _Running(Generic[C]):
    chunk: C
    process: ForkProcess
    receiver: Connection


def _start(
    context: multiprocessing.context.ForkContext,
    work: Callable[[C], T],
    chunk: C,
    parent: int,
) -> _Running[C]:
    # Output buffered here would be written again by the worker at exit.
    sys.stdout.flush()
    sys.stderr.flush()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_worker, args=(work, chunk, sender, parent), daemon=False)
    process.start()
    sender.close()  # the worker's end: EOF here once it is gone
    return _Running(chunk, process, receiver)


def _collect(
    running: dict[int, _Running[C]],
    done: dict[int, T | WorkerLost[C] | WorkerCrashed[C]],
    on_progress: OnProgress[C] | None,
) -> None:
    """Wait until a running worker has sent something or ended; pass its progress on,
    and file its result (or its loss) under its position once it has one."""
    by_handle: dict[object, int] = {}
    handles: list[Connection | int] = []
    for position, slot in running.items():
        by_handle[slot.receiver] = by_handle[slot.process.sentinel] = position
        handles += [slot.receiver, slot.process.sentinel]
    for ready in wait(handles):
        position = by_handle[ready]
        if position not in running:
            continue  # its pipe and its sentinel were both ready
        slot = running[position]
        result = _receive(slot, on_progress)
        if result is _PENDING:
            continue
        del running[position]
        slot.receiver.close()
        slot.process.join()
        done[position] = result  # type: ignore[assignment]


_PENDING = object()


def _receive(slot: _Running[C], on_progress: OnProgress[C] | None) -> object:
    """What the worker has sent so far: its progress passed on, then its result, its
    loss (the pipe closed without one), or _PENDING (nothing more yet)."""
    try:
        while True:
            kind, payload = slot.receiver.recv()
            if kind == "result":
                return payload
            if on_progress is not None:
                on_progress(slot.chunk, payload)
            if not slot.receiver.poll():
                return _PENDING
    except (EOFError, OSError):
        slot.process.join()
        return WorkerLost(slot.chunk, slot.process.exitcode)


def _stop(running: dict[int, _Running[C]]) -> None:
    """Stop every worker still running: SIGTERM, then SIGKILL after a grace period."""
    for slot in running.values():
        if slot.process.is_alive():
            slot.process.terminate()
    for slot in running.values():
        slot.process.join(STOP_GRACE_SECONDS)
        if slot.process.is_alive():
            slot.process.kill()
            slot.process.join()
        slot.receiver.close()
    running.clear()


def _worker(work: Callable[[C], T], chunk: C, sender: Connection, parent: int) -> None:
    """A worker's whole life: leave interrupts to the parent, follow it if it dies, run
    the chunk (its progress reports sent up the pipe as they come), send back its result
    (or the traceback of what it raised)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    _follow_parent(parent)

    def send_progress(payload: object) -> None:
        with contextlib.suppress(BrokenPipeError):
            sender.send(("progress", payload))

    try:
        with progress_sink(send_progress):
            outcome: T | WorkerCrashed[C] = work(chunk)
    except BaseException:
        outcome = WorkerCrashed(chunk, traceback.format_exc())
    with contextlib.suppress(BrokenPipeError):
        sender.send(("result", outcome))
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
