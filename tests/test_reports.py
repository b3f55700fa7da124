"""CI reports and exit codes of `schedspec check`, `diff`, `replay` and `diff-replay`."""

from __future__ import annotations

import json
import signal
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from schedspec.cli.exit_codes import EXIT_CODES, Outcome
from schedspec.cli.main import main
from schedspec.cli.printing.check_report import invariants_of
from schedspec.engines.boundary import GuardedEngine
from schedspec.engines.events import AddRequest, Step
from schedspec.engines.watchdog import StepTimeoutError, Watchdog
from schedspec.spec import SchedulerConfig
from schedspec.traces.trace import Trace
from tests.diff_engines import hanging

HANG = "tests.diff_engines:hanging"
CRASH = "tests.broken_engines:crashing"
LIMIT = "0.2"  # seconds: the hanging engine sleeps a minute


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Traces written to the working directory land in tmp_path, not the repository."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(tmp_path)  # the commands put the cwd on sys.path; undo it after


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _reported(tmp_path: Path, *args: str) -> tuple[Result, ET.Element, dict[str, Any]]:
    """Run a command with --junit and --json; its result and both parsed reports."""
    junit, summary = tmp_path / "out" / "junit.xml", tmp_path / "out" / "summary.json"
    result = _invoke(*args, "--junit", str(junit), "--json", str(summary))
    return result, ET.parse(junit).getroot(), json.loads(summary.read_text())


def _cases(root: ET.Element) -> dict[str, ET.Element]:
    suite = root.find("testsuite")
    assert suite is not None
    return {case.attrib["name"]: case for case in suite.iter("testcase")}


def _only_failures(root: ET.Element) -> dict[str, str]:
    """testcase name -> 'failure' or 'error', for the testcases that did not pass."""
    return {
        name: child.tag
        for name, case in _cases(root).items()
        for child in case
        if child.tag in ("failure", "error")
    }


def test_exit_codes_are_distinct() -> None:
    assert dict(EXIT_CODES) == {
        Outcome.PASSED: 0,
        Outcome.VIOLATION: 1,
        Outcome.USAGE_ERROR: 2,
        Outcome.DIVERGENCE: 3,
        Outcome.ENGINE_ERROR: 4,
        Outcome.HANG: 5,
        Outcome.HARNESS_ERROR: 6,
        Outcome.INTERRUPTED: 130,
    }


class TestCheckReports:
    def test_a_passing_run(self, tmp_path: Path) -> None:
        result, root, summary = _reported(tmp_path, "check", "--examples", "3", "--seed", "2")
        assert result.exit_code == 0, result.output
        names = [i.id for i in invariants_of("vllm-v1")]
        assert list(_cases(root)) == [*names, "engine-errors", "harness"]
        assert _only_failures(root) == {}
        assert root.attrib["failures"] == root.attrib["errors"] == "0"
        assert summary["outcome"] == "passed" and summary["exit_code"] == 0
        assert summary["engines"] == {"engine": "reference"} and summary["seed"] == 2
        assert summary["violations"] == [] and summary["trace"] is None
        assert set(summary["invariants"]) == set(names)
        assert summary["invariants"]["BUDGET"]["checked"] == summary["steps"] > 0
        assert summary["examples"] >= 3 and summary["first_failure_example"] is None

    def test_a_violation(self, tmp_path: Path) -> None:
        args = ("check", "--engine", "tests.broken_engines:wrong_total", "--seed", "1")
        trace_dir = tmp_path / "traces"
        result, root, summary = _reported(
            tmp_path, *args, "--examples", "20", "--trace-dir", str(trace_dir)
        )
        assert result.exit_code == 1, result.output
        assert _only_failures(root) == {"BUDGET": "failure"}
        failure = _cases(root)["BUDGET"].find("failure")
        assert failure is not None and failure.text is not None
        assert "[BUDGET] total_num_scheduled_tokens is not the sum" in failure.attrib["message"]
        assert "replay it: schedspec replay" in failure.text
        assert "after event 2 (Step)" in failure.text or "after event 2 (Drain)" in failure.text
        assert summary["outcome"] == "violation" and summary["exit_code"] == 1
        assert summary["invariants"]["BUDGET"]["failures"] == 1
        assert summary["invariants"]["SEQS"]["failures"] == 0
        (violation,) = summary["violations"]
        assert violation["invariant"] == "BUDGET" and violation["event_index"] == 2
        assert (violation["expected"], violation["actual"]) == (2, 3)
        assert violation["rule"] == "docs/SPEC.md#budget"
        assert "rule: docs/SPEC.md#budget" in failure.attrib["message"]
        assert summary["trace"] == {
            "path": str(trace_dir / "schedspec-failure-1.json"),
            "events": 3,
        }
        assert Path(summary["trace"]["path"]).exists()
        # Examples run: the search's up to its first failure, then shrinking's.
        assert 1 <= summary["first_failure_example"] < summary["examples"]

    def test_an_engine_error(self, tmp_path: Path) -> None:
        args = ("check", "--engine", CRASH, "--seed", "1", "--examples", "5", "--no-shrink")
        result, root, summary = _reported(tmp_path, *args, "--trace-dir", str(tmp_path))
        assert result.exit_code == 4, result.output
        assert _only_failures(root) == {"engine-errors": "error"}
        error = _cases(root)["engine-errors"].find("error")
        assert error is not None and error.attrib["type"] == "RuntimeError"
        assert "planted crash in schedule()" in (error.text or "")
        assert summary["outcome"] == "engine-error" and summary["exit_code"] == 4
        assert summary["engine_error"]["type"] == "RuntimeError"
        assert "planted crash" in summary["engine_error"]["traceback"]
        assert summary["trace"] is not None  # the harness kept going and wrote the trace

    def test_an_engine_that_cannot_be_built(self, tmp_path: Path) -> None:
        args = ("check", "--engine", "tests.diff_engines:unbuildable")
        result, root, summary = _reported(tmp_path, *args)
        assert result.exit_code == 4, result.output
        assert "planted failure while building the engine" in result.stdout
        assert list(_cases(root)) == ["engine-errors", "harness"]  # no profile: no invariants
        assert summary["outcome"] == "engine-error" and summary["profile"] is None

    def test_a_hang(self, tmp_path: Path) -> None:
        args = ("check", "--engine", HANG, "--seed", "1", "--examples", "3")
        trace_dir = tmp_path / "traces"
        result, root, summary = _reported(
            tmp_path, *args, "--step-timeout", LIMIT, "--trace-dir", str(trace_dir)
        )
        assert result.exit_code == 5, result.output
        assert "the engine hung: schedule() ran past the step time limit of 0.2 s" in result.stdout
        assert "time.sleep(60)" in result.stdout  # where the engine was stopped
        assert "not shrunk: a hang" in result.stdout
        error = _cases(root)["engine-errors"].find("error")
        assert error is not None and error.attrib["type"] == "StepTimeoutError"
        assert summary["outcome"] == "hang" and summary["engine_error"]["hang"] is True
        trace = summary["trace"]["path"]
        replayed = _invoke("replay", trace, "--engine", HANG, "--step-timeout", LIMIT)
        assert replayed.exit_code == 5, replayed.output
        assert "the engine hung" in replayed.stdout


class TestDiffReports:
    def test_a_divergence(self, tmp_path: Path) -> None:
        args = ("diff", "--right", "tests.diff_engines:short_prefill", "--seed", "1")
        result, root, summary = _reported(
            tmp_path, *args, "--examples", "20", "--no-shrink", "--trace-dir", str(tmp_path)
        )
        assert result.exit_code == 3, result.output
        assert "DIVERGENCE after event" in result.stdout and "num_scheduled_tokens" in result.stdout
        assert "      left   scheduled: " in result.stdout  # side by side
        assert "      right  scheduled: " in result.stdout
        assert list(_cases(root))[-3:] == ["engine-errors", "lockstep", "harness"]
        assert _only_failures(root) == {"lockstep": "failure"}
        failure = _cases(root)["lockstep"].find("failure")
        assert failure is not None and failure.attrib["type"] == "Divergence"
        assert "num_scheduled_tokens differs" in failure.attrib["message"]
        assert summary["outcome"] == "divergence" and summary["exit_code"] == 3
        assert summary["engines"] == {"left": "reference", "right": args[2]}
        assert summary["profile"] == "safety"  # what both engines claim
        assert summary["divergence"]["field"] == "num_scheduled_tokens"
        assert summary["options"]["compare_block_ids"] is False
        trace = summary["trace"]["path"]
        assert trace == str(tmp_path / "schedspec-diff-1.json")
        assert summary["replay_command"].startswith(f"schedspec diff-replay {trace} --left")
        replayed = _invoke("diff-replay", trace, "--right", args[2])
        assert replayed.exit_code == 3, replayed.output
        assert "DIVERGED after event" in replayed.stdout
        same = _invoke("diff-replay", trace, "--right", "reference")
        assert same.exit_code == 0, same.output
        assert "PASSED: the engines agreed on all" in same.stdout

    def test_identical_engines_pass(self, tmp_path: Path) -> None:
        args = ("diff", "--right", "reference", "--examples", "3", "--seed", "4")
        result, root, summary = _reported(tmp_path, *args, "--compare-block-ids")
        assert result.exit_code == 0, result.output
        assert _only_failures(root) == {}
        assert summary["outcome"] == "passed" and summary["profile"] == "vllm-v1"

    def test_a_violation_in_one_engine(self, tmp_path: Path) -> None:
        args = ("diff", "--right", "tests.broken_engines:wrong_total", "--seed", "1")
        result, root, summary = _reported(tmp_path, *args, "--examples", "20", "--no-shrink")
        assert result.exit_code == 1, result.output
        assert "VIOLATION (right engine)" in result.stdout
        assert _only_failures(root) == {"BUDGET": "failure"}
        assert summary["violations"][0]["engine"] == "right"

    def test_an_engine_error_and_a_hang(self, tmp_path: Path) -> None:
        crash = _invoke(
            "diff", "--left", CRASH, "--right", "reference", "--seed", "1", "--no-shrink"
        )
        assert crash.exit_code == 4, crash.output
        assert "raised by the left engine" in crash.stdout
        args = ("diff", "--right", HANG, "--seed", "1", "--examples", "3")
        result, root, summary = _reported(tmp_path, *args, "--step-timeout", LIMIT)
        assert result.exit_code == 5, result.output
        assert _only_failures(root) == {"engine-errors": "error"}
        assert summary["outcome"] == "hang" and summary["engine_error"]["engine"] == "right"

    def test_usage_errors_exit_2(self) -> None:
        assert _invoke("diff").exit_code == 2  # --right is required
        assert _invoke("diff", "--right", "nope").exit_code == 2
        unclaimed = _invoke("diff", "--right", "tests.diff_engines:victim", "--profile", "vllm-v1")
        assert unclaimed.exit_code == 2
        assert "the right engine claims ['safety']" in unclaimed.stderr


class TestWatchdog:
    def test_a_call_past_the_limit_raises_inside_the_engine(self) -> None:
        config = SchedulerConfig(
            block_size=1, num_blocks=4, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=4
        )
        before = signal.getsignal(signal.SIGALRM)
        with Watchdog(0.05) as watchdog:
            engine = GuardedEngine(hanging(config), watchdog)
            engine.add_request(AddRequest("a", (1,), 3).to_request())
            engine.schedule()
            engine.schedule()
            with pytest.raises(StepTimeoutError, match=r"schedule\(\) ran past"):
                engine.schedule()  # the third one sleeps
            time.sleep(0.1)  # disarmed after the call: no stray alarm goes off here
        assert signal.getsignal(signal.SIGALRM) == before

    def test_no_limit_leaves_calls_alone(self) -> None:
        with Watchdog(0) as watchdog:
            assert not watchdog.active
            assert watchdog.run("f()", lambda: 7) == 7

    def test_replay_of_a_trace_on_a_hanging_engine(self, tmp_path: Path) -> None:
        config = SchedulerConfig(
            block_size=4, num_blocks=8, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=16
        )
        path = tmp_path / "steps.json"
        Trace(config, (AddRequest("a", (1, 2, 3), 8), Step(), Step(), Step())).save(path)
        result = _invoke("replay", str(path), "--engine", HANG, "--step-timeout", LIMIT)
        assert result.exit_code == 5, result.output
        assert "FAILED at event 3 (Step): the engine hung" in result.stdout
