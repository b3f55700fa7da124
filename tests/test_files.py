"""schedspec.files: inputs read bounded and decoded strictly, outputs written atomically
and checked before a run; and the commands' use of both (paths refused up front, a
stale report replaced, never unlinked, a full disk leaving no half-written file, a
finding kept when its trace cannot be written). The hostile paths (devices, FIFOs,
sockets) as the command line meets them: tests/test_hostile_outputs.py."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from schedspec.cli.main import main
from schedspec.files import (
    MAX_JSON_DEPTH,
    InputFileError,
    OutputPathError,
    json_depth,
    parse_json,
    prepare_output_dir,
    prepare_output_file,
    read_input_text,
    write_atomically,
)
from schedspec.traces.trace import Trace

BROKEN = "tests.broken_engines:wrong_total"  # BUDGET breaks with seed 1 in 20 examples


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


# ------------------------------------------------------------------------ in


class TestReadInputText:
    def test_utf8_text_with_or_without_a_byte_order_mark(self, tmp_path: Path) -> None:
        path = tmp_path / "a.json"
        path.write_bytes('\ufeff{"é": 1}'.encode())
        assert read_input_text(path, 100) == '{"é": 1}'

    @pytest.mark.parametrize(
        ("content", "says"),
        [
            (b"\x89PNG\r\n\x1a\n\x00\x00", "is not UTF-8 text (byte 0 is 0x89)"),
            ('{"a": 1}'.encode("utf-16"), "is UTF-16 (little-endian) text: save it as UTF-8"),
            ('{"a": 1}'.encode("utf-16-be").join([b"\xfe\xff", b""]), "UTF-16 (big-endian)"),
            (b"x" * 101, "is larger than the 100 bytes this input may be"),
        ],
    )
    def test_what_cannot_be_read_is_named(self, tmp_path: Path, content: bytes, says: str) -> None:
        path = tmp_path / "input"
        path.write_bytes(content)
        with pytest.raises(InputFileError) as err:
            read_input_text(path, 100)
        assert str(err.value).startswith(f"{path}: ")
        assert says in str(err.value)

    def test_a_folder_a_device_and_a_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(InputFileError, match="is a folder, not a file"):
            read_input_text(tmp_path, 100)
        with pytest.raises(InputFileError, match="not a regular file"):
            read_input_text(Path("/dev/zero"), 100)  # endless: never read
        with pytest.raises(InputFileError, match="cannot be read: No such file"):
            read_input_text(tmp_path / "absent", 100)

    def test_a_pipe_is_read(self, tmp_path: Path) -> None:
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        writer = os.fork()
        if writer == 0:  # the child writes the pipe and leaves
            with fifo.open("w") as stream:
                stream.write('{"a": 1}')
            os._exit(0)
        assert read_input_text(fifo, 100) == '{"a": 1}'
        os.waitpid(writer, 0)


class TestParseJson:
    @pytest.mark.parametrize(
        ("text", "says"),
        [
            ("{not json", "is not JSON: Expecting property name"),
            ('{"a": NaN}', "NaN is not a JSON number"),
            ('{"a": -Infinity}', "-Infinity is not a JSON number"),
            ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nests deeper than 32"),
            ("[" * 100_000 + "]" * 100_000, "nests deeper than 32"),  # past the recursion limit
            ("1" * 5000, "is not usable JSON: Exceeds the limit"),
        ],
    )
    def test_refusals_name_the_input(self, text: str, says: str) -> None:
        with pytest.raises(InputFileError) as err:
            parse_json(text, "trace.json")
        assert str(err.value).startswith("trace.json: ")
        assert says in str(err.value)

    def test_depth_is_counted_without_recursion(self) -> None:
        assert json_depth(3) == 0
        assert json_depth({"a": [1, {"b": []}]}) == 4
        deep: list[object] = []
        for _ in range(10_000):
            deep = [deep]
        assert json_depth(deep) == MAX_JSON_DEPTH + 1  # stops as soon as it is past
        assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x") is not None


# ----------------------------------------------------------------------- out


class TestWriteAtomically:
    def test_replaces_the_content_and_leaves_nothing_else(self, tmp_path: Path) -> None:
        path = tmp_path / "report.json"
        path.write_text("old")
        write_atomically(path, "new")
        assert path.read_text() == "new"
        assert [p.name for p in tmp_path.iterdir()] == ["report.json"]

    def test_a_full_disk_leaves_the_old_file_whole(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = tmp_path / "report.json"
        path.write_text('{"outcome": "passed"}')

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(OSError, match="No space left"):
            write_atomically(path, '{"outcome": "violation", ' + "x" * 10_000)
        assert path.read_text() == '{"outcome": "passed"}'
        assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


class TestPrepareOutputs:
    def test_a_folder_is_created_and_proved_writable(self, tmp_path: Path) -> None:
        prepare_output_dir(tmp_path / "a" / "b")
        assert (tmp_path / "a" / "b").is_dir()
        assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe file is gone

    def test_a_folder_below_a_file_is_refused(self, tmp_path: Path) -> None:
        (tmp_path / "file").write_text("")
        with pytest.raises(OutputPathError, match="cannot write files here"):
            prepare_output_dir(tmp_path / "file" / "traces")

    def test_a_file_path_that_is_a_folder_is_refused_and_a_stale_file_kept(
        self, tmp_path: Path
    ) -> None:
        with pytest.raises(OutputPathError, match="is a folder, not a regular file"):
            prepare_output_file(tmp_path)
        stale = tmp_path / "out" / "report.json"
        stale.parent.mkdir()
        stale.write_text('{"outcome": "passed"}')
        prepare_output_file(stale)
        assert stale.read_text() == '{"outcome": "passed"}'  # replaced at the end, not now

    @pytest.mark.parametrize("kind", ["fifo", "socket"])
    def test_a_fifo_or_socket_is_refused_and_left_as_it_was(
        self, tmp_path: Path, kind: str
    ) -> None:
        path = _special_file(tmp_path, kind)
        with pytest.raises(OutputPathError, match="not a regular file"):
            prepare_output_file(path)
        with pytest.raises(OutputPathError, match="not a regular file"):
            write_atomically(path, "x")
        assert not stat.S_ISREG(path.lstat().st_mode)
        assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]

    def test_a_device_node_is_refused_and_left_as_it_was(self, tmp_path: Path) -> None:
        """As root (CI containers), replacing the device would destroy it."""
        if os.geteuid() != 0:
            pytest.skip("creating a device node needs root (the FIFO and socket cases run)")
        null = tmp_path / "null"
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with pytest.raises(OutputPathError, match="is a character device"):
            prepare_output_file(null)
        with pytest.raises(OutputPathError, match="is a character device"):
            write_atomically(null, "x")
        assert stat.S_ISCHR(null.stat().st_mode)


class TestModes:
    """mkstemp makes 0600 files; what schedspec leaves behind has the umask's mode."""

    @pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
    def test_a_new_file_gets_the_umasks_mode(self, tmp_path: Path, umask: int, mode: int) -> None:
        """0644 under a umask of 022, as open() would make it (mkstemp alone: 0600)."""
        previous = os.umask(umask)
        try:
            write_atomically(tmp_path / "report.json", "{}")
        finally:
            os.umask(previous)
        assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == mode

    def test_a_replaced_report_keeps_its_mode(self, tmp_path: Path) -> None:
        path = tmp_path / "report.json"
        path.write_text("old")
        path.chmod(0o640)
        write_atomically(path, "new")
        assert (path.read_text(), stat.S_IMODE(path.stat().st_mode)) == ("new", 0o640)

    def test_a_symlink_is_kept_and_the_file_it_names_replaced(self, tmp_path: Path) -> None:
        real = tmp_path / "real.json"
        real.write_text("old")
        link = tmp_path / "link.json"
        link.symlink_to(real)
        write_atomically(link, "new")
        assert link.is_symlink() and real.read_text() == "new"


# ------------------------------------------------------------- the commands


class TestCommandOutputs:
    @pytest.mark.parametrize(
        ("flags", "named"),
        [
            (["--trace-dir", "{file}/traces"], "--trace-dir"),
            (["--json", "{dir}"], "--json"),
            (["--junit", "{file}/junit.xml"], "--junit"),
            (["--junit", "{dir}/r.json", "--json", "{dir}/r.json"], "--json"),
        ],
    )
    @pytest.mark.parametrize("command", ["check", "diff"])
    def test_a_bad_output_path_is_refused_before_the_run(
        self, command: str, flags: list[str], named: str, tmp_path: Path
    ) -> None:
        (tmp_path / "file").write_text("")
        args = [f.format(file=tmp_path / "file", dir=tmp_path) for f in flags]
        pair = ["--right", "reference"] if command == "diff" else []
        result = _invoke(command, *pair, "--examples", "2", *args)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{named}'" in result.output
        assert "checking" not in result.output and "diffing" not in result.output

    def test_simulate_and_prove_check_their_folders_first(self, tmp_path: Path) -> None:
        (tmp_path / "file").write_text("")
        below = str(tmp_path / "file" / "out")
        simulated = _invoke("simulate", "--num-requests", "4", "--out", below)
        assert simulated.exit_code == 2 and "Invalid value for '--out'" in simulated.output
        proved = _invoke("prove", "--only", "BUDGET", "--max-n", "0", "--trace-dir", below)
        assert proved.exit_code == 2 and "Invalid value for '--trace-dir'" in proved.output

    def test_a_stale_passing_report_never_outlives_a_failed_run(self, tmp_path: Path) -> None:
        """The last run passed; this one stops on a usage error found once it started (a
        --configs strategy that raises): the report says so, not "passed"."""
        report = tmp_path / "report.json"
        passed = _invoke("check", "--examples", "2", "--seed", "1", "--json", str(report))
        assert passed.exit_code == 0 and json.loads(report.read_text())["outcome"] == "passed"
        configs = "tests.test_files:raising_configs"
        failed = _invoke("check", "--configs", configs, "--seed", "1", "--json", str(report))
        assert failed.exit_code == 2, failed.output
        written = json.loads(report.read_text())
        assert (written["outcome"], written["exit_code"]) == ("usage-error", 2)
        assert "planted in the config strategy" in written["usage_error"]

    def test_a_full_disk_costs_the_report_not_the_verdict(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        report = tmp_path / "report.json"

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        args = ["--engine", BROKEN, "--seed", "1", "--examples", "20", "--no-shrink"]
        result = _invoke("check", *args, "--json", str(report), "--trace-dir", str(tmp_path))
        assert result.exit_code == 1, result.output  # the violation found stands
        assert f"could not write the report {report}: No space left on device" in result.output
        assert "could not write the trace" in result.output
        assert "VIOLATION after event" in result.output  # printed, if not saved
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # no half-written file

    def test_the_trace_of_an_interrupted_run_is_a_whole_file(self, tmp_path: Path) -> None:
        """Written atomically, so a reader finds either no trace or one that loads."""
        args = ["--engine", BROKEN, "--seed", "1", "--examples", "20"]
        result = _invoke("check", *args, "--trace-dir", str(tmp_path))
        assert result.exit_code == 1
        (path,) = tmp_path.glob("schedspec-failure-*.json")
        assert Trace.load(path).events


def _special_file(folder: Path, kind: str) -> Path:
    """A FIFO or a bound UNIX socket at folder/kind (the socket's file outlives it)."""
    path = folder / kind
    if kind == "fifo":
        os.mkfifo(path)
    else:
        import socket

        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(path))
    return path


def raising_configs() -> object:
    """A --configs strategy whose every draw raises."""
    from hypothesis import strategies as st

    def planted(_: int) -> object:
        raise RuntimeError("planted in the config strategy")

    return st.integers(0, 3).map(planted)
