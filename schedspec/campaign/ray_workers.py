"""Ray's side of a run: the cluster, started in this process or joined (campaign/ray_cluster.py
holds what must happen before Ray is imported; this module imports it).

RayWorkers runs each chunk as a Ray task, at most `workers` at a time, and yields the
results in chunk order, as workers.ForkedWorkers does:

- tasks are never retried by Ray (max_retries=0): a worker that dies (the engine ended
  its process, the OOM killer, a node lost) yields WorkerLost for its chunk alone;
- a worker process runs at most CHUNKS_PER_WORKER_PROCESS chunks (Ray's max_calls),
  then Ray starts a fresh one, so its memory stays bounded however long a campaign;
- progress goes through a small actor (ProgressInbox) the driver reads while it waits;
- closing the results cancels the tasks still running (force: their processes end).

The example database (campaign/example_db.py) is served to the workers by an actor on the
driver's node (ExampleStore), which holds the directory. Import this module only inside
ray_cluster.ray_cluster(): importing Ray first would fix the node's address before a
local cluster can keep it on loopback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ray
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from schedspec.campaign.example_db import NamespacedDatabase
from schedspec.campaign.workers import (
    OnProgress,
    WorkerCrashed,
    WorkerLost,
    in_chunk_order,
    progress_sink,
)

T = TypeVar("T")
C = TypeVar("C")

# How long the driver waits for a result before reading progress again (seconds).
POLL_SECONDS = 0.5
# Chunks one Ray worker process runs before Ray replaces it with a fresh one. A process
# reused chunk after chunk keeps growing (on 200-example long-profile chunks, from about
# 120 MB fresh to about 610 MB by its eighth chunk: docs/CAMPAIGNS.md, "Memory per
# worker"); a fresh one starts from its imports again, which costs a few seconds: a
# small part of 8 chunks' minutes.
CHUNKS_PER_WORKER_PROCESS = 8


# ------------------------------------------------------------------------ the runner


class ProgressInbox:
    """The latest progress each running chunk reported, kept until the driver takes it."""

    def __init__(self) -> None:
        self.latest: dict[int, object] = {}

    def put(self, position: int, payload: object) -> None:
        self.latest[position] = payload

    def take(self) -> dict[int, object]:
        latest, self.latest = self.latest, {}
        return latest


def _run_chunk(work: Callable[[Any], Any], chunk: Any, position: int, inbox: Any) -> Any:
    """A chunk in a Ray worker: its progress to the inbox, its result (or the traceback
    of what it raised) back to the driver."""
    import traceback

    def send(payload: object) -> None:
        inbox.put.remote(position, payload)

    try:
        with progress_sink(send):
            return work(chunk)
    except BaseException:
        return WorkerCrashed(chunk, traceback.format_exc())


# Their Ray forms (ray.remote wraps them; the plain ones stay typed). The inbox takes no
# CPU: it must never wait for a worker's slot.
_remote_inbox: Any = ray.remote(num_cpus=0)(ProgressInbox)
_remote_chunk: Any = ray.remote(
    max_retries=0, retry_exceptions=False, max_calls=CHUNKS_PER_WORKER_PROCESS
)(_run_chunk)


class RayWorkers:
    """A ChunkRunner of Ray tasks, `workers` at a time (ray_cluster must be open)."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        self.workers = workers

    def map_chunks(
        self,
        work: Callable[[C], T],
        chunks: Iterable[C],
        on_progress: OnProgress[C] | None = None,
    ) -> Iterator[T | WorkerLost[C] | WorkerCrashed[C]]:
        inbox = _remote_inbox.remote()
        shipped = ray.put(work)  # pickled once, not once per chunk
        running: dict[Any, tuple[int, C]] = {}  # task -> (position, chunk)

        def start(position: int, chunk: C) -> None:
            running[_remote_chunk.remote(shipped, chunk, position, inbox)] = (position, chunk)

        def collect(done: dict[int, T | WorkerLost[C] | WorkerCrashed[C]]) -> None:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_SECONDS)
            for task in ready:
                position, chunk = running.pop(task)
                done[position] = _result(task, chunk)
            if on_progress is not None:
                _pass_progress(inbox, running, on_progress)

        try:
            yield from in_chunk_order(chunks, self.workers, start, running.__len__, collect)
        finally:
            for task in running:
                ray.cancel(task, force=True)
            ray.kill(inbox)


def _result(task: Any, chunk: C) -> Any:
    """A finished task's result, or what became of its worker."""
    try:
        return ray.get(task)
    except ray.exceptions.RayTaskError as err:
        return WorkerCrashed(chunk, str(err))
    except ray.exceptions.RayError as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return WorkerLost(chunk, None, f"was lost to Ray ({type(err).__name__}: {first_line})")


def _pass_progress(
    inbox: Any, running: dict[Any, tuple[int, C]], on_progress: OnProgress[C]
) -> None:
    """Hand the progress of chunks still running to on_progress (a report that arrives
    after its chunk's result is dropped: the result has the final counts)."""
    chunks = dict(running.values())
    for position, payload in ray.get(inbox.take.remote()).items():
        if position in chunks:
            on_progress(chunks[position], payload)


# --------------------------------------------------------------- the example database


class ExampleStore:
    """A directory-backed example database, served from the driver's node."""

    def __init__(self, path: str) -> None:
        self.database = DirectoryBasedExampleDatabase(path)

    def fetch(self, key: bytes) -> list[bytes]:
        return list(self.database.fetch(key))

    def save(self, key: bytes, value: bytes) -> None:
        self.database.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.database.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.database.move(src, dest, value)


_remote_store: Any = ray.remote(num_cpus=0)(ExampleStore)


class StoreDatabase(ExampleDatabase):
    """The ExampleStore actor as a Hypothesis database, in a worker."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self.store = store

    def __repr__(self) -> str:
        return f"StoreDatabase({self.store!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoreDatabase) and self.store == other.store

    def __hash__(self) -> int:
        return id(self.store)

    def fetch(self, key: bytes) -> list[bytes]:
        found: list[bytes] = ray.get(self.store.fetch.remote(key))
        return found

    def save(self, key: bytes, value: bytes) -> None:
        ray.get(self.store.save.remote(key, value))

    def delete(self, key: bytes, value: bytes) -> None:
        ray.get(self.store.delete.remote(key, value))

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        ray.get(self.store.move.remote(src, dest, value))


@dataclass(frozen=True)
class ServedDirectory:
    """A DatabaseSource for Ray workers: the driver's directory, through its actor."""

    store: Any  # an ExampleStore handle
    namespace: str

    def open(self) -> ExampleDatabase:
        return NamespacedDatabase(StoreDatabase(self.store), self.namespace)


def serve_directory(path: Path, namespace: str) -> ServedDirectory:
    """Start an ExampleStore for `path` on the driver's node (ray_cluster must be open)."""
    here = ray.get_runtime_context().get_node_id()
    placement = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(here, soft=False)
    store = _remote_store.options(scheduling_strategy=placement).remote(str(path.resolve()))
    return ServedDirectory(store, namespace)
