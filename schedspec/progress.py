"""Progress of a long command on stderr: a bar on a terminal; with --progress
elsewhere, a plain line per tenth of the work (no carriage returns to litter CI
logs); otherwise nothing. `check`, `diff` and `simulate` all report through it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

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
