"""Hostile --example-db folders: checked before the run with the other outputs (exit 2,
naming the problem), and a failing run whose example could not be saved says so."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedspec import files
from schedspec.cli import suite_run
from schedspec.cli.main import main
from schedspec.files import OutputPathError
from tests.hostile import assert_refused, probe

QUICK = ("--examples", "2", "--seed", "1")


@pytest.mark.parametrize(
    ("where", "phrase"),
    [
        ("/proc/schedspec-db", "is under /proc"),
        ("{file}/db", "a part of the path is a file"),
        ("{loop}", "a loop of symbolic links"),
        ("", "is empty"),
        ("   ", "is empty"),
    ],
)
def test_a_bad_example_db_is_refused_before_the_run(
    tmp_path: Path, where: str, phrase: str
) -> None:
    (tmp_path / "file").write_text("")
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    path = where.format(file=tmp_path / "file", loop=loop)
    result = probe(
        "check", *QUICK, "--example-db", path, "--trace-dir", str(tmp_path), cwd=tmp_path
    )
    assert_refused(result, 2, "Invalid value for '--example-db'", phrase)
    assert "checking" not in result.stdout
    assert not (tmp_path / ".hypothesis").exists() and not (tmp_path / "examples").exists()


def test_a_read_only_example_db_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only filesystem, as the probe file meets it (root may write anywhere else,
    so the filesystem's refusal is planted)."""

    real = tempfile.mkstemp
    db = str(tmp_path / "db")

    def read_only(*args: Any, **kwargs: Any) -> tuple[int, str]:
        if str(kwargs.get("dir")) == db:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    result = CliRunner().invoke(main, ["check", *QUICK, "--example-db", db])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--example-db'" in result.output
    assert "the filesystem is read-only" in result.output


def test_a_failure_that_could_not_be_saved_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder took files at the start, not at the end (a disk filled, a remount)."""
    checks = {"count": 0}
    real = files.prepare_output_dir

    def fails_at_the_end(path: Path) -> None:
        if path == tmp_path / "db":
            checks["count"] += 1
            if checks["count"] > 1:
                raise OutputPathError(path, "cannot write files here: no space left")
        real(path)

    monkeypatch.setattr(suite_run, "prepare_output_dir", fails_at_the_end)
    args = ["--engine", "tests.broken_engines:wrong_total", "--seed", "1", "--examples", "20"]
    db = ["--example-db", str(tmp_path / "db"), "--trace-dir", str(tmp_path), "--no-shrink"]
    result = CliRunner().invoke(main, ["check", *args, *db])
    assert result.exit_code == 1, result.output
    assert "warning: the failure could not be saved to --example-db" in result.output
    assert "the next run will not try it first" in result.output
