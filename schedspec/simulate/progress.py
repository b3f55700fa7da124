"""Progress on long simulations, the way `schedspec check` shows it: a bar on a
terminal; with --progress elsewhere, a plain line per tenth of the work (no
carriage returns to litter CI logs); otherwise nothing."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

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
    tally = _Tally()
    if sys.stderr.isatty() if tty is None else tty:
        with click.progressbar(length=total_requests, label="simulating", file=sys.stderr) as bar:

            def advance(name: str, finished: int) -> None:
                position = tally.position(name, finished)
                bar.label = f"simulating {name}"
                if position > bar.pos:
                    bar.update(position - bar.pos)

            yield advance
        return
    if not forced:
        yield None
        return
    started = time.perf_counter()
    every = max(1, total_requests // 10)
    reported = [0]

    def report(name: str, finished: int) -> None:
        position = tally.position(name, finished)
        if position >= reported[0] + every or position == total_requests:
            reported[0] = position
            click.echo(
                f"simulated {position}/{total_requests} requests "
                f"({name}, {time.perf_counter() - started:.1f} s)",
                err=True,
            )

    yield report
