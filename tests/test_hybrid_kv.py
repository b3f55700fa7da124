"""The reference's hybrid KV cache rules, one worked example each (docs/SPEC.md, "Hybrid KV
cache groups"): what each kind skips, each kind's hit, the reconciled hit, two-phase
allocation, window frees on processed tokens with the null block in their place, Mamba's
aligned states and copies, the aligned split, and what freeing releases."""

from __future__ import annotations

import pytest

from schedspec.reference import KVCacheBlock
from schedspec.reference.vllm.kv_cache_coordinator import HybridKVCacheCoordinator
from schedspec.reference.vllm.mamba_manager import MambaManager
from schedspec.reference.vllm.mamba_split import mamba_block_aligned_split
from schedspec.spec import Request, RequestStatus
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    admission_cap_blocks,
    max_in_flight_tokens,
    window_block_reachable,
)
from tests.hybrid_helpers import (
    FULL,
    MAMBA,
    WINDOW,
    N,
    cache_in_group,
    coordinator,
    manager,
    prompt,
)
from tests.kv_helpers import ids, toks

# -- what each kind skips -------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "computed", "skipped"),
    [
        (FULL, 30, 0),  # full attention reads every token
        (SlidingWindowGroup(block_size=4, sliding_window=4), 7, 4),  # token 7 reads 4..7
        (SlidingWindowGroup(block_size=4, sliding_window=8), 5, 0),  # the window covers 0..5
        (ChunkedLocalGroup(block_size=4, attention_chunk_size=8), 13, 8),  # token 13: chunk 8..15
        (ChunkedLocalGroup(block_size=4, attention_chunk_size=8), 8, 8),  # token 8 opens a chunk
        (ChunkedLocalGroup(block_size=4, attention_chunk_size=8), 7, 0),  # token 7: chunk 0..7
        (MAMBA, 9, 8),  # only the state after token 8 is read again
    ],
)
def test_get_num_skipped_tokens_per_kind(
    group: KVCacheGroupSpec, computed: int, skipped: int
) -> None:
    kv = coordinator(FULL, group) if group != FULL else coordinator(FULL, WINDOW)
    assert manager(kv, 1 if group != FULL else 0).get_num_skipped_tokens(computed) == skipped


# -- each kind's own hit ----------------------------------------------------------------


def test_sliding_window_hit_is_the_rightmost_run_covering_a_window() -> None:
    kv = coordinator(FULL, WINDOW)
    request = prompt(21)  # 5 full blocks; a hit may cover 20 tokens
    # Blocks 0, 2 and 3 cached: blocks 2-3 are a window's worth, block 1 was evicted.
    b0, b2, b3 = cache_in_group(kv, request, 1, [0, 2, 3])
    hit = manager(kv, 1).find_longest_cache_hit(kv.block_hashes(request, 1), 20)
    assert [b.block_id for b in hit] == [N, N, b2.block_id, b3.block_id]
    # Without a window's run the hit is what runs from the first block: block 0 alone.
    short = manager(kv, 1).find_longest_cache_hit(kv.block_hashes(request, 1), 8)
    assert ids(short) == [b0.block_id]


def test_mamba_hit_is_the_rightmost_cached_state() -> None:
    kv = coordinator(FULL, MAMBA)
    request = prompt(21)
    _, s2 = cache_in_group(kv, request, 1, [0, 2])
    hit = manager(kv, 1).find_longest_cache_hit(kv.block_hashes(request, 1), 20)
    assert ids(hit) == [N, N, s2.block_id]  # one state stands for 12 tokens


def test_chunked_local_hit_starts_at_the_chunk_of_the_limit() -> None:
    kv = coordinator(FULL, ChunkedLocalGroup(block_size=4, attention_chunk_size=8))
    request = prompt(21)
    _, c2, _ = cache_in_group(kv, request, 1, [0, 2, 4])
    # Limit 16: the chunk 16..23 starts at block 4, so blocks 0-3 are nulls.
    assert ids(manager(kv, 1).find_longest_cache_hit(kv.block_hashes(request, 1), 16)) == [N] * 4
    # Limit 12: chunk 8..15 starts at block 2 (cached), block 3 misses.
    hit = manager(kv, 1).find_longest_cache_hit(kv.block_hashes(request, 1), 12)
    assert ids(hit) == [N, N, c2.block_id]


def test_groups_do_not_share_hits_for_the_same_tokens() -> None:
    kv = coordinator(FULL, WINDOW)
    request = prompt(21)
    cache_in_group(kv, request, 0, [0, 1, 2, 3])  # the full-attention group's blocks
    assert manager(kv, 1).find_longest_cache_hit(kv.block_hashes(request, 1), 20) == []


# -- the reconciled hit -----------------------------------------------------------------


def test_reconciled_hit_is_cut_by_a_lagging_group_and_full_attention_trimmed() -> None:
    kv = coordinator(FULL, WINDOW)
    request = prompt(21)
    f = cache_in_group(kv, request, 0, [0, 1, 2, 3])
    _, w1 = cache_in_group(kv, request, 1, [0, 1])  # the window group lags: 2 blocks
    (full, window), length, uncached = kv.get_computed_blocks(request)
    assert length == 8
    assert uncached == 8  # full attention alone hit 16: the shared prefix runs 8 further
    assert ids(full) == [f[0].block_id, f[1].block_id]  # trimmed from 4 blocks
    assert [b.block_id for b in window] == [ids(window)[0], w1.block_id]


def test_reconciled_hit_is_a_fixed_point_over_rounds() -> None:
    kv = coordinator(WINDOW, MAMBA)
    request = prompt(17)  # a hit may cover 16 tokens
    w0, _, _ = cache_in_group(kv, request, 0, [0, 2, 3])
    m0, _ = cache_in_group(kv, request, 1, [0, 1])
    # Round 1: the window finds blocks 2-3 (16), Mamba cuts to its state at 8.
    # Round 2: at 8 the window has no 2-block run, only block 0 from the start (4);
    # Mamba at 4 has its state at 4. Round 3 changes nothing: 4.
    (window, mamba), length, uncached = kv.find_longest_cache_hit(request, 16)
    assert length == 4
    assert uncached == 12  # the window's first lookup, 16, was the longest single-group hit
    assert ids(window) == [w0.block_id] and ids(mamba) == [m0.block_id]


def test_reconciled_hit_is_never_longer_than_any_groups_own() -> None:
    kv = coordinator(FULL, WINDOW, MAMBA)
    request = prompt(21)
    cache_in_group(kv, request, 0, [0, 1, 2, 3, 4])
    cache_in_group(kv, request, 1, [2, 3])
    cache_in_group(kv, request, 2, [1, 3])
    own = [
        len(m.find_longest_cache_hit(kv.block_hashes(request, g), 20)) * m.block_size
        for g, m in enumerate(kv.managers)
    ]
    _, length, _ = kv.get_computed_blocks(request)
    assert own == [20, 16, 16] and length == 16 <= min(own)


# -- allocation ---------------------------------------------------------------------


def hits_at_the_front(kv: HybridKVCacheCoordinator, request: Request) -> list[KVCacheBlock]:
    """A 7-block pool whose free queue is the window group's 2 cached blocks, then the
    full group's 2, then 2 cached blocks of another prompt; one block is held. The
    window group's blocks are returned: the next blocks handed out."""
    window = cache_in_group(kv, request, 1, [0, 1])
    cache_in_group(kv, request, 0, [0, 1])
    cache_in_group(kv, Request("other", toks(100, 9), 8), 0, [0, 1])
    kv.block_pool.get_new_blocks(1)
    assert ids(kv.block_pool.free_block_queue)[:2] == ids(window)
    return window


def test_allocation_touches_every_groups_hits_before_allocating() -> None:
    kv = coordinator(FULL, WINDOW, num_blocks=7, max_model_len=12)
    request = prompt(9)
    window = hits_at_the_front(kv, request)
    hits, length, _ = kv.get_computed_blocks(request)
    assert length == 8
    # 1 new block per group + 4 free hits = the 6 free blocks: it fits, and the new
    # blocks are the other prompt's, not the window group's hits.
    new = kv.allocate_slots(request, 1, num_new_computed_tokens=8, new_computed_blocks=hits)
    assert new is not None
    assert manager(kv, 1).get_block_ids("r")[:2] == tuple(ids(window))
    assert all(b.block_hash is not None for b in window)  # still cached: never evicted


def test_allocating_new_blocks_before_touching_would_evict_a_hit() -> None:
    # The check above can fail: in one phase per group (the full group touches its hits
    # and allocates before the window group touches its own), the full group's new block
    # is the window group's first hit (vLLM #33775).
    kv = coordinator(FULL, WINDOW, num_blocks=7, max_model_len=12)
    request = prompt(9)
    window = hits_at_the_front(kv, request)
    (full_hits, _), _, _ = kv.get_computed_blocks(request)
    kv.managers[0].add_local_computed_blocks("r", full_hits, 8)
    assert kv.managers[0].allocate_new_blocks("r", 9, 9) == [window[0]]
    assert window[0].block_hash is None  # evicted: the window group's hit is gone


def test_allocation_is_all_or_nothing_across_groups() -> None:
    # 12 tokens: 3 full blocks + 3 window blocks = 6 > 5 free.
    kv = coordinator(FULL, WINDOW, num_blocks=6, max_model_len=12)
    kv.block_pool.get_new_blocks(1)
    request = prompt(12)
    assert kv.allocate_slots(request, 12) is None
    assert kv.block_pool.get_num_free_blocks() == 5
    assert kv.get_block_ids("r") == ((), ())


# -- the admission cap ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "in_flight", "cap"),
    [
        # 1 window token before the first unprocessed one, 2 in flight: 3 blocks, and one
        # more where the window starts inside a block.
        (SlidingWindowGroup(block_size=1, sliding_window=2), 2, 4),
        (SlidingWindowGroup(block_size=4, sliding_window=5), 8, 4),  # cdiv(12, 4) + 1
        (SlidingWindowGroup(block_size=4, sliding_window=30), 8, 9),  # max_model_len 32: 8 + 1
        (ChunkedLocalGroup(block_size=4, attention_chunk_size=8), 4, 3),  # cdiv(8 + 4, 4)
        (ChunkedLocalGroup(block_size=4, attention_chunk_size=8), 40, 8),  # max_model_len 32
        (FULL, 8, None),  # full attention holds every block to the end
        (MAMBA, 8, None),
    ],
)
def test_admission_cap_blocks_per_kind(
    group: KVCacheGroupSpec, in_flight: int, cap: int | None
) -> None:
    assert admission_cap_blocks(group, in_flight, 32) == cap


@pytest.mark.parametrize(("async_scheduling", "in_flight"), [(False, 6), (True, 12)])
def test_max_in_flight_tokens_is_a_budget_a_concurrent_step(
    async_scheduling: bool, in_flight: int
) -> None:
    assert max_in_flight_tokens(6, async_scheduling) == in_flight


def test_admission_gate_counts_a_window_at_its_cap() -> None:
    """docs/FINDINGS.md G5's shape: full attention beside a 2-token window, 1-token blocks,
    a budget of 2, 12 blocks, one held in each group by another request. A 5-token prompt
    needs 5 full blocks and, at the window's cap, 4 window blocks (not 5): with a 1-block
    watermark, 10 = the 10 free blocks, so it is admitted."""
    one = SlidingWindowGroup(block_size=1, sliding_window=2)
    kv = coordinator(
        FullAttentionGroup(block_size=1),
        one,
        block_size=1,
        num_blocks=12,
        max_model_len=6,
        max_num_batched_tokens=2,
        max_num_seqs=2,
        enable_prefix_caching=False,
    )
    assert kv.allocate_slots(Request("r0", toks(0, 1), 1), 1) is not None
    request = Request("r1", toks(0, 5), 1)
    hits: tuple[list[KVCacheBlock], ...] = ([], [])
    assert kv.get_num_blocks_to_allocate("r1", 5, hits, 0, 5) == 10  # every block
    assert kv.get_num_blocks_to_allocate("r1", 5, hits, 0, 5, apply_admission_cap=True) == 9
    new = kv.allocate_slots(request, 1, full_sequence_must_fit=True, watermark_blocks=1)
    assert new is not None  # the step's own slots: one block per group
    assert [len(group) for group in new] == [1, 1]


def test_admission_gate_still_refuses_past_the_cap() -> None:
    # The same with a second block held: 10 needed, 9 free.
    kv = coordinator(
        FullAttentionGroup(block_size=1),
        SlidingWindowGroup(block_size=1, sliding_window=2),
        block_size=1,
        num_blocks=12,
        max_model_len=6,
        max_num_batched_tokens=2,
        max_num_seqs=2,
        enable_prefix_caching=False,
    )
    kv.block_pool.get_new_blocks(1)
    assert kv.allocate_slots(Request("r0", toks(0, 1), 1), 1) is not None
    request = Request("r1", toks(0, 5), 1)
    assert kv.allocate_slots(request, 1, full_sequence_must_fit=True, watermark_blocks=1) is None
    assert kv.get_block_ids("r1") == ((), ())


# -- what a window caches -------------------------------------------------------------


def test_window_caches_only_the_blocks_a_hit_reaches() -> None:
    """Scheduler blocks of 8 over a window of 4-token blocks and 4 tokens: a hit ends on a
    multiple of 8 and the window reads the one block before it, so of each pair of window
    blocks only the second is cached; full attention caches every block."""
    kv = coordinator(
        FullAttentionGroup(block_size=8),
        SlidingWindowGroup(block_size=4, sliding_window=4),
        block_size=8,
    )
    request = prompt(17)
    kv.allocate_slots(request, 17)
    full, window = (manager(kv, g).req_to_blocks["r"] for g in (0, 1))
    assert [b.block_hash is not None for b in full] == [True, True, False]
    assert [b.block_hash is not None for b in window] == [False, True, False, True, False]
    assert [window_block_reachable(manager(kv, 1).spec, i, 8) for i in range(5)] == [
        False,
        True,
        False,
        True,
        False,
    ]


def test_a_one_token_window_caches_nothing_and_frees_to_the_front() -> None:
    """docs/FINDINGS.md G6's shape: a 1-token window needs no block before a boundary, so
    none of its blocks is cached. Freed, the uncached window block goes to the front of the
    queue, the cached full-attention block to the back."""
    kv = coordinator(FULL, SlidingWindowGroup(block_size=4, sliding_window=1), num_blocks=16)
    request = prompt(4)
    kv.allocate_slots(request, 4)
    (full,), (window,) = (manager(kv, g).req_to_blocks["r"] for g in (0, 1))
    assert full.block_hash is not None and window.block_hash is None
    request.status = RequestStatus.FINISHED_STOPPED
    kv.free(request)
    queue = [b.block_id for b in kv.block_pool.free_block_queue]
    assert queue[0] == window.block_id and queue[-1] == full.block_id


def test_a_one_token_window_gets_no_prefix_hit() -> None:
    """A window hit needs one cached window block, and a 1-token window caches none: the
    same prompt again hits nothing, though full attention cached its blocks."""
    kv = coordinator(FULL, SlidingWindowGroup(block_size=4, sliding_window=1), num_blocks=16)
    first = prompt(9)
    kv.allocate_slots(first, 9)
    again = Request("again", toks(0, 9), 8)
    assert kv.find_longest_cache_hit(again, 8)[1] == 0
    assert manager(kv, 0).find_longest_cache_hit(kv.block_hashes(again, 0), 8) != []


# -- window frees ---------------------------------------------------------------------


def test_window_frees_below_processed_tokens_only_with_nulls_in_place() -> None:
    kv = coordinator(FULL, SlidingWindowGroup(block_size=4, sliding_window=4))
    request = prompt(16)
    assert kv.allocate_slots(request, 12) is not None
    request.num_computed_tokens = 12
    free_before = kv.block_pool.get_num_free_blocks()
    # 4 of the 12 computed tokens are in flight: 8 processed, token 8 reads 5..8, so
    # block 0 (tokens 0-3) is out of the window; block 1 is not.
    kv.remove_skipped_blocks("r", 12 - 4)
    assert manager(kv, 1).get_block_ids("r")[:2][0] == N
    assert kv.block_pool.get_num_free_blocks() == free_before + 1
    # All 12 processed: token 12 reads 9..12, blocks 0-1 out.
    kv.remove_skipped_blocks("r", 12)
    assert manager(kv, 1).get_block_ids("r")[:2] == (N, N)
    assert kv.block_pool.get_num_free_blocks() == free_before + 2
    assert manager(kv, 0).get_block_ids("r").count(N) == 0  # full attention keeps all


def test_allocate_slots_frees_windows_on_processed_tokens() -> None:
    kv = coordinator(FULL, SlidingWindowGroup(block_size=4, sliding_window=4))
    request = prompt(20)
    kv.allocate_slots(request, 12)
    request.num_computed_tokens = 12
    # The last 4 computed tokens are still in flight: only block 0 is out of the window
    # of the 8 processed ones, though block 1 is out of the 12 computed ones' window.
    kv.allocate_slots(request, 4, num_in_flight_tokens=4)
    assert manager(kv, 1).get_block_ids("r")[:2][0] == N
    assert manager(kv, 1).get_block_ids("r")[1] != N


def test_the_null_block_is_never_freed_cached_or_handed_out() -> None:
    kv = coordinator(FULL, SlidingWindowGroup(block_size=4, sliding_window=4), num_blocks=16)
    request = prompt(16)
    kv.allocate_slots(request, 12)
    request.num_computed_tokens = 12
    kv.remove_skipped_blocks("r", 12)
    kv.cache_blocks(request, 12)
    request.status = RequestStatus.FINISHED_STOPPED
    kv.free(request)
    pool = kv.block_pool
    assert pool.get_num_free_blocks() == 16
    assert N not in [b.block_id for b in pool.free_block_queue]
    assert kv.null_block.ref_cnt == 0 and kv.null_block.block_hash is None
    assert N not in [b.block_id for b in pool.get_new_blocks(16)]


# -- Mamba ----------------------------------------------------------------------------


def test_mamba_align_keeps_a_state_per_boundary_and_copies_it_forward() -> None:
    kv = coordinator(FULL, MAMBA)
    mamba = kv.managers[1]
    assert isinstance(mamba, MambaManager)
    request = prompt(20)
    # Chunk 1: 8 tokens. The running state goes in block 1; block 0 is a null.
    assert mamba.get_num_blocks_to_allocate("r", 8, [], 0, 8) == 1
    kv.allocate_slots(request, 8)
    first = mamba.req_to_blocks["r"][1]
    assert mamba.get_block_ids("r") == (N, first.block_id)
    request.num_computed_tokens = 8
    # Chunk 2: 4 more. A new state block; the worker copies block 1's state into it.
    kv.allocate_slots(request, 4)
    second = mamba.req_to_blocks["r"][2]
    assert mamba.get_block_ids("r") == (N, first.block_id, second.block_id)
    assert mamba.take_state_copies() == [(first, second)]
    assert mamba.take_state_copies() == []  # each copy is owed once
    request.num_computed_tokens = 12
    # Once the 12 tokens are processed, the copy source is never read again: it is
    # retired with the skipped prefix (tokens 0-10; the state after token 11 is read).
    kv.remove_skipped_blocks("r", 12)
    assert mamba.get_block_ids("r") == (N, N, second.block_id)
    assert first.ref_cnt == 0


def test_mamba_takes_at_most_one_new_block_a_step() -> None:
    kv = coordinator(
        FULL, MambaGroup(block_size=4, mamba_cache_mode="align", num_speculative_blocks=1)
    )
    mamba = kv.managers[1]
    # 20 tokens span 5 blocks, but the table gets one state block and, on the first
    # allocation, one draft scratch block: the rest are nulls.
    assert mamba.get_num_blocks_to_allocate("r", 20, [], 0, 20) == 2
    kv.allocate_slots(prompt(24), 20)
    assert mamba.get_block_ids("r")[:4] == (N, N, N, N)
    assert len([i for i in mamba.get_block_ids("r") if i != N]) == 2


def test_mamba_scratch_states_move_behind_the_new_state_block() -> None:
    kv = coordinator(
        FULL, MambaGroup(block_size=4, mamba_cache_mode="align", num_speculative_blocks=1)
    )
    mamba = kv.managers[1]
    assert isinstance(mamba, MambaManager)
    request = prompt(20)
    kv.allocate_slots(request, 8)
    _, state, scratch = mamba.req_to_blocks["r"]
    request.num_computed_tokens = 8
    # 8 more tokens: the new state goes in block 3. The scratch block (the request's
    # own, never cached) moves there and a new scratch block follows it; block 2 is null.
    kv.allocate_slots(request, 8)
    table = mamba.req_to_blocks["r"]
    assert table[:4] == [kv.null_block, state, kv.null_block, scratch] and len(table) == 5
    assert mamba.take_state_copies() == [(state, scratch)]


def test_mamba_none_mode_keeps_one_running_state() -> None:
    # Mode "none", no prefix caching: a 32-token Mamba block holds the running state. The
    # pool counts two such blocks (64 tokens), as the attention rule may hold them.
    kv = coordinator(
        FULL,
        MambaGroup(block_size=32),
        block_size=32,
        num_blocks=18,
        max_model_len=64,
        enable_prefix_caching=False,
    )
    mamba = kv.managers[1]
    request = prompt(40)
    kv.allocate_slots(request, 20)
    (first,) = mamba.req_to_blocks["r"]
    request.num_computed_tokens = 20
    kv.allocate_slots(request, 16)  # past token 31: a second block
    request.num_computed_tokens = 36
    kv.remove_skipped_blocks("r", 36)
    assert mamba.get_block_ids("r")[0] == N and first.ref_cnt == 0
    assert isinstance(mamba, MambaManager) and mamba.take_state_copies() == []


@pytest.mark.parametrize(
    ("computed", "new", "prefill_end", "block", "budget", "scheduled"),
    [
        (0, 10, 20, 4, 16, 8),  # a non-final chunk ends on a block boundary
        (16, 4, 20, 4, 16, 4),  # the chunk reaching the prefill's end is not cut
        (20, 1, 20, 4, 16, 1),  # decode is not cut
        (8, 3, 20, 4, 16, 0),  # no whole block fits: wait for a step with more budget
        (0, 10, 100, 64, 10, 10),  # a block wider than any step advances part-way
        (12, 8, 20, 4, 16, 4),  # the last chunk stops at the checkpoint (16): a hit's end
        (0, 21, 21, 4, 32, 20),  # a prompt of 21: the checkpoint is at 20
        (0, 3, 3, 1, 4, 2),  # docs/FINDINGS.md G4: 1-token blocks, a prompt of 3
        (0, 1, 1, 4, 4, 1),  # a one-token prompt: the checkpoint is at 0, nothing to stop
        (6, 4, 10, 8, 6, 2),  # a wide block's last part-block chunk stops at 8 too
        (1, 4, 5, 2, 1, 1),  # from mid-block (1), the next boundary (2) stops it
        (3, 8, 20, 4, 16, 1),  # a cut chunk from mid-block: its boundary cut ends it at 4
    ],
)
def test_mamba_block_aligned_split(
    computed: int, new: int, prefill_end: int, block: int, budget: int, scheduled: int
) -> None:
    """num_tokens is prefill_end here: a prompt in its prefill (a resumed request is the
    next test's)."""
    split = mamba_block_aligned_split(computed, new, prefill_end, prefill_end, block, budget)
    assert split == scheduled


@pytest.mark.parametrize(
    ("computed", "new", "num_tokens", "scheduled"),
    [
        (0, 13, 13, 12),  # 12 tokens and an output: prefill ends at 12, checkpoint at 12
        (0, 9, 9, 8),  # 8 prompt tokens and an output: the checkpoint is at 8
        (8, 5, 13, 4),  # from a hit at 8: the chunk stops at 12
    ],
)
def test_mamba_checkpoint_stop_of_a_resumed_request(
    computed: int, new: int, num_tokens: int, scheduled: int
) -> None:
    """A resumed request replays its outputs (prefill_end = num_tokens - 1): the checkpoint
    is the last boundary at or before its last token, and the chunk that reaches the
    prefill's end runs to it, not past it (4-token blocks, a budget of 16)."""
    split = mamba_block_aligned_split(computed, new, num_tokens - 1, num_tokens, 4, 16)
    assert split == scheduled


@pytest.mark.parametrize(
    ("new", "block", "scheduled"),
    [
        (3, 2, 3),  # 3 tokens, 2-token blocks: the checkpoint backs off to 0, no stop
        (16, 4, 12),  # 16 tokens: the checkpoint is one block before 16
        (13, 4, 8),  # 13 tokens: one block before 12
    ],
)
def test_mamba_checkpoint_stop_under_eagles_block_drop(
    new: int, block: int, scheduled: int
) -> None:
    """vLLM drops a hit's last block for an EAGLE drafter without prefix caching
    (use_eagle_block_drop), so the checkpoint backs off a block (a whole prompt from 0,
    budget 32)."""
    assert mamba_block_aligned_split(0, new, new, new, block, 32, True) == scheduled


# -- preemption and finishing ---------------------------------------------------------


@pytest.mark.parametrize("finished", [False, True])
def test_free_releases_every_group_and_keeps_hashes_only_for_a_preempted_request(
    finished: bool,
) -> None:
    kv = coordinator(FULL, WINDOW, MAMBA)
    request = prompt(16)
    kv.allocate_slots(request, 12)
    assert kv.block_pool.get_num_free_blocks() < 24
    request.status = RequestStatus.FINISHED_ABORTED if finished else RequestStatus.PREEMPTED
    kv.free(request)
    assert kv.block_pool.get_num_free_blocks() == 24
    assert kv.get_block_ids("r") == ((), (), ())
    assert ("r" in kv._block_hashes) is not finished
