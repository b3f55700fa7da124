"""The waiting queue: FIFO for fcfs, (priority, arrival) order for priority."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Protocol

from schedspec.spec import Request


class WaitingQueue(Protocol):
    def add(self, request: Request) -> None: ...
    def prepend(self, request: Request) -> None:
        """Put back a preempted request ahead of the requests it arrived before."""

    def peek(self) -> Request: ...
    def pop(self) -> Request: ...
    def remove(self, request_ids: set[str]) -> None: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]:
        """Requests in queue order, head first."""


class FCFSQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request_ids: set[str]) -> None:
        self._queue = deque(r for r in self._queue if r.request_id not in request_ids)

    def head(self, n: int) -> list[Request]:
        """The first n requests (fewer if the queue is shorter), head first."""
        return list(islice(self._queue, min(n, len(self._queue))))

    def replace_head(self, head: Sequence[Request]) -> None:
        """Put head, a reordering of the first len(head) requests, in their place; the
        rest of the queue stays as it is. Only a FCFS queue has places to reorder."""
        for _ in head:
            self._queue.popleft()
        self._queue.extendleft(reversed(head))

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue:
    """Lower priority value first, then earlier arrival. A preempted request
    goes back to where its key puts it, not to the very front."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Request]] = []

    def add(self, request: Request) -> None:
        # arrival is unique per scheduler, so the Request itself is never compared.
        heapq.heappush(self._heap, (request.priority, request.arrival, request))

    def prepend(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._heap[0][2]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def remove(self, request_ids: set[str]) -> None:
        self._heap = [e for e in self._heap if e[2].request_id not in request_ids]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        # The entries' own order: arrival is unique, so no two tie before the Request.
        return (entry[2] for entry in sorted(self._heap))


def make_waiting_queue(policy: str) -> WaitingQueue:
    return PriorityQueue() if policy == "priority" else FCFSQueue()
