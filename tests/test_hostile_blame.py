"""Blame: an exception the engine raised is exit 4 whether or not replaying its example
repeats it (Hypothesis' FlakyFailure), and says when it did not; a KeyboardInterrupt the
engine raises itself is its error, not a Ctrl-C; a real Ctrl-C still exits 130; a hang
in __init__ or behind the engine's own SIGALRM handler is still a hang (exit 5)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.cli.main import main
from schedspec.engines import boundary
from tests.hostile import ROOT, assert_engine_blamed, probe


def test_an_engine_error_replay_does_not_repeat_is_the_engines(tmp_path: Path) -> None:
    engine = "tests.broken_engines:flaky"  # raises once, on the process's 40th schedule()
    args = ["--examples", "20", "--seed", "1", "--trace-dir", str(tmp_path)]
    result = probe("check", "--engine", engine, *args)
    assert_engine_blamed(result, 4, "the engine crashed", "replay did not repeat it")
    assert "the engine raised RuntimeError at step" in result.output


def test_an_engine_raising_keyboard_interrupt_is_an_engine_error(tmp_path: Path) -> None:
    engine = "tests.broken_engines:interrupting"
    args = ["--examples", "5", "--seed", "1", "--trace-dir", str(tmp_path)]
    result = probe("check", "--engine", engine, *args)
    assert_engine_blamed(result, 4, "the engine raised KeyboardInterrupt in schedule()")
    assert "interrupted by" not in result.output


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_real_ctrl_c_is_still_an_interrupt(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "schedspec", "check", "--examples", "100000"]
    with subprocess.Popen(
        [*command, "--seed", "1", "--trace-dir", str(tmp_path)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test run started in the background by a non-interactive shell (a CI lane,
        # `pytest &`) inherits SIGINT ignored, and so would the child: Ctrl-C's own
        # disposition is what is under test here.
        preexec_fn=_sigint_default,
    ) as process:
        assert process.stdout is not None
        process.stdout.readline()  # "checking ...": the run has started
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()  # else leaving the `with` waits for 100,000 examples
            stdout, stderr = process.communicate()
            pytest.fail(f"SIGINT did not end the run within 60 s: {stdout}{stderr}")
    assert process.returncode == 130, stdout + stderr
    assert "interrupted by sigint" in (stdout + stderr).lower()
    assert "engine raised KeyboardInterrupt" not in stdout + stderr


def test_an_engine_that_hangs_when_built_is_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boundary, "BUILD_TIMEOUT", 0.5)  # ten minutes in a real run
    engine = "tests.broken_engines:hangs_when_built"
    result = CliRunner().invoke(main, ["check", "--engine", engine, "--examples", "2"])
    assert result.exit_code == 5, result.output
    assert "building the engine ran past the build time limit of 0.5 s" in result.output


def test_an_engine_with_its_own_sigalrm_handler_still_times_out(tmp_path: Path) -> None:
    engine = "tests.broken_engines:owns_sigalrm"
    args = ["--examples", "5", "--seed", "1", "--step-timeout", "0.5"]
    result = probe("check", "--engine", engine, *args, "--trace-dir", str(tmp_path))
    assert_engine_blamed(result, 5, "schedule() ran past the step time limit of 0.5 s")
