"""Aborts that arrive while a step runs (events.Step.aborts): the engine's loop decides
where they apply, and the harness follows it (docs/SPEC.md, "Aborts while a step runs").

vLLM drains its abort queue just before update_from_output of the step that lands; an
engine step that lands nothing leaves them to the next read of its input queue, after
the step; SGLang reads aborts only at the start of an iteration, so after the step too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import Abort, AddRequest, Drain, Event, Step
from schedspec.properties.checked_engine import CheckedEngine, replay
from schedspec.properties.corners import CORNER_NAMES
from schedspec.properties.differential import DiffOptions, diff_trace
from schedspec.properties.failure_report import format_event
from schedspec.properties.minimize import _simpler
from schedspec.spec import ModelRunnerOutput, Request, SchedulerConfig, SchedulerOutput
from schedspec.traces.trace import VERSION, Trace, TraceError, trace_from_json
from tests.sched_helpers import as_version, make_config


class CallLog:
    """The reference, with the order of its schedule / finish / update calls kept."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.inner: Any = reference_engine(config)
        self.profiles = self.inner.profiles
        self.calls: list[str] = []

    def add_request(self, request: Request) -> None:
        self.inner.add_request(request)

    def schedule(self) -> SchedulerOutput:
        self.calls.append("schedule")
        output: SchedulerOutput = self.inner.schedule()
        return output

    def finish_requests(self, request_ids: str | Iterable[str]) -> None:
        self.calls.append("finish")
        self.inner.finish_requests(request_ids)

    def update_from_output(self, output: SchedulerOutput, model_output: ModelRunnerOutput) -> Any:
        self.calls.append("update")
        return self.inner.update_from_output(output, model_output)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run(config: SchedulerConfig, events: Iterable[Event]) -> tuple[CallLog, CheckedEngine]:
    log = CallLog(config)
    profile = "sglang" if config.family == "sglang" else "vllm-v1"
    checked = CheckedEngine(log, config, profile)  # type: ignore[arg-type]
    for event in events:
        checked.apply(event)
    return log, checked


ADD_A = AddRequest("A", tuple(range(1, 9)), 5)
ADD_B = AddRequest("B", tuple(range(20, 24)), 5)


def test_vllm_applies_them_between_the_model_and_update_from_output() -> None:
    """Sync: A and B run in the step; A's abort lands after the model ran and before the
    update, so the update finds A gone and B alone gets its token."""
    log, checked = run(make_config(), [ADD_A, ADD_B, Step(aborts=("A",))])
    assert log.calls == ["schedule", "finish", "update"]
    assert set(checked.state.requests) == {"B"}
    assert len(checked.state.requests["B"].output_token_ids) == 1
    assert checked.stats.corners.get("abort-in-flight") == 1


def test_an_engine_step_that_lands_nothing_applies_them_after_it() -> None:
    """Async: the first engine step only schedules; the abort waits for the engine core's
    input queue, read before the next step. The next step lands the first one, whose
    output for A then changes nothing. A's step was in flight when its abort applied,
    so this is the corner too."""
    log, checked = run(
        make_config(async_scheduling=True), [ADD_A, ADD_B, Step(aborts=("A",)), Step()]
    )
    assert log.calls == ["schedule", "finish", "schedule", "update"]
    assert set(checked.state.requests) == {"B"}
    assert checked.stats.corners.get("abort-in-flight") == 1


def test_an_abort_between_steps_with_the_requests_step_in_flight_is_the_corner() -> None:
    """vLLM's batch queue (async) and SGLang's overlap loop keep a step in flight between
    engine steps: a plain abort of a request of that step meets it in flight. Synchronous,
    nothing is in flight between steps, and an abort there is not the corner."""
    _, pipelined = run(make_config(async_scheduling=True), [ADD_A, ADD_B, Step(), Abort(("A",))])
    assert pipelined.stats.corners.get("abort-in-flight") == 1
    _, synchronous = run(make_config(), [ADD_A, ADD_B, Step(), Abort(("A",))])
    assert not synchronous.stats.corners.get("abort-in-flight")


def test_async_vllm_applies_them_before_the_landing_step_update() -> None:
    log, checked = run(
        make_config(async_scheduling=True), [ADD_A, ADD_B, Step(), Step(aborts=("B",))]
    )
    assert log.calls == ["schedule", "schedule", "finish", "update"]
    assert set(checked.state.requests) == {"A"}
    assert checked.stats.corners.get("abort-in-flight") == 1


def test_sglang_reads_them_after_the_step() -> None:
    config = make_config(family="sglang", max_num_seqs=4)
    log, checked = run(config, [ADD_A, ADD_B, Step(aborts=("A",))])
    assert log.calls == ["schedule", "update", "finish"]
    # SGLang defers a running request's abort to its next step's landing (ABORT).
    assert checked.state.requests["A"].abort_pending
    assert not checked.stats.corners.get("abort-in-flight")
    checked.apply(Step())
    assert "A" not in checked.state.requests


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_reference_drains_clean_after_aborts_in_flight(async_scheduling: bool) -> None:
    """Every invariant holds through aborts of running, waiting and unknown ids in flight,
    and the drain frees every block (NO-LEAK): each block freed once."""
    events: list[Event] = [ADD_A, ADD_B, AddRequest("C", (7, 7, 7), 3), Step()]
    events += [Step(aborts=("B", "no-such-request")), Step(aborts=("C",)), Step(), Drain()]
    trace = Trace(make_config(async_scheduling=async_scheduling, max_num_seqs=2), tuple(events))
    checked = replay(trace, reference_engine, "vllm-v1")  # raises on a violation
    assert not checked.state.requests


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_vllm_makes_the_references_decisions_with_aborts_in_flight(
    async_scheduling: bool,
) -> None:
    """vLLM's own scheduler, driven through the same window: step for step the same
    decisions, block ids included, and nothing reported for the aborted requests."""
    pytest.importorskip("vllm", reason="vLLM is not installed: schedspec install vllm")
    from schedspec.adapters.vllm.engine import VllmEngine

    events: list[Event] = [ADD_A, ADD_B, AddRequest("C", (7, 7, 7), 3), Step()]
    events += [Step(aborts=("B",)), Step(aborts=("C", "A")), Step(), Drain()]
    config = make_config(async_scheduling=async_scheduling, max_num_seqs=2)
    result = diff_trace(
        Trace(config, tuple(events)), reference_engine, VllmEngine, "vllm-v1", DiffOptions(True)
    )
    assert result.passed, result.divergence or result.violation or result.error


def test_the_corner_is_named() -> None:
    assert "abort-in-flight" in CORNER_NAMES


def test_a_step_with_aborts_round_trips_through_a_trace_file(tmp_path: Path) -> None:
    events = (ADD_A, Step(aborts=("A", "x")), Step(), Abort(("A",)))
    trace = Trace(make_config(), events)
    path = tmp_path / "t.json"
    trace.save(path)
    loaded = Trace.load(path)
    assert loaded.events == events
    document = trace.to_json()
    assert document["version"] == VERSION
    assert "aborts" not in document["events"][2]  # written only where there are some


def test_a_trace_before_version_5_has_no_aborts_in_a_step() -> None:
    document = Trace(make_config(), (Step(aborts=("A",)),)).to_json()
    as_version(document, 4)
    with pytest.raises(TraceError, match=r"events\[0\]\.aborts: not a field of version 4"):
        trace_from_json(document)
    as_version(document, 5)
    document["events"][0]["aborts"] = ["A", 3]
    with pytest.raises(TraceError, match=r"events\[0\]\.aborts: must be a list of strings"):
        trace_from_json(document)


def test_a_report_and_the_minimizer_show_and_keep_them() -> None:
    step = Step(aborts=("A",))
    assert format_event(step) == "step aborts in flight: 'A'"
    simpler = _simpler([ADD_A, step], 1)
    assert [ADD_A] in simpler and [ADD_A, Step()] in simpler
