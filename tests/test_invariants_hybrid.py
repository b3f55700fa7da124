"""The hybrid KV cache invariants both ways (docs/SPEC.md, "Hybrid KV cache groups"): each
holds on a real transition of the reference over hybrid groups, and fires on the same
transition corrupted the way a bug would corrupt it; and the scope that keeps the single
group's table arithmetic off hybrid configs."""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.spec import State
from schedspec.spec.invariants import CATALOGUE, ScheduleTransition, ids_for
from schedspec.spec.invariants.vllm.hybrid_alloc import (
    gained_blocks,
    group_new_blocks,
    group_table_length,
)
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
)
from tests.hybrid_helpers import hybrid_driver
from tests.invariant_builders import (
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    check,
    tokens,
    with_block_hash,
    with_config,
    with_kv,
    with_output,
    with_request,
    with_scheduled,
)

N = NULL_BLOCK_ID
FULL = FullAttentionGroup(block_size=4)
WINDOW = SlidingWindowGroup(block_size=4, sliding_window=5)  # frees a block every 4 tokens
MAMBA = MambaGroup(block_size=4, mamba_cache_mode="align")
WIDE_MAMBA = MambaGroup(block_size=8, mamba_cache_mode="align")

cases = CaseRegistry()


def window_slid() -> ScheduleTransition:
    """A 16-token prompt in chunks of 8, then its first decode: when the decode is
    allocated, 16 tokens are processed and the window (5 tokens) reads from token 12 on,
    so window blocks 0..2 are nulls."""
    d = hybrid_driver(FULL, WINDOW)
    d.add("r", 16, max_tokens=4)
    d.steps(2)
    return d.schedule()


def with_tables(state: State, rid: str, *tables: tuple[int, ...]) -> State:
    flat = tuple(b for table in tables for b in table if b != N)
    return with_request(state, rid, group_block_ids=tables, block_ids=flat)


@cases("HYBRID-TABLES")
def case_block_in_two_groups() -> Case:
    """vLLM #33775's result: one group's new block is the block another group holds."""
    state = window_slid().post
    full, window = state.requests["r"].group_block_ids
    shared = (*window[:-1], full[0])
    return Case(
        "HYBRID-TABLES",
        state,
        with_tables(state, "r", full, shared),
        "a block sits twice among the request's tables",
        "r",
        full[0],
        expected=1,
        actual=2,
    )


@cases("HYBRID-TABLES")
def case_flat_ids_out_of_group_order() -> Case:
    state = window_slid().post
    request = state.requests["r"]
    full, window = request.group_block_ids
    flat = tuple(b for b in window + full if b != N)
    return Case(
        "HYBRID-TABLES",
        state,
        with_request(state, "r", block_ids=flat),
        "block_ids are not the tables' non-null blocks in group order",
        "r",
        actual=flat,
    )


@cases("NULL-BLOCK")
def case_null_block_handed_out() -> Case:
    d = hybrid_driver(FULL, WINDOW)
    d.add("a", 8, max_tokens=2)
    admitted = d.schedule()
    new = admitted.output.scheduled_new_reqs[0]
    bad_new = new._replace(block_ids=(*new.block_ids, N))
    return Case(
        "NULL-BLOCK",
        admitted,
        with_output(admitted, scheduled_new_reqs=(bad_new,)),
        "the null block handed out to a new request",
        "a",
        N,
        actual=bad_new.block_ids,
    )


@cases("NULL-BLOCK")
def case_null_block_freed() -> Case:
    t = window_slid()
    free = (*t.post.kv.free_block_ids, N)
    return Case(
        "NULL-BLOCK",
        t,
        dataclasses.replace(t, post=with_kv(t.post, free_block_ids=free)),
        "the null block freed into the free queue",
        None,
        N,
    )


@cases("WINDOW-FREED")
def case_window_block_kept_past_processing() -> Case:
    t = window_slid()
    full, window = t.post.requests["r"].group_block_ids
    assert window[:3] == (N, N, N) and N not in window[3:]
    kept = (31, *window[1:])  # block 31: free, never held
    bad = with_tables(t.post, "r", full, kept)
    return Case(
        "WINDOW-FREED",
        t,
        dataclasses.replace(t, post=bad),
        "a block wholly before the window kept past processing",
        "r",
        31,
        expected=N,
        actual=31,
    )


@cases("WINDOW-FREED")
def case_window_block_dropped_inside_it() -> Case:
    t = window_slid()
    full, window = t.post.requests["r"].group_block_ids
    dropped = (*window[:3], N, *window[4:])
    return Case(
        "WINDOW-FREED",
        t,
        dataclasses.replace(t, post=with_tables(t.post, "r", full, dropped)),
        "a block inside the window dropped",
        "r",
        expected="a block",
        actual=N,
    )


@cases("HYBRID-COVER")
def case_one_group_not_allocated() -> Case:
    """All or nothing across groups: the full group got its slots, the window did not."""
    t = window_slid()
    full, window = t.post.requests["r"].group_block_ids
    short = window[:-1]
    return Case(
        "HYBRID-COVER",
        t,
        dataclasses.replace(t, post=with_tables(t.post, "r", full, short)),
        "group 1 does not cover 17 tokens",
        "r",
        expected=5,
        actual=4,
    )


def mamba_hit() -> ScheduleTransition:
    """B shares A's first 8 tokens: after A ran, B hits 8 tokens in both groups (the
    full group's two blocks, Mamba's state after 8)."""
    d = hybrid_driver(FULL, MAMBA)
    d.add("A", prompt=tokens(1, 10), max_tokens=1)
    d.steps(2)
    d.add("B", prompt=(*tokens(1, 8), 50, 51, 52), max_tokens=1)
    t = d.schedule()
    assert t.computed_before["B"] == 8
    return t


@cases("HYBRID-HIT")
def case_hit_not_backed_by_a_group() -> Case:
    """vLLM #46453: the hit is longer than Mamba's own: its state at the hit's end is
    another block (the one after 4 tokens would be)."""
    t = mamba_hit()
    full, mamba = t.post.requests["B"].group_block_ids
    other = next(b for b in range(t.post.kv.num_blocks) if b not in t.post.requests["B"].block_ids)
    wrong = (mamba[0], other, *mamba[2:])
    return Case(
        "HYBRID-HIT",
        t,
        dataclasses.replace(t, post=with_tables(t.post, "B", full, wrong)),
        "group 1, index 1: the hit of 8 tokens is not backed",
        "B",
        other,
    )


@cases("HYBRID-HIT-LONGEST")
def case_hit_shorter_than_every_group_allowed() -> Case:
    """Both groups cached B's first 8 tokens (the full group's blocks 0 and 1, Mamba's
    state after 8): a lookup that stops at 4 misses a block it could have had."""
    t = mamba_hit()
    (new,) = t.output.scheduled_new_reqs
    short = new._replace(num_computed_tokens=4)
    return Case(
        "HYBRID-HIT-LONGEST",
        t,
        with_output(t, scheduled_new_reqs=(short,)),
        "prefix hit shorter than every group's cache allowed",
        "B",
        expected=8,
        actual=4,
    )


def test_a_one_token_window_allows_no_hit_where_it_cached_nothing() -> None:
    """HYBRID-HIT-LONGEST's window hit needs one cached window block even where the window
    reads none before a boundary: a 1-token window caches no block, so r1 (r0's prompt and
    one token more) hits nothing, though full attention cached r0's block. Shrunk from the
    hybrid-short-window regime, which the restatement once judged a 2-token hit."""
    d = hybrid_driver(
        FullAttentionGroup(block_size=2),
        SlidingWindowGroup(block_size=1, sliding_window=1),
        block_size=2,
        num_blocks=9,
        max_model_len=4,
        max_num_seqs=1,
        max_num_batched_tokens=4,
    )
    d.add("r0", prompt=(0, 0), max_tokens=1)
    d.add("r1", prompt=(0, 0, 0), max_tokens=1)
    d.step()
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"r1": 3}  # no hit: all 3 computed
    assert check("HYBRID-HIT-LONGEST", t) == []


@cases("HYBRID-ADMISSION-STOP")
def case_head_waits_though_its_capped_blocks_fit() -> Case:
    """docs/FINDINGS.md G5's shape: full attention beside a 2-token window, 1-token
    blocks, 16 blocks, a budget of 3. r0 holds 4 blocks; r1's 7 tokens need 7 full blocks
    and, at the window's cap (1 window token + 3 in flight, one more block), 5 window
    blocks: 12 of the 12 free, plus the 1-block watermark, so it waits. With no watermark
    it fits, and waiting then has no reason (counting every window block, 14, it would
    not fit)."""
    d = hybrid_driver(
        FullAttentionGroup(block_size=1),
        SlidingWindowGroup(block_size=1, sliding_window=2),
        block_size=1,
        num_blocks=16,
        max_model_len=8,
        max_num_seqs=2,
        max_num_batched_tokens=3,
        enable_prefix_caching=False,
        watermark=0.1,
    )
    d.add("r0", 2, max_tokens=4)
    d.add("r1", 7, max_tokens=1)
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"r0": 2}
    assert len(t.post.kv.free_block_ids) == 12 and t.post.config.watermark_blocks == 1
    no_watermark = dataclasses.replace(
        t, pre=with_config(t.pre, watermark=0.0), post=with_config(t.post, watermark=0.0)
    )
    return Case(
        "HYBRID-ADMISSION-STOP",
        t,
        no_watermark,
        "queue head could have been admitted (12 blocks + 0 spare <= 12 free, 1 tokens left)",
        "r1",
        expected="admitted",
        actual="waiting",
    )


@cases("HYBRID-ALLOC-EXACT")
def case_window_table_grows_past_its_slots() -> Case:
    """r's first decode: 17 slots, 5 blocks of 4 in each group (the window nulls the
    blocks behind it in place). A sixth window entry is a block vLLM does not allocate."""
    t = window_slid()
    full, window = t.post.requests["r"].group_block_ids
    assert window == (N, N, N, 7, 9)  # blocks 3 and 6 freed in place, 9 new
    spare = t.post.kv.free_block_ids[0]
    return Case(
        "HYBRID-ALLOC-EXACT",
        t,
        dataclasses.replace(t, post=with_tables(t.post, "r", full, (*window, spare))),
        "group 1: table after 1 tokens from 16 computed (held 4 entries)",
        "r",
        expected=5,
        actual=6,
    )


@cases("HYBRID-ALLOC-EXACT")
def case_full_attention_drops_a_held_block() -> Case:
    """A window may put the null block where it held one; full attention reads every
    block and keeps them all."""
    t = window_slid()
    full, window = t.post.requests["r"].group_block_ids
    dropped = (full[0], N, *full[2:])
    return Case(
        "HYBRID-ALLOC-EXACT",
        t,
        dataclasses.replace(t, post=with_tables(t.post, "r", dropped, window)),
        "group 0, index 1: a held entry replaced",
        "r",
        full[1],
        expected=full[1],
        actual=N,
    )


@cases("HYBRID-ALLOC-EXACT")
def case_mamba_admission_gains_a_block_among_its_nulls() -> Case:
    """An 8-token chunk of a 16-token prompt: Mamba (4-token blocks, align) holds the
    state after 8 at index 1 and the null block before it. A block at index 0 too is a
    second state the allocation never takes (one a step, plus the scratch states)."""
    d = hybrid_driver(FULL, MAMBA)
    d.add("r", 16, max_tokens=2)
    t = d.schedule()
    full, mamba = t.post.requests["r"].group_block_ids
    assert mamba == (N, 2)
    extra = (t.post.kv.free_block_ids[0], 2)
    return Case(
        "HYBRID-ALLOC-EXACT",
        t,
        dataclasses.replace(t, post=with_tables(t.post, "r", full, extra)),
        "group 1: blocks gained after 8 tokens from 0 computed (admitted)",
        "r",
        expected=1,
        actual=2,
    )


@cases("HYBRID-ALLOC-EXACT")
def case_waiting_request_gets_a_table() -> Case:
    """One seat: b waits, and holds nothing after the step."""
    d = hybrid_driver(FULL, WINDOW, max_num_seqs=1)
    d.add("a", 8, max_tokens=2)
    d.add("b", 8, max_tokens=2)
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"a": 8}
    spare = t.post.kv.free_block_ids[0]
    return Case(
        "HYBRID-ALLOC-EXACT",
        t,
        dataclasses.replace(t, post=with_tables(t.post, "b", (spare,), ())),
        "tables changed without a step",
        "b",
        expected=((), ()),
        actual=((spare,), ()),
    )


@cases("FREE-ORDER-ABORT")
def case_hybrid_groups_freed_out_of_order() -> Case:
    """An aborted hybrid request frees group by group, in group order, each tail first
    (all uncached here: each group's blocks go to the front in turn, the window's ahead
    of full attention's). Freed last group first, full attention's would lead."""
    d = hybrid_driver(FULL, WINDOW, enable_prefix_caching=False)
    d.add("r", 16, max_tokens=4)
    d.steps(2)
    t = d.abort("r")
    full, window = t.pre.requests["r"].group_block_ids
    window_blocks = tuple(b for b in window if b != N)
    rest = t.pre.kv.free_block_ids
    assert tuple(t.post.kv.free_block_ids) == (*window_blocks[::-1], *full[::-1], *rest)
    reversed_groups = (*full[::-1], *window_blocks[::-1], *rest)
    return Case(
        "FREE-ORDER-ABORT",
        t,
        dataclasses.replace(t, post=with_kv(t.post, free_block_ids=reversed_groups)),
        "free queue after freeing ['r']",
        actual=list(reversed_groups),
    )


@cases("WINDOW-CACHE-REACHABLE")
def case_window_block_no_hit_reaches_cached() -> Case:
    """A 1-token window reads no block before a boundary, so no hit needs any of its
    blocks: none is cached (docs/FINDINGS.md G6). Registered anyway, the block would be
    freed to the back of the queue and kept as a hit nobody can use."""
    d = hybrid_driver(FULL, SlidingWindowGroup(block_size=4, sliding_window=1))
    d.add("r", 12, max_tokens=4)
    d.steps(2)
    state = d.schedule().post
    full, window = state.requests["r"].group_block_ids
    assert all(state.kv.block_hashes[b] is not None for b in full[:3])  # full blocks cached
    block = window[-1]
    assert block != N and state.kv.block_hashes[block] is None
    cached = with_kv(state, block_hashes=with_block_hash(state.kv, block, 12345))
    return Case(
        "WINDOW-CACHE-REACHABLE",
        state,
        cached,
        "cached, but no aligned hit reads it",
        "r",
        block,
        expected="uncached",
        actual="cached",
    )


@cases("EXCLUSIVE")
def case_hybrid_block_shared_at_another_place() -> Case:
    """B hits A's first two full-attention blocks while A runs: shared at the same places
    of the same group. Swapped in B's table, they are shared at different places."""
    d = hybrid_driver(FULL, MAMBA)
    d.add("A", prompt=tokens(1, 10), max_tokens=20)
    d.steps(2)
    d.add("B", prompt=(*tokens(1, 8), 50, 51, 52), max_tokens=1)
    state = d.schedule().post
    full_a = state.requests["A"].group_block_ids[0]
    full_b, mamba_b = state.requests["B"].group_block_ids
    assert full_b[:2] == full_a[:2]
    swapped = (full_b[1], full_b[0], *full_b[2:])
    return Case(
        "EXCLUSIVE",
        state,
        with_tables(state, "B", swapped, mamba_b),
        "shared at different positions",
        None,
        full_a[0],
        expected="one position",
        actual=[(0, 0), (0, 1)],
    )


@cases("MAMBA-SPLIT")
def case_chunk_ends_between_mamba_states() -> Case:
    """vLLM #55600 and #54076: a chunk cut at the full group's block size (4) ends
    between two Mamba states (8 tokens apart)."""
    d = hybrid_driver(FULL, WIDE_MAMBA, block_size=8, max_num_batched_tokens=12)
    d.add("r", 20, max_tokens=2)
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"r": 8}  # 12 cut to the boundary at 8
    return Case(
        "MAMBA-SPLIT",
        t,
        dataclasses.replace(
            t, output=dataclasses.replace(t.output, num_scheduled_tokens={"r": 12})
        ),
        "ends off a Mamba block boundary",
        "r",
        expected=8,
        actual=12,
    )


def g4_checkpoint_stop() -> ScheduleTransition:
    """docs/FINDINGS.md G4's shape: 1-token blocks, full attention, a 2-token window and
    Mamba in align mode, a 3-token prompt and a budget of 4. A hit on the prompt reaches
    token 2 at most, so the chunk stops there for its state to be written."""
    d = hybrid_driver(
        FullAttentionGroup(block_size=1),
        SlidingWindowGroup(block_size=1, sliding_window=2),
        MambaGroup(block_size=1, mamba_cache_mode="align"),
        block_size=1,
        num_blocks=11,
        max_model_len=4,
        max_num_seqs=1,
        max_num_batched_tokens=4,
    )
    d.add("r", 3, max_tokens=1)
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"r": 2}
    return t


@cases("MAMBA-SPLIT")
def case_prefill_chunk_runs_past_the_checkpoint() -> Case:
    """The reference before G4 was closed: the whole 3-token prompt in one chunk, so no
    state is written at token 2, where a later hit on the same prompt resumes."""
    t = g4_checkpoint_stop()
    return Case(
        "MAMBA-SPLIT",
        t,
        dataclasses.replace(t, output=dataclasses.replace(t.output, num_scheduled_tokens={"r": 3})),
        "runs past the checkpoint at 2",
        "r",
        expected=2,
        actual=3,
    )


@cases("MAMBA-SPLIT")
def case_prefill_chunk_from_mid_block_runs_past_the_next_boundary() -> Case:
    """A 20-token prompt with Mamba's 8-token blocks wider than a step (budget 4): the
    first chunk advances to 4, mid-block; the next stops at the boundary at 8, not 12."""
    d = hybrid_driver(FULL, WIDE_MAMBA, block_size=8, max_num_batched_tokens=4)
    d.add("r", 20, max_tokens=2)
    d.steps(1)
    t = d.schedule()
    assert t.computed_before == {"r": 4} and t.output.num_scheduled_tokens == {"r": 4}
    return Case(
        "MAMBA-SPLIT",
        t,
        dataclasses.replace(t, output=dataclasses.replace(t.output, num_scheduled_tokens={"r": 8})),
        "mid-block, runs past the next Mamba block boundary at 8",
        "r",
        expected=8,
        actual=12,
    )


@cases("MAMBA-SPLIT")
def case_prefill_chunk_runs_past_the_checkpoint_under_eagles_block_drop() -> Case:
    """An EAGLE-style drafter without prefix caching: vLLM drops a hit's last block, so a
    13-token prompt's checkpoint is 8 (one block before 12), and its chunk stops there;
    one that ran to the boundary at 12 would skip the state a hit resumes from."""
    d = hybrid_driver(
        FULL,
        MambaGroup(block_size=4, mamba_cache_mode="align", num_speculative_blocks=1),
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        num_speculative_tokens=1,
        num_lookahead_tokens=1,
        pad_spec_decode=True,
    )
    d.add("r", 13, max_tokens=2)
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"r": 8}
    return Case(
        "MAMBA-SPLIT",
        t,
        dataclasses.replace(
            t, output=dataclasses.replace(t.output, num_scheduled_tokens={"r": 12})
        ),
        "runs past the checkpoint at 8",
        "r",
        expected=8,
        actual=12,
    )


def junction_admission() -> tuple[Driver, ScheduleTransition]:
    """docs/FINDINGS.md G7's shape at 4-token blocks: A's 13 tokens ran in chunks of 12
    (its checkpoint) and 1, so Mamba holds a state after 12 only, and full attention every
    block. B shares A's first 8 tokens: full attention alone hits 8, Mamba 0, so the
    reconciled hit is 0, the junction 8, and B's chunk stops there (not at 12)."""
    d = hybrid_driver(FULL, MAMBA, max_num_batched_tokens=16)
    d.add("A", prompt=tokens(1, 13), max_tokens=1)
    d.steps(2)
    d.add("B", prompt=(*tokens(1, 8), 50, 51, 52, 53, 54), max_tokens=1)
    t = d.schedule()
    assert t.computed_before == {"B": 0} and t.output.num_scheduled_tokens == {"B": 8}
    assert t.post.requests["B"].shared_prefix_boundary == 8
    return d, t


@cases("MAMBA-SPLIT")
def case_prefill_chunk_runs_past_the_junction() -> Case:
    """The reference before G7 was closed: B's chunk runs on to its checkpoint, 12, so no
    state is written at 8, the prefix B shares with A."""
    _, t = junction_admission()
    return Case(
        "MAMBA-SPLIT",
        t,
        with_scheduled(t, {"B": 12}),
        "runs past the shared-prefix junction at 8",
        "B",
        expected=8,
        actual=12,
    )


@cases("SHARED-PREFIX-JUNCTION")
def case_junction_not_recorded_at_admission() -> Case:
    """B's lookup saw full attention alone hit 8 and the reconciled hit 0: a junction of
    0 forgets the shared prefix."""
    _, t = junction_admission()
    bad = with_request(t.post, "B", shared_prefix_boundary=0)
    return Case(
        "SHARED-PREFIX-JUNCTION",
        t,
        dataclasses.replace(t, post=bad),
        "junction recorded at admission",
        "B",
        expected="a hit in [8, 8]",
        actual=0,
    )


@cases("SHARED-PREFIX-JUNCTION")
def case_junction_where_every_group_hit_as_far() -> Case:
    """Both groups hit B's first 8 tokens (mamba_hit): no group alone hit further, so the
    junction is 0; 12 is a hit no group had."""
    t = mamba_hit()
    bad = with_request(t.post, "B", shared_prefix_boundary=12)
    return Case(
        "SHARED-PREFIX-JUNCTION",
        t,
        dataclasses.replace(t, post=bad),
        "junction recorded at admission",
        "B",
        expected="0",
        actual=12,
    )


@cases("SHARED-PREFIX-JUNCTION")
def case_running_junction_changed() -> Case:
    """B runs on from 8 and keeps the junction its admission recorded: only a lookup sets
    one, and a running request makes none."""
    d, first = junction_admission()
    d.update(first)
    t = d.schedule()
    assert t.pre.requests["B"].shared_prefix_boundary == 8 and "B" in t.pre.running
    bad = with_request(t.post, "B", shared_prefix_boundary=0)
    return Case(
        "SHARED-PREFIX-JUNCTION",
        t,
        dataclasses.replace(t, post=bad),
        "a running request's junction changed",
        "B",
        expected=8,
        actual=0,
    )


@cases("MAMBA-HIT-WRITTEN")
def case_hit_on_a_state_registered_in_the_step() -> Case:
    """B hits A's Mamba state after 8 (mamba_hit), registered in an earlier step. Had it
    been registered in this step (no hash before it), its state would not be written yet
    when B reads it."""
    t = mamba_hit()
    state = t.post.requests["B"].group_block_ids[1][1]
    hashes = list(t.pre.kv.block_hashes)
    hashes[state] = None
    bad = dataclasses.replace(t.pre, kv=dataclasses.replace(t.pre.kv, block_hashes=tuple(hashes)))
    return Case(
        "MAMBA-HIT-WRITTEN",
        t,
        dataclasses.replace(t, pre=bad),
        "registered in this step",
        "B",
        block_id=state,
        expected="a state cached before the step",
        actual=state,
    )


@pytest.mark.parametrize("build", cases.params())
def test_hybrid_invariant_holds_on_the_real_transition(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_hybrid_invariant_fires_on_the_corrupted_transition(build: CaseBuilder) -> None:
    assert_caught(build())


def test_every_hybrid_invariant_has_a_case() -> None:
    hybrid = {i for i, info in CATALOGUE.items() if info.groups == "hybrid"}
    assert hybrid <= cases.ids()


def test_single_group_invariants_are_not_checked_on_a_hybrid_config() -> None:
    """KV-COVER reads block_ids at config.block_size, which a hybrid request's flat ids do
    not follow: a hybrid run checks HYBRID-COVER instead, and a single-group run only
    KV-COVER."""
    single = ids_for("schedule", "vllm-v1")
    hybrid = ids_for("schedule", "vllm-v1", hybrid=True)
    assert "KV-COVER" in single and "KV-COVER" not in hybrid
    assert "HYBRID-COVER" in hybrid and "HYBRID-COVER" not in single
    assert "BUDGET" in single and "BUDGET" in hybrid


@pytest.mark.parametrize(
    ("group", "held", "computed", "new", "length"),
    [
        (FULL, 4, 16, 1, 5),  # 17 slots
        (WINDOW, 4, 16, 1, 5),  # a window's table is as long (nulls in place)
        (FULL, 6, 16, 1, 6),  # rejected drafts left it longer: it stays
        (MambaGroup(block_size=4, mamba_cache_mode="none", num_speculative_blocks=2), 0, 0, 5, 4),
        (MambaGroup(block_size=4, mamba_cache_mode="align", num_speculative_blocks=2), 0, 0, 5, 4),
    ],
)
def test_group_table_length(
    group: KVCacheGroupSpec, held: int, computed: int, new: int, length: int
) -> None:
    """One lookahead slot: attention and Mamba "none" count it, Mamba "align" does not
    (2 blocks for 5 tokens, 3 with the slot, plus 2 scratch states)."""
    config = hybrid_driver(FULL, WINDOW, num_speculative_tokens=1, num_lookahead_tokens=1).config
    assert group_table_length(config, group, held, computed, new) == length


@pytest.mark.parametrize(
    ("group", "held", "length", "admitted", "hit", "gained"),
    [
        (FULL, 4, 5, False, 0, 1),
        (WINDOW, 0, 4, True, 12, 2),  # a 12-token hit: the 5-token window skips 2 blocks
        (MAMBA, 2, 3, False, 0, 1),  # one state block a step
        (MAMBA, 3, 3, False, 0, 0),
        (
            MambaGroup(block_size=4, mamba_cache_mode="align", num_speculative_blocks=2),
            0,
            6,
            True,
            8,
            4,
        ),
    ],
)
def test_group_new_blocks(
    group: KVCacheGroupSpec, held: int, length: int, admitted: bool, hit: int, gained: int
) -> None:
    assert group_new_blocks(group, held, length, admitted, hit) == gained


def test_a_block_freed_and_taken_back_in_one_step_counts_as_gained() -> None:
    """By position: a window that freed block 3 and took it back at its tail gained it;
    Mamba's scratch states moved behind the new state are not gained."""
    assert gained_blocks(WINDOW, (3, 6, 7), (N, 6, 7, 3)) == 1
    mamba = MambaGroup(block_size=4, mamba_cache_mode="align", num_speculative_blocks=1)
    assert gained_blocks(mamba, (N, 2, 5), (N, 2, N, 5, 9)) == 1
