"""Preemption by recomputation (behaviour 8)."""

from __future__ import annotations

from schedspec.reference import Scheduler
from schedspec.spec import RequestStatus
from tests.sched_helpers import add, emit, free_blocks, make_scheduler, step


def _two_requests_filling_the_cache() -> Scheduler:
    # 5 blocks of 4 tokens. a: 10-token prompt -> 3 blocks (slots to 12).
    # b: 8-token prompt -> 2 blocks, full. After one step both decode and
    # every block is taken.
    scheduler = make_scheduler(num_blocks=5, max_model_len=20)
    add(scheduler, "a", 10)
    add(scheduler, "b", 8)
    step(scheduler)
    assert free_blocks(scheduler) == 0
    return scheduler


def test_fcfs_request_preempts_itself_when_it_is_the_newest() -> None:
    scheduler = _two_requests_filling_the_cache()
    b = scheduler.requests["b"]
    out = scheduler.schedule()
    # a (11 tokens) still fits its 3 blocks; b (9 tokens) needs a 3rd block,
    # none is free, and the victim running[-1] is b itself.
    assert dict(out.num_scheduled_tokens) == {"a": 1}
    assert out.preempted_req_ids == frozenset({"b"})
    assert b.status is RequestStatus.PREEMPTED
    assert b.num_computed_tokens == 0
    assert b.num_preemptions == 1
    assert b.spec_token_ids == []
    assert scheduler.kv_cache_manager.get_block_ids("b") == ()
    assert [r.request_id for r in scheduler.running] == ["a"]
    assert [r.request_id for r in scheduler.waiting] == ["b"]
    assert free_blocks(scheduler) == 2
    # b keeps its prompt and its output token.
    assert b.num_tokens == 9 and b.output_token_ids == [7]


def test_fcfs_preempts_running_last_for_an_earlier_request() -> None:
    # a: 11-token prompt (3 blocks, 12 slots); b: 9 tokens (3 blocks) -> 6 of 6.
    scheduler = make_scheduler(num_blocks=6, max_model_len=24)
    add(scheduler, "a", 11)
    add(scheduler, "b", 9)
    step(scheduler)
    step(scheduler)  # a reaches 13 tokens, computed 12; b 11 tokens
    out = scheduler.schedule()
    # a needs slot 13 -> a 4th block; b (running[-1]) is preempted for it.
    assert dict(out.num_scheduled_tokens) == {"a": 1}
    assert out.preempted_req_ids == frozenset({"b"})
    assert len(scheduler.kv_cache_manager.get_block_ids("a")) == 4


def test_nothing_is_admitted_in_a_step_that_preempted_and_the_victim_goes_first() -> None:
    scheduler = _two_requests_filling_the_cache()
    add(scheduler, "c", 1)  # would fit the 2 blocks b frees
    out = scheduler.schedule()
    assert out.preempted_req_ids == frozenset({"b"})
    assert "c" not in out.num_scheduled_tokens
    # The victim goes to the front of the queue, ahead of c.
    assert [r.request_id for r in scheduler.waiting] == ["b", "c"]


def test_resumed_request_recomputes_its_outputs_and_keeps_them() -> None:
    scheduler = _two_requests_filling_the_cache()
    emit(scheduler, scheduler.schedule())  # b preempted; a -> 12 tokens
    a = scheduler.requests["a"]
    scheduler.finish_requests("a")  # frees a's 3 blocks
    assert a.status is RequestStatus.FINISHED_ABORTED
    out = scheduler.schedule()
    (resumed,) = out.scheduled_cached_reqs
    assert resumed.request_id == "b" and resumed.resumed
    assert resumed.num_computed_tokens == 0
    assert resumed.num_output_tokens == 1
    # Recompute prompt + the output token it already had: 9 tokens, 3 blocks.
    assert out.num_scheduled_tokens["b"] == 9
    assert len(resumed.new_block_ids) == 3
    assert scheduler.requests["b"].status is RequestStatus.RUNNING


def test_resumed_request_hits_its_own_surviving_cached_blocks() -> None:
    # Prefix caching on: b's full blocks stay cached after preemption, so on
    # resume it recomputes only past its hit.
    scheduler = make_scheduler(num_blocks=5, max_model_len=20, enable_prefix_caching=True)
    add(scheduler, "a", 10)
    add(scheduler, "b", 8, first_token=2000)
    step(scheduler)
    out = scheduler.schedule()
    assert out.preempted_req_ids == frozenset({"b"})
    emit(scheduler, out)
    scheduler.finish_requests("a")
    out = scheduler.schedule()
    (resumed,) = out.scheduled_cached_reqs
    # b has 9 tokens; its two full blocks (8 tokens) were cached and survive.
    assert resumed.num_computed_tokens == 8
    assert out.num_scheduled_tokens["b"] == 1


def test_priority_preempts_the_least_urgent_and_refunds_its_budget() -> None:
    # a (priority 1) is admitted first, then b (priority 0): running [a, b].
    scheduler = make_scheduler(num_blocks=5, max_model_len=20, policy="priority")
    add(scheduler, "a", 10, priority=1)
    step(scheduler)
    add(scheduler, "b", 8, priority=0)
    step(scheduler)  # a decodes, b prefills; all 5 blocks taken
    assert [r.request_id for r in scheduler.running] == ["a", "b"]
    out = scheduler.schedule()
    # a is scheduled first (its 3 blocks suffice), then b needs a block: the
    # victim is the largest (priority, arrival) = a, already scheduled. a's
    # token goes back to the budget and b (index 1 -> 0) proceeds.
    assert dict(out.num_scheduled_tokens) == {"b": 1}
    assert out.total_num_scheduled_tokens == 1
    assert out.preempted_req_ids == frozenset({"a"})
    assert [d.request_id for d in out.scheduled_cached_reqs] == ["b"]
    assert [r.request_id for r in scheduler.running] == ["b"]
    assert scheduler.requests["a"].num_computed_tokens == 0


def test_priority_victim_goes_back_to_its_priority_place() -> None:
    scheduler = make_scheduler(num_blocks=5, max_model_len=20, policy="priority")
    add(scheduler, "a", 10, priority=1)
    step(scheduler)
    add(scheduler, "b", 8, priority=0)
    step(scheduler)
    add(scheduler, "urgent", 1, priority=0)
    scheduler.schedule()
    # a (priority 1) is queued behind the more urgent waiting request.
    assert [r.request_id for r in scheduler.waiting] == ["urgent", "a"]


def test_preemption_under_pressure_always_drains() -> None:
    # A cache of exactly one max_model_len request and eight long decoders:
    # many preemptions, every request finishes, every block comes back.
    scheduler = make_scheduler(num_blocks=8, max_model_len=32, max_num_batched_tokens=64)
    for i in range(8):
        add(scheduler, f"r{i}", 5 + i, max_tokens=20)
    preemptions = 0
    for _ in range(500):
        if not scheduler.has_unfinished_requests():
            break
        preemptions += len(step(scheduler).preempted_req_ids)
    assert not scheduler.has_unfinished_requests()
    assert preemptions > 0
    assert free_blocks(scheduler) == 8
