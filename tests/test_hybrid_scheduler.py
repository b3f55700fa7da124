"""The reference Scheduler over hybrid KV cache groups: what it snapshots, window frees
between steps, the Mamba-aligned split in both loops, and preemption of every group
(docs/SPEC.md, "Hybrid KV cache groups")."""

from __future__ import annotations

from typing import Any

import pytest

from schedspec.reference import KVCacheManager, Scheduler
from schedspec.reference.vllm.hybrid_kv_cache_manager import (
    HybridKVCacheManager,
    make_kv_cache_manager,
)
from schedspec.reference.vllm.mamba_split import MambaSplit
from schedspec.spec import ModelRunnerOutput, Request, RequestStatus, SchedulerOutput
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
)
from tests.hybrid_helpers import FULL, MAMBA
from tests.sched_helpers import add, make_config, step

N = NULL_BLOCK_ID
SHORT_WINDOW = SlidingWindowGroup(block_size=4, sliding_window=4)


def hybrid_scheduler(*groups: KVCacheGroupSpec, **overrides: Any) -> Scheduler:
    fields: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 24,
        "max_model_len": 32,
        "max_num_batched_tokens": 8,
        "max_num_seqs": 2,
        "enable_chunked_prefill": True,
        "kv_cache_groups": groups,
    }
    return Scheduler(make_config(**{**fields, **overrides}))


def test_the_single_group_keeps_its_own_manager_and_a_hybrid_config_gets_the_coordinator() -> None:
    assert isinstance(make_kv_cache_manager(make_config()), KVCacheManager)
    hybrid = make_config(max_model_len=32, num_blocks=24, kv_cache_groups=(FULL, MAMBA))
    assert isinstance(make_kv_cache_manager(hybrid), HybridKVCacheManager)
    with pytest.raises(ValueError, match="single group"):
        KVCacheManager(hybrid)


def test_snapshot_lists_each_group_table_and_every_non_null_block_group_0_first() -> None:
    scheduler = hybrid_scheduler(FULL, SHORT_WINDOW)
    add(scheduler, "r", 16, max_tokens=4)
    step(scheduler)  # tokens 0..7: 2 blocks in each group
    step(scheduler)  # tokens 8..15; the window (4 tokens) then reads from token 12 on
    state = scheduler.snapshot().requests["r"]
    full, window = state.group_block_ids
    assert len(full) == 4 and N not in full
    # Allocated after 8 processed tokens: the window's blocks 0 (tokens 0..3) freed,
    # block 1 (4..7) kept, as token 8 reads 5..8.
    assert window[0] == N and N not in window[1:] and len(window) == 4
    assert state.block_ids == full + window[1:]


def test_a_window_frees_a_block_only_once_its_tokens_are_processed() -> None:
    """Async: the step in flight still reads its window, so a block is freed only when
    the step that passed it has landed (processed = computed - in flight)."""
    scheduler = hybrid_scheduler(FULL, SHORT_WINDOW, async_scheduling=True)
    add(scheduler, "r", 16, max_tokens=4)
    first = scheduler.schedule()  # tokens 0..7, in flight
    scheduler.schedule()  # tokens 8..15: nothing processed yet, nothing freed
    assert N not in scheduler.snapshot().requests["r"].group_block_ids[1]
    scheduler.update_from_output(first, ModelRunnerOutput(sampled_token_ids={}))
    scheduler.schedule()  # decode: 8 tokens processed, window block 0 goes
    assert scheduler.snapshot().requests["r"].group_block_ids[1][0] == N


def test_the_mamba_aligned_split_cuts_a_running_chunk_to_a_state_boundary() -> None:
    scheduler = hybrid_scheduler(FULL, MAMBA, max_num_batched_tokens=6)
    add(scheduler, "r", 16, max_tokens=2)
    assert step(scheduler).num_scheduled_tokens == {"r": 4}  # admission: 6 cut to 4
    assert step(scheduler).num_scheduled_tokens == {"r": 4}  # running: 4..10 cut to 4..8
    # Mamba's table: the state after 4 tokens (the copy source) and after 8.
    assert N not in scheduler.snapshot().requests["r"].group_block_ids[1]
    step(scheduler)  # 8 processed: the state after 4 is retired, after 8 is the source
    mamba = scheduler.snapshot().requests["r"].group_block_ids[1]
    assert mamba[0] == N and N not in mamba[1:] and len(mamba) == 3


def test_a_block_wider_than_any_step_advances_by_part_of_a_block() -> None:
    """vLLM #40707 and #45414: rounding this chunk down to 0 would stall it for good."""
    wide = MambaGroup(block_size=8, mamba_cache_mode="align")
    scheduler = hybrid_scheduler(FULL, wide, block_size=8, max_num_batched_tokens=4)
    add(scheduler, "r", 16, max_tokens=2)
    assert step(scheduler).num_scheduled_tokens == {"r": 4}


def test_an_aligned_cut_to_nothing_leaves_the_admission_for_a_later_step() -> None:
    scheduler = hybrid_scheduler(FULL, MAMBA, max_num_batched_tokens=6)
    add(scheduler, "a", 5, max_tokens=4)  # 4 tokens, to its checkpoint
    add(scheduler, "b", 16, max_tokens=2, first_token=2000)
    output = step(scheduler)
    # b's 2 tokens of budget cut to 0: it waits; next step a's last token, b's 5 cut to 4.
    assert output.num_scheduled_tokens == {"a": 4}
    assert step(scheduler).num_scheduled_tokens == {"a": 1, "b": 4}


def test_an_admitted_prefill_stops_at_its_checkpoint() -> None:
    """docs/FINDINGS.md G4: 1-token blocks, a 2-token window, a 3-token prompt and a
    budget of 4. A later hit on the prompt reaches token 2 at most (it leaves the last
    token to compute), so the chunk stops there and Mamba's state after 2 is written."""
    scheduler = hybrid_scheduler(
        FullAttentionGroup(block_size=1),
        SlidingWindowGroup(block_size=1, sliding_window=2),
        MambaGroup(block_size=1, mamba_cache_mode="align"),
        block_size=1,
        num_blocks=11,
        max_model_len=4,
        max_num_seqs=1,
        max_num_batched_tokens=4,
        enable_prefix_caching=True,
    )
    add(scheduler, "r1", 3, max_tokens=1)
    assert step(scheduler).num_scheduled_tokens == {"r1": 2}
    assert step(scheduler).num_scheduled_tokens == {"r1": 1}


def test_a_prefill_from_mid_block_stops_at_the_next_boundary() -> None:
    """2-token blocks and a long-prefill cap of 1: beside r0, r2's chunk is capped to 1
    token (a part of a block); alone next step it is not capped, but from token 1,
    mid-block, it stops at the boundary at 2 rather than run on to its checkpoint, 4."""
    scheduler = hybrid_scheduler(
        FullAttentionGroup(block_size=2),
        SlidingWindowGroup(block_size=2, sliding_window=3),
        MambaGroup(block_size=2, mamba_cache_mode="align"),
        block_size=2,
        num_blocks=14,
        max_model_len=9,
        max_num_seqs=3,
        max_num_batched_tokens=9,
        long_prefill_token_threshold=1,
    )
    add(scheduler, "r0", 1, max_tokens=1)
    add(scheduler, "r2", 5, max_tokens=1, first_token=2000)
    assert step(scheduler).num_scheduled_tokens == {"r0": 1, "r2": 1}
    assert step(scheduler).num_scheduled_tokens == {"r2": 1}


def test_an_eagle_drafter_without_prefix_caching_backs_the_checkpoint_off_a_block() -> None:
    """A 3-token prompt, 2-token blocks, an EAGLE-style drafter (one lookahead slot), no
    prefix caching: vLLM's block drop puts the checkpoint at 0, so the prompt runs whole;
    with the plain checkpoint (2) it would stop at 2."""
    config = {
        "block_size": 2,
        "num_blocks": 9,
        "max_model_len": 4,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 4,
        "num_speculative_tokens": 1,
        "num_lookahead_tokens": 1,
        "pad_spec_decode": True,
    }
    groups = (
        FullAttentionGroup(block_size=2),
        MambaGroup(block_size=2, mamba_cache_mode="align", num_speculative_blocks=1),
    )
    eagle = hybrid_scheduler(*groups, **config)
    add(eagle, "r1", 3, max_tokens=1)
    assert step(eagle).num_scheduled_tokens == {"r1": 3}
    ngram = hybrid_scheduler(*groups, **(config | {"num_lookahead_tokens": 0}))
    add(ngram, "r1", 3, max_tokens=1)
    assert step(ngram).num_scheduled_tokens == {"r1": 2}


def test_a_running_prefill_stops_at_its_checkpoint() -> None:
    """An 18-token prompt, 4-token blocks, a budget of 12: the first chunk ends on the
    boundary at 12, the second would reach the prompt's end but stops at the checkpoint,
    16 (the last boundary before token 17), and the third runs 16..18."""
    scheduler = hybrid_scheduler(FULL, MAMBA, max_num_batched_tokens=12)
    add(scheduler, "r", 18, max_tokens=2)
    assert [step(scheduler).num_scheduled_tokens for _ in range(3)] == [
        {"r": 12},
        {"r": 4},
        {"r": 2},
    ]


def test_an_admitted_prefill_stops_at_the_shared_prefix_junction() -> None:
    """docs/FINDINGS.md G7: r1 ran in chunks of 5 (its checkpoint) and 1, so Mamba holds
    states after 5 and 6 and full attention every token. r2 shares r1's first 4 tokens:
    full attention alone hits 4, Mamba 0, so the hit is 0 and the junction 4, and r2's
    chunk stops there, not at its checkpoint (5), so the state after the shared prefix is
    written for the next request like r2."""
    scheduler = hybrid_scheduler(
        FullAttentionGroup(block_size=1),
        SlidingWindowGroup(block_size=1, sliding_window=2),
        MambaGroup(block_size=1, mamba_cache_mode="align"),
        block_size=1,
        num_blocks=17,
        max_model_len=7,
        max_num_seqs=1,
        max_num_batched_tokens=7,
        enable_prefix_caching=True,
    )
    r1 = Request("r1", [1, 2, 3, 4, 0, 0], 1)
    scheduler.add_request(r1)
    assert [step(scheduler).num_scheduled_tokens for _ in range(2)] == [{"r1": 5}, {"r1": 1}]
    assert r1.shared_prefix_boundary == 0  # its lookup found nothing cached
    scheduler.add_request(Request("r2", [1, 2, 3, 4, 5, 0], 1))
    output = step(scheduler)
    assert output.scheduled_new_reqs[0].num_computed_tokens == 0
    assert output.num_scheduled_tokens == {"r2": 4}
    assert scheduler.snapshot().requests["r2"].shared_prefix_boundary == 4
    assert step(scheduler).num_scheduled_tokens == {"r2": 1}  # then its checkpoint, 5


def test_an_admission_waits_for_a_mamba_state_cached_in_the_same_step() -> None:
    """docs/FINDINGS.md G8: r0 ([0]) is admitted and its state after 1 token is cached at
    once; r1 ([0, 0]) would hit it in every group, but r0's step has not written that
    state yet, so r1 waits for the next step, and then hits it."""
    scheduler = hybrid_scheduler(
        FullAttentionGroup(block_size=1),
        SlidingWindowGroup(block_size=1, sliding_window=2),
        MambaGroup(block_size=1, mamba_cache_mode="align"),
        block_size=1,
        num_blocks=8,
        max_model_len=3,
        max_num_batched_tokens=3,
        enable_prefix_caching=True,
    )
    scheduler.add_request(Request("r0", [0], 1))
    scheduler.add_request(Request("r1", [0, 0], 1))
    assert step(scheduler).num_scheduled_tokens == {"r0": 1}
    output = step(scheduler)
    assert output.num_scheduled_tokens == {"r1": 1}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 1


def junction_scheduler(num_blocks: int) -> tuple[Scheduler, Request]:
    """A's 17 tokens ran alone in chunks of 16 (its checkpoint) and 1: Mamba holds its
    state after 16 only. Then C (8 tokens of its own) and B, which shares A's first 12
    tokens, arrive; with two requests the long-prefill cap (8) holds. B's lookup: full
    attention alone hits 12, Mamba 0, so B's hit is 0 and its junction 12."""
    scheduler = hybrid_scheduler(
        FULL,
        MAMBA,
        num_blocks=num_blocks,
        max_num_batched_tokens=16,
        long_prefill_token_threshold=8,
        enable_prefix_caching=True,
    )
    a = list(range(1, 18))
    scheduler.add_request(Request("A", a, 1))
    assert [step(scheduler).num_scheduled_tokens for _ in range(2)] == [{"A": 16}, {"A": 1}]
    scheduler.add_request(Request("C", list(range(90, 98)), 24))
    b = Request("B", [*a[:12], 50, 51, 52, 53, 54], 4)
    scheduler.add_request(b)
    return scheduler, b


def test_a_running_prefill_stops_at_the_junction_its_admission_recorded() -> None:
    """B's first chunk (capped to 8) ends before its junction, 12; running, it keeps the
    junction, and its next chunk stops there (4 tokens, not 8 to its checkpoint, 16)."""
    scheduler, b = junction_scheduler(32)
    assert step(scheduler).num_scheduled_tokens == {"C": 4, "B": 8}
    assert b.shared_prefix_boundary == 12
    assert step(scheduler).num_scheduled_tokens == {"C": 4, "B": 4}
    assert step(scheduler).num_scheduled_tokens == {"C": 1, "B": 4}
    assert scheduler.snapshot().requests["B"].shared_prefix_boundary == 12  # kept while running


def test_a_preempted_request_keeps_its_junction_until_its_next_lookup() -> None:
    """In an 11-block pool C's decodes preempt B (the newer). B keeps its junction (12)
    while it waits, as vLLM keeps it; the next lookup, made though B is not admitted,
    replaces it: B's own chunks wrote Mamba's states at 8, 12 and 16, so both groups hit
    16 and there is no junction (0)."""
    scheduler, b = junction_scheduler(11)
    for _ in range(7):
        output = step(scheduler)
    assert output.preempted_req_ids == frozenset({"B"})
    victim = scheduler.snapshot().requests["B"]
    assert victim.status is RequestStatus.PREEMPTED and victim.shared_prefix_boundary == 12
    assert step(scheduler).num_scheduled_tokens == {"C": 1}
    assert b.status is RequestStatus.PREEMPTED and b.shared_prefix_boundary == 0


def test_the_split_uses_the_mamba_groups_own_block_size() -> None:
    """vLLM #55600 and #54076 cut at another group's block size."""
    config = make_config(
        block_size=8,
        num_blocks=24,
        max_model_len=32,
        max_num_seqs=2,
        max_num_batched_tokens=8,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=6,
        kv_cache_groups=(FULL, MambaGroup(block_size=8, mamba_cache_mode="align")),
    )
    assert MambaSplit.of(config) == MambaSplit(block_size=8, max_prefill_tokens=6)
    assert (
        MambaSplit.of(
            make_config(max_model_len=32, num_blocks=24, kv_cache_groups=(FULL, SHORT_WINDOW))
        )
        is None
    )


def test_preempting_a_hybrid_request_frees_every_group() -> None:
    scheduler = hybrid_scheduler(FULL, SHORT_WINDOW, MAMBA, num_blocks=12, max_model_len=16)
    add(scheduler, "a", 8, max_tokens=8)
    step(scheduler)
    add(scheduler, "b", 8, max_tokens=8, first_token=2000)
    for _ in range(12):
        output = step(scheduler)
        if output.preempted_req_ids:
            break
    assert output.preempted_req_ids == frozenset({"b"})
    victim = scheduler.snapshot().requests["b"]
    assert victim.status is RequestStatus.PREEMPTED
    assert victim.block_ids == () and victim.group_block_ids == ((), (), ())


@pytest.mark.parametrize(("async_scheduling", "held"), [(False, 2), (True, 3)])
def test_an_aligned_mamba_group_holds_one_state_more_under_async_scheduling(
    async_scheduling: bool, held: int
) -> None:
    """A lone request in chunks of one block: synchronously it holds its running state
    and the one it copied from; under async scheduling also the state of the step in
    flight, whose tokens are not processed yet (blocks_for_one_request counts it)."""
    scheduler = hybrid_scheduler(
        FULL, MAMBA, max_num_batched_tokens=4, async_scheduling=async_scheduling
    )
    add(scheduler, "r", 29, max_tokens=4)
    in_flight: list[tuple[SchedulerOutput, set[str]]] = []
    most = 0
    for _ in range(12):
        output = scheduler.schedule()
        chunks = {r for r in output.num_scheduled_tokens if scheduler.requests[r].is_prefill_chunk}
        in_flight.append((output, chunks))
        state = scheduler.snapshot().requests.get("r")
        if state is not None:
            most = max(most, sum(1 for b in state.group_block_ids[1] if b != N))
        if len(in_flight) > int(async_scheduling):
            landed, chunked = in_flight.pop(0)
            sampled = {r: [7] for r in landed.num_scheduled_tokens if r not in chunked}
            scheduler.update_from_output(landed, ModelRunnerOutput(sampled_token_ids=sampled))
    assert most == held


def test_an_admission_takes_every_groups_hit_through_the_scheduler() -> None:
    """The flat hit list is split back into groups by the hit length: B shares A's first
    8 tokens, and hits them in full attention (blocks 0 and 1) and in the window (its
    last block before the hit, 4..7; the block of 0..3 is a null)."""
    scheduler = hybrid_scheduler(
        FULL, SHORT_WINDOW, enable_prefix_caching=True, max_num_batched_tokens=16
    )
    add(scheduler, "a", 12, max_tokens=1)
    step(scheduler)
    a = scheduler.snapshot()  # a finished: its blocks are free and cached
    assert "a" not in a.requests
    add(scheduler, "b", 12, max_tokens=1)  # the same first token ids as a's: 1000, ...
    output = scheduler.schedule()
    (new,) = output.scheduled_new_reqs
    assert new.num_computed_tokens == 8
    full, window = scheduler.snapshot().requests["b"].group_block_ids
    assert N not in full[:2] and window[0] == N and window[1] != N
    assert new.block_ids == tuple(b for b in full + window if b != N)
