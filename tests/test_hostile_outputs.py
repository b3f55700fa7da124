"""Hostile output paths: whatever stands at --json, --junit or --trace-dir that is not a
regular file (a device, a FIFO, a socket, a folder) is refused before the run (exit 2,
naming the flag) and left exactly as it was; a report replaced keeps its mode, and a new
one gets the umask's (0644 under 022)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from tests.hostile import assert_refused, probe

QUICK = ("--examples", "2", "--seed", "1")


def _special(folder: Path, kind: str) -> Path:
    path = folder / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(path))
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("creating a device node needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:
        path.mkdir()
    return path


@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "folder"])
@pytest.mark.parametrize("flag", ["--json", "--junit"])
def test_a_non_regular_report_path_is_refused_and_kept(
    tmp_path: Path, kind: str, flag: str
) -> None:
    path = _special(tmp_path, kind)
    before = path.lstat()
    result = probe("check", *QUICK, flag, str(path), "--trace-dir", str(tmp_path / "t"))
    assert_refused(result, 2, f"Invalid value for '{flag}'")
    assert "checking" not in result.stdout  # refused before the run
    after = path.lstat()
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)


def test_a_report_through_a_symlink_to_dev_null_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "report.json"
    link.symlink_to("/dev/null")
    result = probe("check", *QUICK, "--json", str(link), "--trace-dir", str(tmp_path))
    assert_refused(result, 2, "Invalid value for '--json'", "character device")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_reports_get_the_umask_mode_and_keep_an_existing_one(tmp_path: Path) -> None:
    kept = tmp_path / "kept.xml"
    kept.write_text("<old/>")
    kept.chmod(0o640)
    fresh = tmp_path / "fresh.json"
    previous = os.umask(0o022)  # the child inherits it
    try:
        result = probe("check", *QUICK, "--json", str(fresh), "--junit", str(kept))
    finally:
        os.umask(previous)
    assert result.code == 0, result.output
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert "<testsuite" in kept.read_text()


@pytest.mark.parametrize("path", ["/dev/null", "/dev/stdout"])
def test_system_device_paths_are_refused(tmp_path: Path, path: str) -> None:
    """As root, replacing /dev/null with a file would break the system; /dev/stdout is
    a pipe here (or a terminal): neither is a file to replace."""
    result = probe("check", *QUICK, "--json", path, "--trace-dir", str(tmp_path))
    assert_refused(result, 2, "Invalid value for '--json'")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
