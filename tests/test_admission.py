"""Admission control: whole-prompt fit, watermark, max_num_seqs, prefix hits (behaviour 7)."""

from __future__ import annotations

from schedspec.spec import RequestStatus
from tests.sched_helpers import add, free_blocks, make_scheduler, step


def test_watermark_is_kept_spare_while_something_runs() -> None:
    # 10 blocks of 4 tokens, watermark 0.3 -> 3 spare blocks. a holds 3
    # blocks (12 slots), 7 are free. b (20 tokens, 5 blocks) needs 5 + 3 = 8 > 7.
    scheduler = make_scheduler(num_blocks=10, max_model_len=40, watermark=0.3)
    add(scheduler, "a", 12)
    step(scheduler)
    assert free_blocks(scheduler) == 7
    add(scheduler, "b", 20)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"a": 1}
    assert scheduler.requests["b"].status is RequestStatus.WAITING


def test_same_admission_without_watermark_goes_through() -> None:
    scheduler = make_scheduler(num_blocks=10, max_model_len=40)
    add(scheduler, "a", 12)
    step(scheduler)
    add(scheduler, "b", 20)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"a": 1, "b": 20}


def test_watermark_does_not_apply_to_the_first_admission_into_an_idle_cache() -> None:
    # 36 tokens need 9 of 10 blocks: 9 + 3 > 10, but nothing runs yet.
    scheduler = make_scheduler(num_blocks=10, max_model_len=40, watermark=0.3)
    add(scheduler, "a", 36)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"a": 36}


def test_watermark_counts_requests_admitted_earlier_in_the_same_step() -> None:
    # a (8 tokens, 2 blocks) is admitted into the idle cache; then b (16 tokens,
    # 4 blocks) needs 4 + 3 spare = 7 of the 8 left: fits. c (8 tokens) needs
    # 2 + 3 = 5 of the 4 left: refused, and it blocks the queue.
    scheduler = make_scheduler(num_blocks=10, max_model_len=40, watermark=0.3)
    add(scheduler, "a", 8)
    add(scheduler, "b", 16)
    add(scheduler, "c", 8)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"a": 8, "b": 16}


def test_admission_needs_the_whole_prompt_to_fit_not_just_the_first_chunk() -> None:
    # After a's decode takes a 7th block, 3 are free. b's first chunk (7
    # tokens of the budget left, 2 blocks) would fit, but its whole prompt
    # needs 6 blocks: not admitted (no admit-then-preempt thrash).
    scheduler = make_scheduler(
        num_blocks=10, max_model_len=40, max_num_batched_tokens=8, max_num_seqs=4
    )
    add(scheduler, "a", 24)  # 6 blocks once fully prefilled; takes 2 per step
    for _ in range(3):
        step(scheduler)
    assert free_blocks(scheduler) == 4
    add(scheduler, "b", 24)
    out = scheduler.schedule()
    assert "b" not in out.num_scheduled_tokens
    assert scheduler.requests["b"].status is RequestStatus.WAITING


def test_max_num_seqs_caps_the_running_list() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        add(scheduler, rid, 4)
    out = scheduler.schedule()
    assert dict(out.num_scheduled_tokens) == {"a": 4, "b": 4}
    assert [r.request_id for r in scheduler.waiting] == ["c"]


def test_admitted_request_starts_at_its_prefix_hit() -> None:
    scheduler = make_scheduler(enable_prefix_caching=True)
    add(scheduler, "a", 10, max_tokens=1)  # blocks [0..3], [4..7] full -> cached
    step(scheduler)
    add(scheduler, "b", 10)  # same prompt
    out = scheduler.schedule()
    (new,) = out.scheduled_new_reqs
    assert new.num_computed_tokens == 8  # two full blocks hit
    assert out.num_scheduled_tokens["b"] == 2
    assert scheduler.requests["b"].num_computed_tokens == 10


def test_priority_policy_admits_in_priority_then_arrival_order() -> None:
    scheduler = make_scheduler(policy="priority", max_num_seqs=2)
    add(scheduler, "late-urgent", 4, priority=0)
    add(scheduler, "low", 4, priority=5)
    add(scheduler, "urgent", 4, priority=0)
    assert [r.request_id for r in scheduler.waiting] == ["late-urgent", "urgent", "low"]
    out = scheduler.schedule()
    assert list(out.num_scheduled_tokens) == ["late-urgent", "urgent"]


def test_waiting_high_priority_request_does_not_preempt_running_ones() -> None:
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    add(scheduler, "low", 4, priority=9)
    step(scheduler)
    add(scheduler, "high", 4, priority=0)
    out = scheduler.schedule()
    assert dict(out.num_scheduled_tokens) == {"low": 1}
    assert out.preempted_req_ids == frozenset()
