"""--quiet prints the verdict line only (a failure still prints its report), and a run
that shrinks a failure says so on stderr even off a terminal (ShrinkNotice)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.cli.main import main
from schedspec.cli.printing.progress import SHRINK_REPORT_EVERY, ShrinkNotice, suite_progress
from schedspec.properties.state_machine import SuiteRecorder
from schedspec.traces.trace import Trace
from tests.sched_helpers import make_config

BROKEN = "tests.broken_engines:wrong_total"


def test_a_passing_check_prints_one_line_quietly() -> None:
    result = CliRunner().invoke(main, ["check", "--examples", "3", "--seed", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "PASSED: every invariant of profile vllm-v1 held\n"
    loud = CliRunner().invoke(main, ["check", "--examples", "3", "--seed", "1"])
    assert len(loud.stdout.splitlines()) > 20  # the tables --quiet leaves out


def test_a_passing_diff_prints_one_line_quietly() -> None:
    args = ["diff", "--left", "reference", "--right", "reference", "--examples", "2", "--quiet"]
    result = CliRunner().invoke(main, [*args, "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "PASSED: the engines agreed at every step; each held every invariant of vllm-v1"
    ]


def test_a_failing_check_still_prints_its_failure_quietly(tmp_path: Path) -> None:
    args = ["check", "--engine", BROKEN, "--seed", "3", "--examples", "20", "--quiet"]
    result = CliRunner().invoke(main, [*args, "--trace-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "VIOLATION after event 2 (Step):"
    assert any(line.startswith("replay it: schedspec replay") for line in lines)
    assert lines[-1] == "FAILED: BUDGET (seed 3)"
    assert not any(line.startswith(("invariant ", "corner ", "checking ")) for line in lines)
    assert "shrinking" not in result.stderr


def test_a_failing_check_says_it_shrinks_on_stderr(tmp_path: Path) -> None:
    args = ["check", "--engine", BROKEN, "--seed", "3", "--examples", "20"]
    result = CliRunner().invoke(main, [*args, "--trace-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    (notice,) = [line for line in result.stderr.splitlines() if "shrinking it" in line]
    assert notice.startswith("example 3 failed (")


def _failing(recorder: SuiteRecorder, events: int) -> None:
    config = make_config()
    recorder.examples += 1
    recorder.failed(Trace(config, (object(),) * events), AssertionError())  # type: ignore[arg-type]


def test_shrink_notice_says_when_shrinking_starts_then_every_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    now = [100.0]
    notice = ShrinkNotice(clock=lambda: now[0])
    recorder = SuiteRecorder()
    recorder.examples = 4
    notice(recorder)  # still searching: nothing
    _failing(recorder, 30)
    notice(recorder)
    for _ in range(3):
        _failing(recorder, 12)
        now[0] += SHRINK_REPORT_EVERY / 2
        notice(recorder)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("example 5 failed (30 events); shrinking it")
    # An interval after the start (two candidates on): one report; the third comes too soon.
    assert lines[1:] == [
        "shrinking: 2 candidates tried, the latest failing one has 12 events (10 s)"
    ]


def test_no_shrink_notice_when_quiet_and_a_bar_or_lines_otherwise() -> None:
    with suite_progress(10, forced=False, quiet=True, tty=False) as quiet:
        assert quiet is None
    with suite_progress(10, forced=False, tty=False) as plain:
        assert isinstance(plain, ShrinkNotice)
    with suite_progress(10, forced=True, tty=False) as forced:
        assert forced is not None and not isinstance(forced, ShrinkNotice)


def test_swarm_mode_refuses_quiet() -> None:
    result = CliRunner().invoke(main, ["check", "--engine", "gpu", "--instances", "2", "--quiet"])
    assert result.exit_code == 2
    assert "--quiet: not used in swarm mode (--instances 2)" in result.output


def test_replay_quietly_prints_a_pass_in_one_line_and_a_failure_in_full(tmp_path: Path) -> None:
    args = ["check", "--engine", BROKEN, "--seed", "3", "--examples", "20", "--quiet"]
    assert CliRunner().invoke(main, [*args, "--trace-dir", str(tmp_path)]).exit_code == 1
    trace = str(tmp_path / "schedspec-failure-3.json")
    passed = CliRunner().invoke(main, ["replay", trace, "--quiet"])
    assert passed.exit_code == 0, passed.output
    assert passed.stdout.splitlines() == [
        "PASSED: all 3 events held every invariant of vllm-v1 (1 step checked)"
    ]
    loud = CliRunner().invoke(main, ["replay", trace, "--engine", BROKEN])
    quiet = CliRunner().invoke(main, ["replay", trace, "--engine", BROKEN, "--quiet"])
    assert quiet.exit_code == loud.exit_code == 1
    assert quiet.stdout == loud.stdout  # a failure prints in full
    assert quiet.stdout.splitlines()[-1] == "FAILED at event 2 (Step): BUDGET broke"
