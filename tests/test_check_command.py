"""`schedspec check` and `schedspec replay` end to end, through click's test runner."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from schedspec.cli.check import CheckOptions
from schedspec.cli.main import main
from schedspec.engines.events import AddRequest, Step
from schedspec.properties.run_plan import suite_settings
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import CATALOGUE, in_profile
from schedspec.traces.trace import Trace

BROKEN = "tests.broken_engines:wrong_total"
PROFILELESS = "tests.broken_engines:profileless"
# The run flags left at their defaults (CheckOptions takes them by name).
RUN_SHAPE: dict[str, Any] = {
    "profile": None,
    "examples": None,
    "seed": None,
    "max_steps": None,
    "trace_dir": Path(),
    "progress": False,
}
# A seed whose search finds the planted bug quickly and shrinks it to three events.
BROKEN_SEED = "1"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _table_rows(output: str) -> dict[str, list[str]]:
    """invariant id -> [kind, profile, checked, failures], from the check table."""
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[0] in CATALOGUE:
            rows[cells[0]] = cells[1:]
    return rows


class TestPassingCheck:
    def test_reference_passes_and_prints_the_table(self) -> None:
        result = _invoke("check", "--examples", "5")
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("seed ")  # no --seed: the chosen one comes first
        assert "rerun with --seed" in result.stdout
        rows = _table_rows(result.stdout)
        # The reference claims vllm-v1 by default: every invariant of that profile, but
        # those of hybrid KV cache groups, which the default configs do not have.
        assert set(rows) == {
            i
            for i, info in CATALOGUE.items()
            if in_profile(info, "vllm-v1") and info.applies_to(hybrid=False)
        }
        assert all(failures == "0" for *_, failures in rows.values())
        # Five examples on an unknown seed may draw no synchronous config with drafts,
        # so no proposal of drafts: every other kind is checked in any run.
        assert all(int(checked) > 0 for kind, _, checked, _ in rows.values() if kind != "drafts")
        assert rows["BUDGET"][:2] == ["schedule", "safety"]
        assert "steps checked: " in result.stdout and "steps/s: " in result.stdout
        assert "PASSED" in result.stdout
        assert result.stderr == ""  # no progress bar off a terminal unless asked

    def test_every_invariant_is_checked_in_a_ci_sized_run(self) -> None:
        result = _invoke("check", "--examples", "20", "--seed", "1")
        assert result.exit_code == 0, result.output
        rows = _table_rows(result.stdout)
        assert all(int(checked) > 0 for *_, checked, _ in rows.values())
        assert rows["DRAFT-KEEP"][:2] == ["drafts", "vllm-v1"]

    def test_profile_safety_lists_only_safety_invariants(self) -> None:
        result = _invoke("check", "--examples", "3", "--seed", "4", "--profile", "safety")
        assert result.exit_code == 0, result.output
        expected = {
            i.id
            for i in CATALOGUE.values()
            if in_profile(i, "safety") and i.applies_to(hybrid=False)
        }
        assert set(_table_rows(result.stdout)) == expected
        assert "seed 4: rerun" not in result.stdout  # the user knows a seed they gave

    def test_flags_shape_the_run(self) -> None:
        result = _invoke(
            "check", "--examples", "4", "--seed", "1", "--max-steps", "7", "--progress"
        )
        assert result.exit_code == 0, result.output
        assert "4 examples of up to 7 actions" in result.stdout
        assert "checking: " in result.stderr and "\r" not in result.stderr  # plain lines in logs

    def test_the_examples_count_is_the_number_run(self) -> None:
        """Without a failure the totals count the examples asked for, plus any that
        Hypothesis drew and dropped for outgrowing its choice budget (they were checked)."""
        result = _invoke("check", "--examples", "5", "--seed", "2")
        (totals,) = [line for line in result.stdout.splitlines() if line.startswith("examples: ")]
        assert re.match(r"examples: \d+  steps checked: ", totals), totals
        assert int(totals.split()[1]) >= 5
        assert "first failure" not in totals

    def test_same_seed_same_counts(self) -> None:
        first = _table_rows(_invoke("check", "--examples", "3", "--seed", "9").stdout)
        assert first == _table_rows(_invoke("check", "--examples", "3", "--seed", "9").stdout)

    def test_long_profile_from_flag_or_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        options = CheckOptions(**RUN_SHAPE, engine="reference", long=False, shrink=True)
        assert suite_settings(options.request, seed=1).examples == 100
        monkeypatch.setenv("SCHEDSPEC_LONG", "1")
        assert suite_settings(options.request, seed=1).examples == 2000
        monkeypatch.delenv("SCHEDSPEC_LONG")
        long_run = CheckOptions(
            **{**RUN_SHAPE, "examples": 7, "seed": 3, "max_steps": 9},
            engine="reference",
            long=True,
            shrink=False,
        )
        chosen = suite_settings(long_run.request, seed=3)
        assert (chosen.examples, chosen.rules_per_example, chosen.shrink) == (7, 9, False)


@dataclass
class FailedCheck:
    result: Result
    trace: Path


@pytest.fixture(scope="module")
def failed_check(tmp_path_factory: pytest.TempPathFactory) -> FailedCheck:
    trace_dir = tmp_path_factory.mktemp("traces")
    result = _invoke(
        "check",
        "--engine",
        BROKEN,
        "--seed",
        BROKEN_SEED,
        "--examples",
        "20",
        "--trace-dir",
        str(trace_dir),
    )
    return FailedCheck(result, trace_dir / f"schedspec-failure-{BROKEN_SEED}.json")


class TestFailingCheck:
    def test_exits_1_naming_the_violation(self, failed_check: FailedCheck) -> None:
        result = failed_check.result
        assert result.exit_code == 1, result.output
        assert "VIOLATION after event" in result.stdout
        assert "[BUDGET] total_num_scheduled_tokens is not the sum" in result.stdout
        assert _table_rows(result.stdout)["BUDGET"][-1] == "1"
        assert _table_rows(result.stdout)["SEQS"][-1] == "0"
        assert result.stdout.rstrip().endswith(f"FAILED: BUDGET (seed {BROKEN_SEED})")

    def test_the_examples_count_says_what_shrinking_added(self, failed_check: FailedCheck) -> None:
        """20 examples asked for; the search failed in one of them and shrinking ran
        many more, all counted (every one of them was checked)."""
        out = failed_check.result.stdout
        assert "20 examples of up to 40 actions" in out
        (totals,) = [line for line in out.splitlines() if line.startswith("examples: ")]
        found = re.match(
            r"examples: (\d+) \(the first failure in example (\d+), then shrinking\)  steps", totals
        )
        assert found is not None, totals
        run, first = int(found[1]), int(found[2])
        assert 1 <= first <= 20 < run

    def test_prints_the_counterexample_with_what_the_engine_scheduled(
        self, failed_check: FailedCheck
    ) -> None:
        out = failed_check.result.stdout
        assert "Shrunk counterexample (3 events)" in out
        assert "  config: block_size=" in out
        assert "  #0 add_request 'r0' prompt=[" in out
        assert "  #2 step\n" in out or "  #2 drain (" in out  # the failing step, alone or drained
        # The engine's own decisions, with the total it wrongly claimed.
        assert "scheduled: r0=1 r1=1 (total 3) | preempted: - | finished: -" in out
        assert "      ^ [BUDGET]" in out

    def test_writes_the_trace_and_the_replay_command(self, failed_check: FailedCheck) -> None:
        assert failed_check.trace.exists()
        out = failed_check.result.stdout
        assert f"trace written to {failed_check.trace}" in out
        assert f"schedspec replay {failed_check.trace} --engine {BROKEN} --profile vllm-v1" in out

    def test_replay_on_the_broken_engine_names_the_event(self, failed_check: FailedCheck) -> None:
        result = _invoke("replay", str(failed_check.trace), "--engine", BROKEN)
        assert result.exit_code == 1, result.output
        event = "Drain" if "event 2 (Drain)" in result.stdout else "Step"  # how the trace ends
        assert f"FAILED at event 2 ({event}): BUDGET broke" in result.stdout
        assert f"recorded failure: after event 2 ({event}):" in result.stdout

    def test_the_trace_replays_clean_on_the_reference(self, failed_check: FailedCheck) -> None:
        for profile in ("safety", "vllm-v1"):
            result = _invoke("replay", str(failed_check.trace), "--profile", profile)
            assert result.exit_code == 0, result.output
            assert "scheduled: r0=1 r1=1 (total 2)" in result.stdout
            assert f"PASSED: all 3 events held every invariant of {profile}" in result.stdout

    def test_default_trace_dir_is_the_working_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(tmp_path)  # `check` puts the cwd on sys.path; undo it after
        args = ["--engine", BROKEN, "--seed", BROKEN_SEED, "--examples", "20", "--no-shrink"]
        result = _invoke("check", *args)
        assert result.exit_code == 1, result.output
        assert (tmp_path / f"schedspec-failure-{BROKEN_SEED}.json").exists()


class TestEngineCrash:
    def test_replay_names_the_event_where_the_engine_raised(self, tmp_path: Path) -> None:
        config = SchedulerConfig(
            block_size=4, num_blocks=8, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=16
        )
        events = (AddRequest("a", (1, 2, 3), max_tokens=8), Step(), Step(), Step())
        path = tmp_path / "steps.json"
        Trace(config, events).save(path)
        result = _invoke("replay", str(path), "--engine", "tests.broken_engines:crashing")
        assert result.exit_code == 4, result.output  # an engine error (reports.EXIT_CODES)
        assert "RuntimeError: planted crash in schedule()" in result.stdout
        assert "FAILED at event 3 (Step): the engine raised" in result.stdout
        assert _invoke("replay", str(path)).exit_code == 0

    def test_check_reports_the_traceback(self, tmp_path: Path) -> None:
        args = ["--engine", "tests.broken_engines:crashing", "--seed", "1", "--examples", "5"]
        result = _invoke("check", *args, "--trace-dir", str(tmp_path))  # not into the checkout
        assert result.exit_code == 4, result.output  # an engine error (reports.EXIT_CODES)
        assert "the engine raised in schedule():" in result.stdout
        assert "RuntimeError: planted crash in schedule()" in result.stdout
        assert "FAILED: the engine crashed" in result.stdout


class TestUsageErrors:
    @pytest.mark.parametrize(
        ("engine", "message"),
        [
            (
                "nope",
                "expected 'reference', 'gpu', 'vllm', 'sglang', or module:factory, got 'nope'",
            ),
            ("no_such_module_x:f", "cannot import 'no_such_module_x'"),
            ("tests.broken_engines:NOT_A_FACTORY", "has no callable 'NOT_A_FACTORY'"),
        ],
    )
    def test_bad_engine_exits_2(self, engine: str, message: str) -> None:
        result = _invoke("check", "--engine", engine)
        assert result.exit_code == 2
        assert "Invalid value for '--engine'" in result.stderr and message in result.stderr

    def test_profile_the_engine_does_not_claim_exits_2(self) -> None:
        engine = "tests.broken_engines:safety_only"
        result = _invoke("check", "--engine", engine, "--profile", "vllm-v1")
        assert result.exit_code == 2
        assert "Invalid value for '--profile'" in result.stderr
        assert "claims ['safety']" in result.stderr
        # It says how to claim one: the attribute, and where the rules are.
        how = " ".join(result.stderr.split())
        assert "setting its `profiles` attribute" in how
        assert "profiles = frozenset({'safety', 'vllm-v1'})" in how
        assert "docs/SPEC.md#two-families" in how
        spec = Path(__file__).resolve().parent.parent / "docs" / "SPEC.md"
        assert "\n## Two families\n" in spec.read_text(encoding="utf-8")
        # By default such an engine is checked on the profile it claims.
        result = _invoke("check", "--engine", engine, "--examples", "2", "--seed", "1")
        assert result.exit_code == 0, result.output
        assert "against profile safety" in result.stdout

    @pytest.mark.parametrize(
        ("args", "flag"),
        [
            (["check", "--engine", PROFILELESS], "--engine"),
            (["diff", "--right", PROFILELESS], "--right"),
            (["diff", "--left", PROFILELESS, "--right", "reference"], "--left"),
        ],
    )
    def test_an_adapter_without_profiles_exits_2_naming_the_attribute(
        self, args: list[str], flag: str
    ) -> None:
        result = _invoke(*args, "--examples", "2", "--seed", "1")
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{flag}'" in result.stderr
        assert "ProfilelessEngine has no `profiles` attribute" in result.stderr
        assert "Traceback" not in result.output

    def test_replay_on_an_adapter_without_profiles_exits_2(self, failed_check: FailedCheck) -> None:
        result = _invoke("replay", str(failed_check.trace), "--engine", PROFILELESS)
        assert result.exit_code == 2, result.output
        assert "has no `profiles` attribute" in result.stderr

    def test_corrupted_trace_exits_2_naming_the_field(
        self, failed_check: FailedCheck, tmp_path: Path
    ) -> None:
        document = json.loads(failed_check.trace.read_text())
        document["events"][1]["max_tokens"] = "many"
        corrupted = tmp_path / "corrupted.json"
        corrupted.write_text(json.dumps(document))
        result = _invoke("replay", str(corrupted))
        assert result.exit_code == 2
        assert "Invalid value for 'TRACE'" in result.stderr
        assert "events[1].max_tokens: must be an int, got 'many'" in result.stderr

    def test_trace_that_is_not_json_exits_2(self, tmp_path: Path) -> None:
        garbage = tmp_path / "garbage.json"
        garbage.write_text("{not json")
        result = _invoke("replay", str(garbage))
        assert result.exit_code == 2
        assert "trace: " in result.stderr and "is not JSON" in result.stderr

    def test_missing_trace_exits_2(self, tmp_path: Path) -> None:
        assert _invoke("replay", str(tmp_path / "absent.json")).exit_code == 2
