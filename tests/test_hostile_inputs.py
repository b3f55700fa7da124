"""Hostile inputs: a FIFO with no writer, given where a trace, a workload or a cost file
is read, is refused (exit 2) once it has delivered nothing for files.PIPE_WAIT_SECONDS,
never waited on forever; a pipe that is written is read as before (tests/test_files.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec import files
from schedspec.cli.main import main
from schedspec.files import InputFileError, read_input_text

WAIT = 0.3  # stands in for PIPE_WAIT_SECONDS, so that each probe takes a moment


@pytest.fixture
def silent_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(files, "PIPE_WAIT_SECONDS", WAIT)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return fifo


def test_a_fifo_with_no_writer_is_given_up_on(silent_fifo: Path) -> None:
    started = time.monotonic()
    with pytest.raises(InputFileError, match=r"delivered nothing for 0\.3 s"):
        read_input_text(silent_fifo, 100)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "{fifo}"],
        ["diff-replay", "{fifo}", "--right", "reference"],
        ["simulate", "--workload", "{fifo}", "--out", "{out}", "--no-plots"],
        ["simulate", "--cost-json", "{fifo}", "--out", "{out}", "--no-plots"],
    ],
    ids=["replay", "diff-replay", "simulate-workload", "simulate-cost-json"],
)
def test_no_command_hangs_on_a_fifo_with_no_writer(
    silent_fifo: Path, tmp_path: Path, args: list[str]
) -> None:
    filled = [a.format(fifo=silent_fifo, out=tmp_path / "out") for a in args]
    started = time.monotonic()
    result = CliRunner().invoke(main, filled)
    assert result.exit_code == 2, result.output
    assert "delivered nothing" in result.output and "Traceback" not in result.output
    assert time.monotonic() - started < 30
