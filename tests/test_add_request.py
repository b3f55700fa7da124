"""add_request refuses at the door every request that could not run to completion."""

from __future__ import annotations

from typing import Any

import pytest

from schedspec.spec import Request, RequestError, RequestStatus
from tests.sched_helpers import add, make_scheduler, step


def test_arrival_order_and_waiting_status() -> None:
    scheduler = make_scheduler()
    a = add(scheduler, "a", 3)
    b = add(scheduler, "b", 3)
    assert (a.arrival, b.arrival) == (0, 1)
    assert [r.request_id for r in scheduler.waiting] == ["a", "b"]
    assert a.status is RequestStatus.WAITING
    assert scheduler.get_num_unfinished_requests() == 2
    assert scheduler.has_unfinished_requests()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"prompt_token_ids": []}, "prompt_token_ids"),
        ({"max_tokens": 0}, "max_tokens"),
        # max_model_len is 256: a 256-token prompt leaves no room for output.
        ({"prompt_token_ids": [1] * 256}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, -1]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, 2**63]}, "prompt_token_ids"),
        ({"request_id": ""}, "request_id"),
        ({"eos_token_id": -5}, "eos_token_id"),
        ({"stop_token_ids": [3, "x"]}, "stop_token_ids"),
        ({"priority": 1.5}, "priority"),
    ],
)
def test_bad_requests_are_refused_and_nothing_is_queued(args: dict[str, Any], field: str) -> None:
    scheduler = make_scheduler()
    fields: dict[str, Any] = {"request_id": "r", "prompt_token_ids": [1, 2, 3], "max_tokens": 4}
    fields.update(args)
    with pytest.raises(RequestError) as info:
        scheduler.add_request(Request(**fields))
    assert info.value.field == field
    assert not scheduler.has_unfinished_requests()
    assert len(scheduler.waiting) == 0


def test_prompt_of_max_model_len_minus_one_is_accepted() -> None:
    scheduler = make_scheduler()
    add(scheduler, "r", 255)
    assert scheduler.get_num_unfinished_requests() == 1


def test_duplicate_id_is_refused_while_live_and_allowed_after_finish() -> None:
    scheduler = make_scheduler()
    add(scheduler, "r", 3, max_tokens=1)
    with pytest.raises(RequestError, match="duplicate"):
        add(scheduler, "r", 5)
    assert scheduler.get_num_unfinished_requests() == 1
    step(scheduler)  # 3-token prompt, one output token: length-capped
    assert not scheduler.has_unfinished_requests()
    add(scheduler, "r", 5)
    assert scheduler.get_num_unfinished_requests() == 1


def test_a_used_request_object_cannot_be_added_again() -> None:
    scheduler = make_scheduler()
    request = add(scheduler, "r", 3, max_tokens=1)
    step(scheduler)
    other = make_scheduler()
    with pytest.raises(RequestError) as info:
        other.add_request(request)
    assert info.value.field == "status"


def test_snapshot_of_a_reused_id_shows_the_new_request() -> None:
    scheduler = make_scheduler()
    add(scheduler, "r", 3, max_tokens=1)
    assert scheduler.snapshot().requests["r"].prompt_token_ids == (1000, 1001, 1002)
    step(scheduler)
    add(scheduler, "r", 3, first_token=2000)
    assert scheduler.snapshot().requests["r"].prompt_token_ids == (2000, 2001, 2002)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("arrival", 0),
        ("num_computed_tokens", 2),
        ("spec_token_ids", [5, 5, 5, 5, 5]),
        ("num_preemptions", 1),
        ("num_in_flight_tokens", 3),
        ("num_output_placeholders", 1),
        ("num_stale_output_tokens", 1),
        ("is_prefill_chunk", True),
        ("stop_reason", 4),
        ("drop_stale_output", True),
        ("all_token_ids", [1, 2, 3, 9]),
    ],
)
def test_a_request_with_progress_already_set_is_refused_naming_the_field(
    field: str, value: object
) -> None:
    """Five drafts preset on a request whose config allows two would otherwise be
    verified at its first step; each progress field is refused by name."""
    scheduler = make_scheduler(num_speculative_tokens=2)
    request = Request("r", [1, 2, 3], 4)
    setattr(request, field, value)
    with pytest.raises(RequestError) as info:
        scheduler.add_request(request)
    assert info.value.field == field
    assert "was it added to a scheduler before?" in str(info.value)
    assert not scheduler.has_unfinished_requests()


def test_one_request_object_cannot_join_a_second_scheduler() -> None:
    """Added to one scheduler, a Request is that scheduler's: the second refuses it (its
    arrival is set) before the first one's schedule() could change it under the second."""
    first, second = make_scheduler(), make_scheduler()
    request = add(first, "r", 3)
    with pytest.raises(RequestError) as info:
        second.add_request(request)
    assert info.value.field == "arrival"
    assert not second.has_unfinished_requests()
    step(first)
    assert first.snapshot().requests["r"].num_computed_tokens == 3
