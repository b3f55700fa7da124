"""Continuous batching and the per-step token budget (behaviours 1, 2 and 4)."""

from __future__ import annotations

from schedspec.spec import RequestStatus
from tests.sched_helpers import add, emit, free_blocks, make_scheduler, step


def test_seed_example_running_first_then_waiting_share_one_budget() -> None:
    # Budget 512. Step 1 admits B and C (5 tokens each) and the first 502
    # tokens of A's 902-token prompt. Step 2: A has 400 prompt tokens left,
    # B and C decode, D waits with 300: A 400, B 1, C 1, D gets the last 110.
    scheduler = make_scheduler(max_num_batched_tokens=512, max_model_len=1024, num_blocks=512)
    add(scheduler, "B", 5)
    add(scheduler, "C", 5)
    add(scheduler, "A", 902)
    first = step(scheduler)
    assert dict(first.num_scheduled_tokens) == {"B": 5, "C": 5, "A": 502}
    add(scheduler, "D", 300)
    second = scheduler.schedule()
    assert dict(second.num_scheduled_tokens) == {"B": 1, "C": 1, "A": 400, "D": 110}
    assert second.total_num_scheduled_tokens == 512
    # Running order is admission order; D is a new request, the rest cached.
    assert [r.request_id for r in scheduler.running] == ["B", "C", "A", "D"]
    assert [d.request_id for d in second.scheduled_new_reqs] == ["D"]
    assert [d.request_id for d in second.scheduled_cached_reqs] == ["B", "C", "A"]
    assert scheduler.requests["D"].is_prefill_chunk
    assert not scheduler.requests["A"].is_prefill_chunk


def test_waiting_requests_fill_the_budget_in_queue_order() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=20)
    for rid in "xyz":
        add(scheduler, rid, 8)
    output = scheduler.schedule()
    # x takes 8, y takes 8, z gets the 4 left as a first chunk.
    assert dict(output.num_scheduled_tokens) == {"x": 8, "y": 8, "z": 4}
    assert scheduler.requests["z"].num_computed_tokens == 4


def test_budget_never_exceeded_and_every_entry_positive_over_a_run() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=37, max_model_len=200, num_blocks=200)
    for i in range(12):
        add(scheduler, f"r{i}", 10 + 13 * i, max_tokens=5 + i)
    while scheduler.has_unfinished_requests():
        output = step(scheduler)
        assert output.total_num_scheduled_tokens <= 37
        assert output.total_num_scheduled_tokens == sum(output.num_scheduled_tokens.values())
        assert all(n > 0 for n in output.num_scheduled_tokens.values())
    assert free_blocks(scheduler) == 200


def test_continuous_batching_joins_and_leaves_every_iteration() -> None:
    scheduler = make_scheduler()
    a = add(scheduler, "a", 4, max_tokens=2)
    step(scheduler)  # a prefills and emits its first token
    add(scheduler, "b", 4, max_tokens=3)
    out = step(scheduler)  # a decodes its second (last) token; b joins in the same step
    assert dict(out.num_scheduled_tokens) == {"a": 1, "b": 4}
    assert a.status is RequestStatus.FINISHED_LENGTH_CAPPED
    # a left at once: blocks back, out of running, reported by the next schedule().
    assert [r.request_id for r in scheduler.running] == ["b"]
    assert "a" not in scheduler.requests
    held_by_b = len(scheduler.kv_cache_manager.get_block_ids("b"))
    assert free_blocks(scheduler) == 64 - held_by_b
    nxt = scheduler.schedule()
    assert nxt.finished_req_ids == frozenset({"a"})
    assert dict(nxt.num_scheduled_tokens) == {"b": 1}
    emit(scheduler, nxt)
    assert scheduler.schedule().finished_req_ids == frozenset()


def test_mixed_batch_prefill_chunk_decode_and_spec_in_one_step() -> None:
    scheduler = make_scheduler(num_speculative_tokens=2, max_num_batched_tokens=16)
    add(scheduler, "d", 3)
    add(scheduler, "s", 3)
    step(scheduler)  # both prefill (6 tokens) and emit one token
    scheduler.update_draft_token_ids({"s": [11, 12]})
    add(scheduler, "p", 40)
    output = scheduler.schedule()
    # d decodes 1, s verifies 1 + 2 drafts, p takes the 12 tokens left as a chunk.
    assert dict(output.num_scheduled_tokens) == {"d": 1, "s": 3, "p": 12}
    assert dict(output.scheduled_spec_decode_tokens) == {"s": (11, 12)}
    assert scheduler.requests["p"].is_prefill_chunk
