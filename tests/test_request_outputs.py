"""update_from_output reports each sampling request's kept tokens and finish status,
and STOP holds an engine to that report."""

from __future__ import annotations

import dataclasses

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest
from schedspec.engines.fake_model import StepDecisions
from schedspec.properties.checked_engine import CheckedEngine
from schedspec.spec import ModelRunnerOutput, RequestOutput, RequestStatus
from schedspec.spec.invariants import CHECKS, UpdateTransition
from tests.sched_helpers import add, make_config, make_scheduler


def test_reference_reports_kept_tokens_and_why_it_finished() -> None:
    scheduler = make_scheduler(num_speculative_tokens=3)
    add(scheduler, "a", 5, eos_token_id=2)
    add(scheduler, "b", 5, max_tokens=1)
    out = scheduler.schedule()
    reported = scheduler.update_from_output(out, ModelRunnerOutput({"a": [50], "b": [60]}))
    assert reported == {
        "a": RequestOutput("a", (50,), None, 5),
        "b": RequestOutput("b", (60,), RequestStatus.FINISHED_LENGTH_CAPPED, 5),
    }
    scheduler.update_draft_token_ids({"a": [51, 2, 53]})
    out = scheduler.schedule()
    reported = scheduler.update_from_output(out, ModelRunnerOutput({"a": [51, 2, 60]}))
    # 51 accepted, EOS (2) stops it, 60 dropped: 6 + 2 tokens, all but the last computed.
    assert reported == {"a": RequestOutput("a", (51, 2), RequestStatus.FINISHED_STOPPED, 7)}


def _stop_transition() -> UpdateTransition:
    """'a' emits its EOS on its first sampled token."""
    checked = CheckedEngine.from_factory(reference_engine, make_config(), "safety")
    checked.apply(AddRequest("a", (1, 2, 3), 4, eos_token_id=9))
    output = checked.engine.schedule()
    mid = checked.engine.snapshot()
    model_output = checked.model.execute(output, StepDecisions(stops={"a": 9}))
    reported = checked.engine.update_from_output(output, model_output)
    return UpdateTransition(mid, output, model_output, checked.engine.snapshot(), reported)


def test_stop_checks_the_report() -> None:
    good = _stop_transition()
    assert CHECKS["STOP"](good) == []
    assert good.request_outputs == {
        "a": RequestOutput("a", (9,), RequestStatus.FINISHED_STOPPED, 3)
    }
    capped = RequestOutput("a", (9,), RequestStatus.FINISHED_LENGTH_CAPPED)
    (violation,) = CHECKS["STOP"](dataclasses.replace(good, request_outputs={"a": capped}))
    assert violation.message == "reported finish status"
    extra = RequestOutput("a", (9, 4), RequestStatus.FINISHED_STOPPED)
    (violation,) = CHECKS["STOP"](dataclasses.replace(good, request_outputs={"a": extra}))
    assert "up to the stop" in violation.message
    (violation,) = CHECKS["STOP"](dataclasses.replace(good, request_outputs={}))
    assert "no output reported" in violation.message
    # An engine that reports nothing is not held to a report.
    assert CHECKS["STOP"](dataclasses.replace(good, request_outputs=None)) == []


def test_rollback_checks_a_finished_requests_reported_computed_count() -> None:
    good = _stop_transition()
    assert CHECKS["ROLLBACK"](good) == []
    # A stop that forgets to pull back the dropped tokens' count is visible here only.
    stale = RequestOutput("a", (9,), RequestStatus.FINISHED_STOPPED, 4)
    (violation,) = CHECKS["ROLLBACK"](dataclasses.replace(good, request_outputs={"a": stale}))
    assert violation.message == "reported num_computed_tokens after the output"
    assert (violation.expected, violation.actual) == (3, 4)
