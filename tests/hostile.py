"""Run `schedspec` as a hostile user would, in a process of its own (so that what the
interpreter prints on the way out counts), and hold it to the exit-code contract: the
documented code, no traceback, and within a time limit (a hang is a failure too).
tests/test_hostile_*.py use it, one file per class of bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A probe that takes longer hangs: every one of them is refused or finishes in seconds.
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Probe:
    """What one run of the command line did."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def probe(*args: str, cwd: Path | None = None, stdout: int | None = None) -> Probe:
    """`schedspec ARGS` in a fresh interpreter, this checkout first on its import path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "schedspec", *args],
        cwd=cwd or ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    )
    return Probe(done.returncode, done.stdout or "", done.stderr)


def assert_refused(result: Probe, code: int, *phrases: str) -> None:
    """The run exited `code` without a traceback, saying each phrase."""
    assert result.code == code, result.output
    assert "Traceback" not in result.output, result.output
    for phrase in phrases:
        assert phrase in result.output, result.output


def assert_engine_blamed(result: Probe, code: int, *phrases: str) -> None:
    """The run exited `code` (4: the engine raised; 5: it hung) blaming the engine: its
    traceback is printed, schedspec's own never is."""
    assert result.code == code, result.output
    assert "HARNESS ERROR" not in result.output, result.output
    for phrase in phrases:
        assert phrase in result.output, result.output
