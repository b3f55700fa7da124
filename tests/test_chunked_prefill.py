"""Chunked prefill and the long-prefill cap (behaviour 3)."""

from __future__ import annotations

from tests.sched_helpers import add, make_scheduler, step


def _chunks_of(scheduler_kwargs: dict[str, int], prompt: int, with_neighbour: bool) -> list[int]:
    scheduler = make_scheduler(max_model_len=4096, num_blocks=1100, **scheduler_kwargs)
    add(scheduler, "long", prompt, max_tokens=1)
    if with_neighbour:
        add(scheduler, "n", 4, max_tokens=1000)
    chunks: list[int] = []
    while "long" in scheduler.requests:
        chunks.append(step(scheduler).num_scheduled_tokens["long"])
    return chunks


def test_long_prefill_cap_splits_a_prompt_when_another_request_is_present() -> None:
    # The example: 2050 tokens with threshold 512 next to another request.
    chunks = _chunks_of(
        {"max_num_batched_tokens": 4096, "long_prefill_token_threshold": 512}, 2050, True
    )
    assert chunks == [512, 512, 512, 512, 2]


def test_long_prefill_cap_does_not_apply_to_a_lone_request() -> None:
    chunks = _chunks_of(
        {"max_num_batched_tokens": 4096, "long_prefill_token_threshold": 512}, 2050, False
    )
    assert chunks == [2050]


def test_budget_chunks_a_prompt_without_a_cap() -> None:
    chunks = _chunks_of({"max_num_batched_tokens": 1000}, 2050, False)
    assert chunks == [1000, 1000, 50]


def test_cap_counts_waiting_requests_too() -> None:
    # Two waiting requests and nothing running: both are capped.
    scheduler = make_scheduler(long_prefill_token_threshold=10, max_num_batched_tokens=100)
    add(scheduler, "a", 30)
    add(scheduler, "b", 30)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"a": 10, "b": 10}


def test_prefill_chunks_emit_nothing_and_the_last_chunk_samples() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=4)
    request = add(scheduler, "r", 20)
    assert step(scheduler).num_scheduled_tokens["r"] == 8
    assert request.is_prefill_chunk and request.output_token_ids == []
    assert step(scheduler).num_scheduled_tokens["r"] == 8
    assert request.output_token_ids == []
    assert step(scheduler).num_scheduled_tokens["r"] == 4
    assert not request.is_prefill_chunk
    assert request.output_token_ids == [7]
    assert request.num_computed_tokens == 20 == request.num_tokens - 1


def test_without_chunked_prefill_a_prompt_over_the_budget_left_blocks_the_queue() -> None:
    # Budget 16: x (10) fits; y (10) does not fit the 6 left, and z (2)
    # behind it is not tried either: strict head-of-line.
    scheduler = make_scheduler(
        enable_chunked_prefill=False, max_num_batched_tokens=16, max_model_len=16
    )
    for rid, size in (("x", 10), ("y", 10), ("z", 2)):
        add(scheduler, rid, size)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"x": 10}


def test_with_chunked_prefill_the_same_queue_is_chunked() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16, max_model_len=16)
    for rid, size in (("x", 10), ("y", 10), ("z", 2)):
        add(scheduler, rid, size)
    assert dict(scheduler.schedule().num_scheduled_tokens) == {"x": 10, "y": 6}


def test_without_chunked_prefill_the_blocked_prompt_runs_whole_next_step() -> None:
    scheduler = make_scheduler(
        enable_chunked_prefill=False, max_num_batched_tokens=16, max_model_len=16
    )
    add(scheduler, "x", 10, max_tokens=1)
    add(scheduler, "y", 10, max_tokens=1)
    step(scheduler)
    assert dict(step(scheduler).num_scheduled_tokens) == {"y": 10}


# The release knob: vLLM 0.34.0 ignores the cap with chunked prefill off (the default,
# long_prefill_needs_chunked_prefill=True); 0.33.0 capped either way.


def _first_step_with_chunking_off(needs_chunked_prefill: bool) -> dict[str, int]:
    scheduler = make_scheduler(
        enable_chunked_prefill=False,
        long_prefill_token_threshold=4,
        long_prefill_needs_chunked_prefill=needs_chunked_prefill,
        max_num_batched_tokens=256,
    )
    add(scheduler, "a", 10)
    add(scheduler, "b", 10)
    return dict(scheduler.schedule().num_scheduled_tokens)


def test_chunked_prefill_off_ignores_the_cap_under_the_034_rule() -> None:
    assert _first_step_with_chunking_off(needs_chunked_prefill=True) == {"a": 10, "b": 10}


def test_chunked_prefill_off_still_caps_under_the_033_rule() -> None:
    # 0.33.0 applied the cap before its chunking-off check: prompts ran in capped chunks.
    assert _first_step_with_chunking_off(needs_chunked_prefill=False) == {"a": 4, "b": 4}


def test_with_chunked_prefill_on_both_rules_cap() -> None:
    for rule in (True, False):
        scheduler = make_scheduler(
            long_prefill_token_threshold=4, long_prefill_needs_chunked_prefill=rule
        )
        add(scheduler, "a", 10)
        add(scheduler, "b", 10)
        assert dict(scheduler.schedule().num_scheduled_tokens) == {"a": 4, "b": 4}
