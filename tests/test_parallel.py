"""run_suite over several processes: the same result, the failure rebuilt from its trace."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from schedspec.adapters.reference import reference_engine
from schedspec.campaign.parallel import run_suite_parallel
from schedspec.cli.main import main
from schedspec.properties.suite import SuiteSettings
from tests.broken_engines import wrong_total


def test_reference_passes_on_two_workers() -> None:
    result = run_suite_parallel(reference_engine, "vllm-v1", SuiteSettings(examples=20, seed=3), 2)
    assert result.passed, result.error or result.other_error
    assert result.examples >= 20
    assert result.stats.steps > 0
    assert result.seed == 3


def test_a_failure_comes_back_with_its_error_and_trace(tmp_path: Path) -> None:
    result = run_suite_parallel(
        wrong_total, "vllm-v1", SuiteSettings(examples=20, seed=1), 2, trace_dir=tmp_path
    )
    assert not result.passed
    assert result.error is not None
    assert {v.invariant for v in result.error.violations} == {"BUDGET"}
    assert result.trace is not None and len(result.trace.events) <= 4
    assert result.trace_path is not None and result.trace_path.exists()


def test_check_takes_workers() -> None:
    outcome = CliRunner().invoke(
        main, ["check", "--workers", "2", "--examples", "10", "--seed", "1", "--trace-dir", "/tmp"]
    )
    assert outcome.exit_code == 0, outcome.output
    assert "PASSED" in outcome.output
