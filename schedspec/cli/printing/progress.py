"""Progress of a long command on stderr: a bar on a terminal; with --progress
elsewhere, a plain line per tenth of the work (no carriage returns to litter CI
logs); otherwise nothing. `check` and `diff` report examples through it
(suite_progress), `simulate` requests finished (simulation_progress)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from schedspec.campaign.parallel import CampaignTally
    from schedspec.properties.state_machine import SuiteRecorder
    from schedspec.simulate.runs import ProgressCallback

# (units done, what is running now, a detail such as counts) -> None
ShowProgress = Callable[[int, str, str], None]


@contextmanager
def progress(
    total: int, label: str, forced: bool, tty: bool | None = None
) -> Iterator[ShowProgress | None]:
    """Yields the callback to report through, or None when nothing is to be shown.

    The bar stops at full when the work runs past total (Hypothesis may run more
    examples than asked for); the detail keeps moving. tty overrides the
    terminal test (for tests).
    """
    if sys.stderr.isatty() if tty is None else tty:
        with click.progressbar(
            length=total, label=label, file=sys.stderr, item_show_func=lambda text: text
        ) as bar:

            def advance(done: int, now: str, detail: str) -> None:
                bar.label = now
                bar.update(max(0, min(done, total) - bar.pos), detail)
                bar.render_progress()  # update() draws nothing when the bar did not move

            yield advance
        return
    if not forced:
        yield None
        return
    started = time.perf_counter()
    every = max(1, total // 10)
    reported = [0]

    def report(done: int, now: str, detail: str) -> None:
        if done >= reported[0] + every or done == total:
            reported[0] = done
            click.echo(f"{now}: {detail} ({time.perf_counter() - started:.1f} s)", err=True)

    yield report


@contextmanager
def suite_progress(
    examples: int, forced: bool, quiet: bool = False, tty: bool | None = None
) -> Iterator[Callable[[SuiteRecorder], None] | None]:
    """Examples and steps so far, for a suite run's on_example callback. Where no progress
    is shown (off a terminal, without --progress) a failure's shrinking still is
    (ShrinkNotice), unless quiet."""
    with progress(examples, "checking", forced, tty) as show:
        if show is None:
            yield None if quiet else ShrinkNotice()
            return

        def advance(recorder: SuiteRecorder) -> None:
            failing = recorder.last_failure
            now = "shrinking" if failing is not None else "checking"
            detail = f"{recorder.examples} examples, {recorder.stats.steps} steps"
            if failing is not None:
                detail += f", latest failing: {len(failing.events)} events"
            show(recorder.examples, now, detail)

        yield advance


SHRINK_REPORT_EVERY = 10.0  # seconds between the lines ShrinkNotice prints


class ShrinkNotice:
    """A run off a terminal prints nothing while it searches, but once an example fails
    Hypothesis shrinks it, which can take most of the run (55 of 57 s in issue 32): say
    so on stderr when it starts, then every SHRINK_REPORT_EVERY seconds how far it got."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started: float | None = None
        self.reported = 0.0

    def __call__(self, recorder: SuiteRecorder) -> None:
        failing = recorder.last_failure
        if failing is None:
            return
        now = self.clock()
        if self.started is None:
            self.started = self.reported = now
            click.echo(
                f"example {recorder.first_failure_example} failed ({len(failing.events)} "
                "events); shrinking it (Ctrl-C stops and reports it as shrunk so far; "
                "--no-shrink skips this)",
                err=True,
            )
            return
        if now - self.reported >= SHRINK_REPORT_EVERY:
            self.reported = now
            tried = recorder.examples - (recorder.first_failure_example or 0)
            click.echo(
                f"shrinking: {tried} candidates tried, the latest failing one has "
                f"{len(failing.events)} events ({now - self.started:.0f} s)",
                err=True,
            )


@contextmanager
def campaign_progress(
    examples: int | None,
    seconds: float | None,
    forced: bool,
    tty: bool | None = None,
    units: tuple[str, str] = ("examples", "steps"),
) -> Iterator[Callable[[CampaignTally], None] | None]:
    """Examples, steps and failures over every worker, for a parallel run's on_progress:
    the bar measures examples, or with a time budget (`seconds`) the time spent, or the
    examples if they run out first (`examples` caps a campaign). `units` names what the
    run counts as examples and steps (swarm mode: configs and instance-steps)."""
    if seconds is None and examples is None:
        raise ValueError("campaign_progress: examples or seconds must be given")
    total = max(1, round(seconds)) if seconds is not None else examples
    assert total is not None
    with progress(total, "checking", forced, tty) as show:
        if show is None:
            yield None
            return
        started = time.perf_counter()

        def advance(tally: CampaignTally) -> None:
            if seconds is None:
                done = tally.examples
            else:
                done = round(time.perf_counter() - started)
                if examples is not None:  # the share of the cap, in seconds of the bar
                    done = max(done, min(total, round(tally.examples / examples * total)))
            found = f", {tally.findings} failures" if tally.findings else ""
            counts = f"{tally.examples} {units[0]}, {tally.steps} {units[1]}"
            show(done, "checking", counts + found)

        yield advance


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
