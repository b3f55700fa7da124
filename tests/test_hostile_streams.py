"""Hostile output streams and full disks: standard output on a full device (`> /dev/full`)
is a quiet exit 2 (an output that cannot be written) with one line on stderr, never a
traceback; simulate refuses an --out folder short of space before it simulates, and a
disk that fills during the simulation costs the files, not the results (a warning)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedspec.cli.main import main
from tests.hostile import assert_refused, probe


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--quiet"],
        ["check", "--examples", "3", "--seed", "1"],
        ["simulate", "--num-requests", "8", "--no-plots"],
    ],
    ids=["run", "check", "simulate"],
)
def test_stdout_on_a_full_device_is_a_quiet_usage_error(tmp_path: Path, args: list[str]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    extra = ["--out", str(tmp_path / "out")] if args[0] == "simulate" else []
    extra += ["--trace-dir", str(tmp_path)] if args[0] == "check" else []
    with open("/dev/full", "w") as full:
        result = probe(*args, *extra, stdout=full.fileno())
    assert_refused(result, 2, "cannot write its output: No space left on device")


def test_a_reader_that_goes_away_is_still_141(tmp_path: Path) -> None:
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    result = probe("prove", "--only", "BUDGET", "--max-n", "2", stdout=reader.stdin.fileno())
    reader.stdin.close()
    reader.wait()
    assert result.code in (0, 141) and "Traceback" not in result.stderr


def test_simulate_refuses_an_out_folder_short_of_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.statvfs

    def nearly_full(path: Any) -> Any:
        info = real(path)
        return os.statvfs_result((*info[:4], 1, *info[5:]))  # one block free

    monkeypatch.setattr(os, "statvfs", nearly_full)
    out = str(tmp_path / "out")
    result = CliRunner().invoke(main, ["simulate", "--num-requests", "4", "--out", out])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--out'" in result.output and "bytes free" in result.output
    assert "TTFT" not in result.output  # refused before simulating


def test_simulate_on_a_disk_that_fills_warns_and_keeps_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "out"
    args = ["simulate", "--num-requests", "4", "--out", str(out), "--no-plots"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"warning: could not write {out / 'summary.json'}: No space left" in result.output
    assert list(out.iterdir()) == []  # no half-written file
