"""SchedulerOutput -> runner state -> flattened batch: worked examples."""

from __future__ import annotations

import pytest
import torch

from schedspec.gpu_impl.execution import ExecutionError, PagedModelRunner
from schedspec.gpu_impl.execution.input_batch import build_input_batch
from schedspec.gpu_impl.execution.paged_attention import PagedKVCache, context_slots
from schedspec.gpu_impl.execution.request_states import RequestStates
from schedspec.spec import CachedRequestData, NewRequestData, SchedulerConfig, SchedulerOutput
from tests.test_execution_invariance import MODEL, tiny_model

CPU = torch.device("cpu")


def output(
    new: tuple[NewRequestData, ...] = (),
    cached: tuple[CachedRequestData, ...] = (),
    scheduled: dict[str, int] | None = None,
    drafts: dict[str, tuple[int, ...]] | None = None,
    preempted: frozenset[str] = frozenset(),
    finished: frozenset[str] = frozenset(),
) -> SchedulerOutput:
    scheduled = scheduled or {}
    return SchedulerOutput(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens=drafts or {},
        preempted_req_ids=preempted,
        finished_req_ids=finished,
    )


def decoding_and_new() -> tuple[RequestStates, SchedulerOutput]:
    """Block size 4. "a": 5 prompt tokens + 2 outputs, all computed but the last,
    decoding with 2 drafts. "b": new, prompt of 10 with a 4-token prefix hit
    (block 9), its next 5 tokens scheduled: a chunk that stops short of the end."""
    states = RequestStates()
    states.apply(output(new=(NewRequestData("a", (1, 2, 3, 4, 5), (2, 5), 0),), scheduled={"a": 5}))
    states.get("a").token_ids.extend([6, 7])  # what the runner sampled
    step = output(
        new=(NewRequestData("b", tuple(range(20, 30)), (9, 4, 1), 4),),
        cached=(CachedRequestData("a", False, (8,), 6, 2),),
        scheduled={"a": 3, "b": 5},
        drafts={"a": (60, 61)},
    )
    states.apply(step)
    return states, step


def test_the_batch_of_a_decode_with_drafts_beside_a_prefill_chunk() -> None:
    states, step = decoding_and_new()
    assert states.get("a").block_ids == [2, 5, 8]  # new_block_ids appended
    batch = build_input_batch(step, states, 4, CPU)
    assert batch.token_ids.tolist() == [7, 60, 61, 24, 25, 26, 27, 28]
    assert batch.positions.tolist() == [6, 7, 8, 4, 5, 6, 7, 8]
    assert batch.query_start_loc.tolist() == [0, 3, 8]
    assert batch.seq_lens.tolist() == [9, 9]
    # a: positions 6, 7 in block 5 (slots 22, 23), 8 in block 8 (slot 32);
    # b: positions 4..7 in block 4 (16..19), 8 in block 1 (slot 4).
    assert batch.slot_mapping.tolist() == [22, 23, 32, 16, 17, 18, 19, 4]
    assert batch.block_table.tolist() == [[2, 5, 8], [9, 4, 1]]
    assert (batch.num_decode_tokens, batch.num_prefill_tokens) == (3, 5)
    a, b = batch.requests
    assert list(a.logits_rows) == [0, 1, 2]  # the last known token and each draft
    assert not b.samples and list(b.logits_rows) == []


def test_the_block_table_is_padded_with_zeros() -> None:
    states = RequestStates()
    step = output(
        new=(
            NewRequestData("a", (1,) * 9, (3, 4, 5), 0),
            NewRequestData("b", (2,) * 2, (6,), 0),
        ),
        scheduled={"a": 9, "b": 2},
    )
    states.apply(step)
    batch = build_input_batch(step, states, 4, CPU)
    assert batch.block_table.tolist() == [[3, 4, 5], [6, 0, 0]]


def test_context_slots_go_through_the_block_table() -> None:
    table = torch.tensor([9, 4, 1])
    assert context_slots(table, 6, 4).tolist() == [36, 37, 38, 39, 16, 17]


def test_a_resumed_request_gets_a_new_table_and_keeps_its_tokens() -> None:
    states, _ = decoding_and_new()
    states.apply(output(preempted=frozenset({"a"})))
    assert states.get("a").block_ids == []
    states.apply(output(cached=(CachedRequestData("a", True, (7, 3), 4, 2),), scheduled={"a": 3}))
    a = states.get("a")
    assert (a.block_ids, a.token_ids, a.num_computed_tokens) == ([7, 3], [1, 2, 3, 4, 5, 6, 7], 4)


def test_finished_requests_are_forgotten() -> None:
    states, _ = decoding_and_new()
    states.apply(output(finished=frozenset({"a"})))
    assert set(states.requests) == {"b"}


def test_a_cached_request_never_seen_as_new_is_refused() -> None:
    with pytest.raises(ExecutionError, match="scheduled_cached_reqs: request 'x' was never"):
        RequestStates().apply(output(cached=(CachedRequestData("x", False, (), 0, 0),)))


def test_a_scheduler_counting_outputs_the_runner_never_sampled_is_refused() -> None:
    states, _ = decoding_and_new()
    with pytest.raises(
        ExecutionError, match="num_output_tokens: request 'a': the scheduler counts 5"
    ):
        states.apply(output(cached=(CachedRequestData("a", False, (), 7, 5),)))


def test_scheduling_past_the_known_and_draft_tokens_is_refused() -> None:
    states, _ = decoding_and_new()
    step = output(cached=(CachedRequestData("a", False, (), 6, 2),), scheduled={"a": 2})
    states.apply(step)
    with pytest.raises(ExecutionError, match="6 computed \\+ 2 scheduled exceeds its 7 known"):
        build_input_batch(step, states, 4, CPU)


def test_a_table_too_short_for_the_positions_is_refused() -> None:
    states = RequestStates()
    step = output(new=(NewRequestData("a", (1,) * 9, (3, 4), 0),), scheduled={"a": 9})
    states.apply(step)
    with pytest.raises(ExecutionError, match="table of 2 blocks of 4 does not cover position 8"):
        build_input_batch(step, states, 4, CPU)


def test_a_block_past_the_cache_is_refused() -> None:
    config = SchedulerConfig(
        block_size=4, num_blocks=4, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=16
    )
    runner = PagedModelRunner(tiny_model(), config)
    step = output(new=(NewRequestData("a", (1, 2), (4,), 0),), scheduled={"a": 2})
    with pytest.raises(ExecutionError, match="block_ids: slot 17 is past the cache's 16 slots"):
        runner.execute_model(step)


def test_slot_minus_one_writes_nothing() -> None:
    cache = PagedKVCache(MODEL, 2, 2, torch.float64, CPU)
    k = torch.ones(2, MODEL.num_heads, MODEL.head_dim, dtype=torch.float64)
    cache.write(0, torch.tensor([3, -1]), k, 2 * k)
    keys, values = cache.gather(0, torch.tensor([0, 1, 2, 3]))
    assert keys.sum(dim=(1, 2)).tolist() == [0, 0, 0, MODEL.hidden_size]
    assert values[3].max().item() == 2.0
