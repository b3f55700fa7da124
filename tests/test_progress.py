"""The shared progress display of check, diff and simulate (schedspec/progress.py)."""

from __future__ import annotations

import pytest

from schedspec.cli.printing.progress import progress


def test_silent_off_a_terminal_without_the_flag() -> None:
    with progress(10, "working", forced=False, tty=False) as show:
        assert show is None


def test_plain_lines_per_tenth_and_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    with progress(100, "working", forced=True, tty=False) as show:
        assert show is not None
        for done in range(1, 101):
            show(done, "working", f"{done} units")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"working: {done} units" for done in range(10, 101, 10)
    ]
    assert all("\r" not in line for line in lines)


def test_the_bar_takes_work_past_total() -> None:
    # Hypothesis may run more examples than asked for; the bar must not fail on it.
    with progress(4, "checking", forced=False, tty=True) as show:
        assert show is not None
        for done in (1, 4, 7):
            show(done, "shrinking" if done == 7 else "checking", f"{done} examples")
