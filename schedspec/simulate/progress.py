"""Progress on long simulations: requests finished over every config, on the
shared progress display (schedspec/progress.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from schedspec.progress import progress

# (config name, requests finished in this config) -> None
ProgressCallback = Callable[[str, int], None]


class _Tally:
    """Requests finished over all configs, from each config's own count."""

    def __init__(self) -> None:
        self.offset = 0  # finished in the configs before the current one
        self.name: str | None = None
        self.finished = 0

    def position(self, name: str, finished: int) -> int:
        if name != self.name:
            self.offset += self.finished
            self.name = name
        self.finished = finished
        return self.offset + finished


@contextmanager
def simulation_progress(
    total_requests: int, forced: bool, tty: bool | None = None
) -> Iterator[ProgressCallback | None]:
    """total_requests over every config; the callback is told each config's count.
    tty overrides the terminal test (for tests)."""
    with progress(total_requests, "simulating", forced, tty) as show:
        if show is None:
            yield None
            return
        tally = _Tally()

        def advance(name: str, finished: int) -> None:
            position = tally.position(name, finished)
            show(position, f"simulating {name}", f"{position}/{total_requests} requests")

        yield advance
