"""Trace minimization: a failing trace loses every event it does not need."""

from __future__ import annotations

from schedspec.properties.events import Abort, AddRequest, ProposeDrafts, Step
from schedspec.properties.fake_model import StepDecisions
from schedspec.properties.minimize import failing_ids, minimize_trace
from schedspec.properties.reference_adapter import reference_engine
from schedspec.properties.trace import Trace
from tests.broken_engines import wrong_total
from tests.sched_helpers import make_config


def test_redundant_events_are_dropped_and_steps_simplified() -> None:
    # wrong_total miscounts once two requests share a step: two adds and a
    # step are needed, nothing else.
    noisy = Trace(
        make_config(num_speculative_tokens=2),
        (
            AddRequest("x", (1, 2, 3), 2),
            Abort(("x",)),
            AddRequest("a", (1,), 3),
            ProposeDrafts({"a": 1}),
            AddRequest("b", (2,), 3),
            AddRequest("c", (3,), 3),
            Step(StepDecisions(accepted={"a": 1})),
            Step(),
        ),
    )
    assert failing_ids(noisy, wrong_total, "safety") == {"BUDGET"}
    small = minimize_trace(noisy, wrong_total, "safety")
    assert len(small.events) == 3
    assert [type(e).__name__ for e in small.events] == ["AddRequest", "AddRequest", "Step"]
    assert small.events[-1] == Step()
    assert failing_ids(small, wrong_total, "safety") == {"BUDGET"}


def test_a_passing_trace_is_left_alone() -> None:
    trace = Trace(make_config(), (AddRequest("a", (1,), 1), Step()))
    assert minimize_trace(trace, reference_engine, "safety") == trace
