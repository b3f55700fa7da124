"""Stops (EOS, stop tokens, max_tokens, max_model_len) and aborts (behaviour 10)."""

from __future__ import annotations

import pytest

from schedspec.spec import ModelRunnerOutput, OutputError, RequestError, RequestStatus
from tests.sched_helpers import add, emit, free_blocks, make_scheduler, step


def test_eos_stops_and_drops_the_tokens_after_it() -> None:
    scheduler = make_scheduler(num_speculative_tokens=3)
    a = add(scheduler, "a", 5, eos_token_id=2)
    step(scheduler, {"a": [50]})
    scheduler.update_draft_token_ids({"a": [51, 2, 53]})
    out = scheduler.schedule()
    # Two drafts accepted; EOS is the second emitted token: 60 (dropped) goes.
    emit(scheduler, out, {"a": [51, 2, 60]})
    assert a.status is RequestStatus.FINISHED_STOPPED
    assert a.output_token_ids == [50, 51, 2]
    assert a.stop_reason is None
    assert a.num_computed_tokens == a.num_tokens - 1
    assert "a" not in scheduler.requests and scheduler.running == []
    assert free_blocks(scheduler) == 64


def test_stop_token_stops_and_is_recorded() -> None:
    scheduler = make_scheduler()
    a = add(scheduler, "a", 5, stop_token_ids=[9, 8])
    step(scheduler, {"a": [50]})
    step(scheduler, {"a": [8]})
    assert a.status is RequestStatus.FINISHED_STOPPED
    assert a.stop_reason == 8


def test_max_tokens_caps_the_length_and_trims_extra_tokens() -> None:
    scheduler = make_scheduler(num_speculative_tokens=3)
    a = add(scheduler, "a", 5, max_tokens=3)
    step(scheduler, {"a": [50]})
    scheduler.update_draft_token_ids({"a": [51, 52, 53]})
    emit(scheduler, scheduler.schedule(), {"a": [51, 52, 53, 54]})
    assert a.status is RequestStatus.FINISHED_LENGTH_CAPPED
    assert a.output_token_ids == [50, 51, 52]
    assert a.num_computed_tokens == 7 == a.num_tokens - 1


def test_eos_on_the_last_allowed_token_is_a_stop_not_a_length_cap() -> None:
    scheduler = make_scheduler()
    a = add(scheduler, "a", 5, max_tokens=1, eos_token_id=50)
    step(scheduler, {"a": [50]})
    assert a.status is RequestStatus.FINISHED_STOPPED


def test_max_model_len_caps_the_length() -> None:
    scheduler = make_scheduler(max_model_len=8, num_blocks=2)
    a = add(scheduler, "a", 6, max_tokens=100)
    step(scheduler)
    assert scheduler.requests["a"].status is RequestStatus.RUNNING
    step(scheduler)
    assert a.num_tokens == 8
    assert a.status is RequestStatus.FINISHED_LENGTH_CAPPED


def test_abort_waiting_and_running_frees_everything_and_reports_once() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    add(scheduler, "run", 9)
    add(scheduler, "wait", 4)
    step(scheduler)
    assert free_blocks(scheduler) == 61
    scheduler.finish_requests(["run", "wait", "unknown", "run"])
    assert not scheduler.has_unfinished_requests()
    assert scheduler.running == [] and len(scheduler.waiting) == 0
    assert free_blocks(scheduler) == 64
    out = scheduler.schedule()
    assert out.finished_req_ids == frozenset({"run", "wait"})
    assert out.num_scheduled_tokens == {}
    assert scheduler.schedule().finished_req_ids == frozenset()


def test_abort_of_a_finished_request_is_ignored() -> None:
    scheduler = make_scheduler()
    a = add(scheduler, "a", 3, max_tokens=1)
    step(scheduler)
    scheduler.finish_requests("a")
    assert a.status is RequestStatus.FINISHED_LENGTH_CAPPED


def test_abort_between_schedule_and_update_drops_that_output() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a", 3)
    add(scheduler, "b", 3)
    out = scheduler.schedule()
    scheduler.finish_requests("a")
    scheduler.update_from_output(out, ModelRunnerOutput({"a": [1], "b": [5]}))
    assert scheduler.requests["b"].output_token_ids == [5]
    assert "a" not in scheduler.requests  # its token went nowhere


def test_an_output_applied_twice_is_refused_and_changes_nothing() -> None:
    scheduler = make_scheduler()
    add(scheduler, "b", 3)
    out = scheduler.schedule()
    emit(scheduler, out, {"b": [5]})
    before = scheduler.snapshot()
    with pytest.raises(OutputError) as info:
        scheduler.update_from_output(out, ModelRunnerOutput({"b": [6]}))
    assert info.value.field == "scheduler_output"
    assert scheduler.snapshot() == before


def test_outputs_apply_in_the_order_they_were_scheduled() -> None:
    scheduler = make_scheduler(async_scheduling=True)
    add(scheduler, "b", 3)
    first, second = scheduler.schedule(), scheduler.schedule()
    before = scheduler.snapshot()
    with pytest.raises(OutputError, match="in the order scheduled"):
        scheduler.update_from_output(second, ModelRunnerOutput({"b": [6]}))
    assert scheduler.snapshot() == before
    scheduler.update_from_output(first, ModelRunnerOutput({"b": [5]}))


def test_output_of_an_aborted_request_never_reaches_a_new_one_with_its_id() -> None:
    """Async: 'a' is aborted while its step is in flight and a new request reuses the
    id before the step lands: the output was computed for the old one and is dropped."""
    scheduler = make_scheduler(async_scheduling=True)
    add(scheduler, "a", 3)
    out = scheduler.schedule()
    scheduler.finish_requests("a")
    new = add(scheduler, "a", 5, first_token=2000)
    scheduler.update_from_output(out, ModelRunnerOutput({"a": [1]}))
    assert new.output_token_ids == [] and new.num_in_flight_tokens == 0


def test_abort_ids_must_be_strings() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a", 3)
    with pytest.raises(RequestError):
        scheduler.finish_requests([1])  # type: ignore[list-item]
    assert scheduler.has_unfinished_requests()


def test_model_output_for_an_unscheduled_request_is_refused() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a", 3)
    out = scheduler.schedule()
    with pytest.raises(OutputError, match="not scheduled"):
        scheduler.update_from_output(out, ModelRunnerOutput({"a": [1], "zz": [2]}))
    assert scheduler.requests["a"].output_token_ids == []


def test_prefill_chunk_must_emit_nothing_and_a_finished_prefill_must_emit() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16)
    add(scheduler, "a", 20)
    out = scheduler.schedule()
    with pytest.raises(OutputError, match="prefill chunk"):
        scheduler.update_from_output(out, ModelRunnerOutput({"a": [1]}))
    emit(scheduler, out)
    out = scheduler.schedule()
    with pytest.raises(OutputError, match="between 1 and 1"):
        scheduler.update_from_output(out, ModelRunnerOutput({}))
    with pytest.raises(OutputError, match=r"token ids must be ints"):
        scheduler.update_from_output(out, ModelRunnerOutput({"a": [-3]}))
