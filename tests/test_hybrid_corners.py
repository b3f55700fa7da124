"""The hybrid KV cache corners (properties/hybrid_corners.py), each reached on a worked
example of the reference and not on a step beside it that misses it; and the spec's
statements they and the invariants share (spec/kv_groups.py)."""

from __future__ import annotations

import pytest

from schedspec.properties.corners import count_schedule
from schedspec.spec.invariants import ScheduleTransition
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    group_block_hashes,
    mamba_aligned_new_tokens,
    mamba_checkpoint_position,
    num_skipped_tokens,
)
from tests.hybrid_helpers import hybrid_driver
from tests.invariant_builders import Driver, tokens

FULL = FullAttentionGroup(block_size=4)
WINDOW = SlidingWindowGroup(block_size=4, sliding_window=5)
MAMBA = MambaGroup(block_size=4, mamba_cache_mode="align")


def reached(t: ScheduleTransition) -> set[str]:
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    return set(counts)


def test_a_window_frees_a_block() -> None:
    d = hybrid_driver(FULL, WINDOW)
    d.add("r", 16, max_tokens=4)
    first = d.step()[0]  # tokens 0..7: nothing processed yet
    assert "window-frees-a-block" not in reached(first)
    second = d.step()[0]  # 8 processed: the window's block 0 goes
    assert "window-frees-a-block" in reached(second)


def test_a_hit_cut_by_the_lagging_window() -> None:
    """A ran its first 12 tokens in one chunk (its checkpoint: it ends at 16), so full
    attention cached blocks 0..2 and Mamba only the states after 12 and 16. B shares A's
    first 8 tokens: full attention alone would hit 8, but Mamba has no state at 8 or 4,
    so the hit is 0."""
    d = hybrid_driver(FULL, MAMBA, max_num_batched_tokens=12)
    d.add("A", prompt=tokens(1, 16), max_tokens=1)
    d.steps(2)  # A: 12 tokens in one chunk, states only at the chunks' ends, then 4
    d.add("B", prompt=(*tokens(1, 8), 50, 51, 52, 53, 54), max_tokens=1)
    t = d.schedule()
    # Full attention cached blocks 0 and 1 (8 tokens); Mamba only the states after 12, 16.
    assert t.computed_before["B"] == 0
    assert "hit-cut-by-lagging-group" in reached(t)
    plain = hybrid_driver(FULL, MAMBA)
    plain.add("C", 8, max_tokens=1)
    assert "hit-cut-by-lagging-group" not in reached(plain.schedule())


def test_a_mamba_aligned_split() -> None:
    d = hybrid_driver(FULL, MAMBA, max_num_batched_tokens=6)
    d.add("r", 16, max_tokens=2)
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"r": 4}  # cut from 6 to the boundary at 4
    assert "mamba-aligned-split" in reached(t)
    at_checkpoint = hybrid_driver(FULL, MAMBA, max_num_batched_tokens=16)
    at_checkpoint.add("r", 16, max_tokens=2)
    t = at_checkpoint.schedule()
    assert t.output.num_scheduled_tokens == {"r": 12}  # stopped at the checkpoint (G4)
    assert "mamba-aligned-split" in reached(t)
    whole = hybrid_driver(FULL, MAMBA, max_num_batched_tokens=16)
    whole.add("r", 4, max_tokens=2)  # one block: its checkpoint is at 0, its start
    assert "mamba-aligned-split" not in reached(whole.schedule())


def _eagle_driver(lookahead: int, budget: int = 32) -> Driver:
    """Full attention and Mamba at 4-token blocks, one draft with `lookahead` slots (1:
    an EAGLE-style drafter, 0: n-gram), no prefix caching, by default budget to spare."""
    return hybrid_driver(
        FULL,
        MambaGroup(block_size=4, mamba_cache_mode="align", num_speculative_blocks=1),
        max_num_batched_tokens=budget,
        enable_prefix_caching=False,
        num_speculative_tokens=1,
        num_lookahead_tokens=lookahead,
    )


@pytest.mark.parametrize(
    ("prompt", "eagle_scheduled", "plain_scheduled"),
    [
        (17, 12, 16),  # stopped one block before the plain checkpoint (16), budget left
        (6, 6, 4),  # the checkpoint backs off to 0: the prompt runs through 4
    ],
)
def test_the_mamba_checkpoint_backed_off_for_eagle(
    prompt: int, eagle_scheduled: int, plain_scheduled: int
) -> None:
    eagle = _eagle_driver(lookahead=1)
    eagle.add("r", prompt, max_tokens=2)
    t = eagle.schedule()
    assert t.output.num_scheduled_tokens == {"r": eagle_scheduled}
    assert "mamba-eagle-checkpoint-backoff" in reached(t)
    ngram = _eagle_driver(lookahead=0)  # no block drop: the plain checkpoint
    ngram.add("r", prompt, max_tokens=2)
    t = ngram.schedule()
    assert t.output.num_scheduled_tokens == {"r": plain_scheduled}
    assert "mamba-eagle-checkpoint-backoff" not in reached(t)


@pytest.mark.parametrize(
    ("prompt", "budget"),
    [
        (16, 32),  # 16 tokens: the plain checkpoint (before token 15) is 12, as the backed-off
        (17, 12),  # the budget ends the chunk at 12, the backed-off checkpoint, either way
    ],
)
def test_no_backoff_corner_where_the_backoff_changes_nothing(prompt: int, budget: int) -> None:
    eagle = _eagle_driver(lookahead=1, budget=budget)
    eagle.add("r", prompt, max_tokens=2)
    t = eagle.schedule()
    assert t.output.num_scheduled_tokens == {"r": 12}
    assert "mamba-eagle-checkpoint-backoff" not in reached(t)


def test_a_hybrid_preemption() -> None:
    d = hybrid_driver(FULL, WINDOW, num_blocks=10, max_model_len=16, max_num_batched_tokens=16)
    d.add("a", 8, max_tokens=8)
    d.step()
    d.add("b", 8, max_tokens=8)
    found = False
    for _ in range(10):
        t, _ = d.step()
        if t.output.preempted_req_ids:
            found = "hybrid-preemption" in reached(t)
            break
    assert found


@pytest.mark.parametrize(
    ("group", "computed", "skipped"),
    [
        (FULL, 30, 0),
        (SlidingWindowGroup(block_size=4, sliding_window=4), 7, 4),
        (ChunkedLocalGroup(block_size=4, attention_chunk_size=8), 13, 8),
        (MAMBA, 9, 8),
        (MAMBA, 0, 0),
    ],
)
def test_num_skipped_tokens_per_kind(group: KVCacheGroupSpec, computed: int, skipped: int) -> None:
    assert num_skipped_tokens(group, computed) == skipped


@pytest.mark.parametrize(
    ("start", "new", "prefill_end", "num_tokens", "size", "widest", "scheduled"),
    [
        (0, 6, 16, 16, 4, 6, 4),  # cut down to the boundary at 4
        (4, 3, 16, 16, 4, 3, 3),  # 4..7: no boundary past 4, and a block (4) wider than 3
        (4, 3, 16, 16, 4, 8, 0),  # the same with room for a block: wait for it
        (0, 16, 16, 16, 4, 16, 12),  # reaches the prefill's end: stops at the checkpoint
        (12, 4, 16, 16, 4, 16, 4),  # from the checkpoint on: not cut
        (0, 17, 17, 17, 4, 32, 16),  # 17 tokens: the checkpoint is the boundary at 16
        (0, 3, 3, 3, 1, 4, 2),  # docs/FINDINGS.md G4: 1-token blocks, a prompt of 3
        (0, 9, 8, 9, 4, 16, 8),  # resumed (8 prompt tokens, 1 output): stops at 8
        (16, 1, 16, 17, 4, 8, 1),  # decode: not cut
        (1, 4, 5, 5, 2, 1, 1),  # from mid-block (1): stops at the next boundary (2)
        (5, 3, 8, 8, 4, 2, 3),  # from mid-block (5) to the end (8): no boundary inside
    ],
)
def test_mamba_aligned_new_tokens(
    start: int, new: int, prefill_end: int, num_tokens: int, size: int, widest: int, scheduled: int
) -> None:
    split = mamba_aligned_new_tokens(start, new, prefill_end, num_tokens, size, widest, False)
    assert split == scheduled


@pytest.mark.parametrize(
    ("start", "new", "junction", "scheduled"),
    [
        (0, 6, 4, 4),  # docs/FINDINGS.md G7: 1-token blocks, the junction at 4, not 5
        (0, 6, 6, 5),  # a junction at the chunk's end is not inside it: the checkpoint
        (0, 6, 0, 5),  # no junction: the checkpoint
        (4, 2, 4, 1),  # a junction at the start is not inside it: the checkpoint
    ],
)
def test_mamba_aligned_new_tokens_stops_at_the_junction(
    start: int, new: int, junction: int, scheduled: int
) -> None:
    """A 6-token prompt in 1-token blocks (its checkpoint at 5)."""
    split = mamba_aligned_new_tokens(start, new, 6, 6, 1, 8, False, junction)
    assert split == scheduled


@pytest.mark.parametrize(
    ("start", "new", "junction", "scheduled"),
    [
        (0, 16, 11, 8),  # 4-token blocks: 11 floored to whole blocks from 0, 8
        (2, 14, 11, 2),  # from 2 (mid-block): the next boundary, 4, comes first
        (4, 12, 11, 4),  # from 4: floored to 8, 4 tokens
        (4, 12, 7, 12),  # from 4 a junction at 7 floors to 4, the start: no stop
        (0, 10, 12, 8),  # the boundary cut (10 to 8) comes before a junction at 12
    ],
)
def test_the_junction_is_floored_to_whole_blocks_from_the_chunks_start(
    start: int, new: int, junction: int, scheduled: int
) -> None:
    """A 20-token prompt in 4-token blocks (its checkpoint at 16)."""
    split = mamba_aligned_new_tokens(start, new, 20, 20, 4, 32, False, junction)
    assert split == scheduled


@pytest.mark.parametrize(
    ("start", "new", "num_tokens", "scheduled"),
    [
        (0, 3, 3, 3),  # 2-token blocks, 3 tokens: the checkpoint backs off to 0
        (0, 16, 16, 12),  # 4-token blocks, 16 tokens: one block before 16
        (0, 17, 17, 12),  # 17 tokens: one block before 16, too
    ],
)
def test_mamba_aligned_new_tokens_under_eagles_block_drop(
    start: int, new: int, num_tokens: int, scheduled: int
) -> None:
    size = 2 if num_tokens == 3 else 4
    split = mamba_aligned_new_tokens(start, new, num_tokens, num_tokens, size, 32, True)
    assert split == scheduled


@pytest.mark.parametrize(
    ("num_tokens", "size", "eagle", "position"),
    [
        (1, 4, False, 0),
        (4, 4, False, 0),
        (5, 4, False, 4),
        (16, 4, False, 12),
        (3, 1, False, 2),
        (16, 4, True, 12),  # EAGLE's block drop: one block before 16
        (17, 4, True, 12),
        (3, 2, True, 0),
        (1, 4, True, 0),
    ],
)
def test_mamba_checkpoint_position(num_tokens: int, size: int, eagle: bool, position: int) -> None:
    """The last boundary at or before the last token (a hit leaves that token to compute),
    or under EAGLE's block drop one block before the last boundary at or before the end."""
    assert mamba_checkpoint_position(num_tokens, size, eagle) == position


def test_group_block_hashes_differ_per_group_and_block_size() -> None:
    full, window, half = group_block_hashes(
        tokens(1, 8), (FULL, WINDOW, SlidingWindowGroup(block_size=2, sliding_window=3))
    )
    assert len(full) == len(window) == 2 and len(half) == 4
    assert not set(full) & set(window)  # one group's block is never another's hit
