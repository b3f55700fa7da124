"""`schedspec run --execute`: the built-in workload through the tiny paged model."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from schedspec.cli import run as run_command
from schedspec.cli.main import main
from schedspec.cli.mixed_workload import build_workload
from schedspec.gpu_impl.execution.builtin_workload import fit_workload
from tests.test_execution_invariance import one_thread, tiny_model  # noqa: F401
from tests.test_execution_mutants import content_blind_engine

# A scaled-down workload (max_model_len 256) keeps the test quick; the default
# run is the same code on longer prompts.
SMALL = ["run", "--execute", "--max-model-len", "256", "--num-blocks", "17"]


def test_run_execute_reports_every_output_matched() -> None:
    result = CliRunner().invoke(main, SMALL)
    assert result.exit_code == 0, result.output
    assert "Output invariance: 14/14 requests matched the dense" in result.output
    assert "Slot safety held on all" in result.output
    assert "preemptions: 0 " not in result.output  # the small cache still preempts


def test_run_execute_fails_when_the_scheduler_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler whose prefix cache ignores content: the report says so, exit 1."""
    monkeypatch.setattr(run_command, "Scheduler", content_blind_engine)
    result = CliRunner().invoke(main, SMALL)
    assert result.exit_code == 1
    # A same-step hit on a block another prompt is computing: its write clobbers the hit.
    assert "Slot safety violated: WRITE-NO-CLOBBER: request 'A' writes position 0" in result.output
    assert "Error: the paged run failed its checks (see above)" in result.output


def test_run_execute_refuses_json() -> None:
    result = CliRunner().invoke(main, [*SMALL, "--json"])
    assert result.exit_code == 2
    assert "--execute prints a text report; drop --json" in result.output


def test_the_workload_is_folded_into_the_vocabulary_and_stops_where_the_model_emits_eos() -> None:
    """Early stops ask token_at for a position; the answer is the tiny model's token
    there, so E stops at its 64th output at the latest (earlier if that token recurs)."""
    model = tiny_model()
    arrivals = fit_workload(lambda token_at: build_workload(1024, 0, token_at), model, 1024)
    assert all(t < 96 for a in arrivals for t in a.request.prompt_token_ids)
    eos = {a.request.request_id: a.request.eos_token_id for a in arrivals}
    assert {rid for rid, token in eos.items() if token is not None} == {"E", "M"}
