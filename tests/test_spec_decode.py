"""Speculative decoding: drafts in the budget, lookahead slots, rollback (behaviour 9)."""

from __future__ import annotations

import pytest

from schedspec.reference import Scheduler
from schedspec.spec import OutputError
from tests.sched_helpers import add, emit, make_scheduler, step


def _decoding(**overrides: int) -> Scheduler:
    """One request 'a' with a 5-token prompt, prefilled: 6 tokens, 5 computed."""
    fields = {"num_speculative_tokens": 3}
    fields.update(overrides)
    scheduler = make_scheduler(**fields)
    add(scheduler, "a", 5)
    step(scheduler, {"a": [50]})
    return scheduler


def test_drafts_are_verified_with_lookahead_slots_and_rejections_roll_back() -> None:
    scheduler = _decoding()
    a = scheduler.requests["a"]
    scheduler.update_draft_token_ids({"a": [51, 52, 53]})
    assert a.num_tokens_with_spec == 9
    out = scheduler.schedule()
    # 1 real token + 3 drafts; the optimistic count reaches 9.
    assert out.num_scheduled_tokens["a"] == 4
    assert dict(out.scheduled_spec_decode_tokens) == {"a": (51, 52, 53)}
    assert a.num_computed_tokens == 9
    assert a.spec_token_ids == []  # consumed; fresh ones come with the next proposal
    # Slots: 5 computed + 4 new + 3 lookahead = 12 -> 3 blocks of 4.
    assert len(scheduler.kv_cache_manager.get_block_ids("a")) == 3
    # The model accepts one draft (51) and emits its own token (60) after it:
    # 2 rejected -> 9 - 2 = 7 computed, and 8 tokens known (computed = tokens - 1).
    emit(scheduler, out, {"a": [51, 60]})
    assert a.output_token_ids == [50, 51, 60]
    assert a.num_computed_tokens == 7 == a.num_tokens - 1


def test_all_drafts_rejected_rolls_back_every_one() -> None:
    scheduler = _decoding()
    a = scheduler.requests["a"]
    scheduler.update_draft_token_ids({"a": [51, 52, 53]})
    emit(scheduler, scheduler.schedule(), {"a": [99]})
    assert a.num_computed_tokens == 6 == a.num_tokens - 1


def test_all_drafts_accepted_emits_one_plus_k() -> None:
    scheduler = _decoding()
    a = scheduler.requests["a"]
    scheduler.update_draft_token_ids({"a": [51, 52, 53]})
    emit(scheduler, scheduler.schedule(), {"a": [51, 52, 53, 54]})
    assert a.num_tokens == 10 and a.num_computed_tokens == 9


def test_short_budget_drops_trailing_drafts() -> None:
    # Budget 3: the decode token plus the first two drafts; the third waits.
    scheduler = make_scheduler(num_speculative_tokens=3, max_num_batched_tokens=3, max_num_seqs=1)
    add(scheduler, "a", 3)
    step(scheduler, {"a": [50]})
    scheduler.update_draft_token_ids({"a": [51, 52, 53]})
    out = scheduler.schedule()
    assert out.num_scheduled_tokens["a"] == 3
    assert dict(out.scheduled_spec_decode_tokens) == {"a": (51, 52)}


def test_max_model_len_drops_trailing_drafts() -> None:
    # 6 tokens known, max_model_len 9: positions up to 8, and the step must
    # leave room for its sampled token -> 9 - 1 - 5 = 3 tokens: 1 + 2 drafts.
    scheduler = _decoding(max_model_len=9, num_blocks=8)
    scheduler.update_draft_token_ids({"a": [51, 52, 53]})
    out = scheduler.schedule()
    assert out.num_scheduled_tokens["a"] == 3
    assert dict(out.scheduled_spec_decode_tokens) == {"a": (51, 52)}


def test_drafts_for_a_prefill_chunk_are_dropped() -> None:
    scheduler = make_scheduler(num_speculative_tokens=2, max_num_batched_tokens=16)
    add(scheduler, "p", 40)
    emit(scheduler, scheduler.schedule())
    scheduler.update_draft_token_ids({"p": [1, 2]})
    assert scheduler.requests["p"].spec_token_ids == []
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {}
    assert out.num_scheduled_tokens["p"] == 16


def test_drafts_for_unknown_or_waiting_requests_are_ignored() -> None:
    scheduler = make_scheduler(num_speculative_tokens=2)
    add(scheduler, "w", 4)
    scheduler.update_draft_token_ids({"ghost": [1], "w": [1, 2]})
    assert scheduler.requests["w"].spec_token_ids == []


def test_too_many_drafts_are_refused_and_nothing_changes() -> None:
    scheduler = _decoding(num_speculative_tokens=2)
    with pytest.raises(OutputError) as info:
        scheduler.update_draft_token_ids({"a": [1, 2, 3]})
    assert info.value.field == "draft_token_ids"
    assert "num_speculative_tokens (2)" in str(info.value)
    assert scheduler.requests["a"].spec_token_ids == []


def test_drafts_without_speculative_decoding_are_refused() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a", 4)
    step(scheduler)
    with pytest.raises(OutputError):
        scheduler.update_draft_token_ids({"a": [1]})


def test_emitting_more_than_one_plus_drafts_is_refused_before_any_change() -> None:
    scheduler = _decoding()
    a = scheduler.requests["a"]
    scheduler.update_draft_token_ids({"a": [51]})
    out = scheduler.schedule()
    before = scheduler.snapshot()
    with pytest.raises(OutputError, match="between 1 and 2"):
        emit(scheduler, out, {"a": [51, 52, 53]})
    assert scheduler.snapshot() == before
    assert a.num_computed_tokens == 7
