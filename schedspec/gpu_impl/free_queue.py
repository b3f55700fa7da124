"""The free-block queue's front, found without an order statistic over every block.

The queue is the free blocks ordered by `free_key` (batch_state.py): a block
freed without cached content gets a key below every other (`free_front`
counts down), one freed with content a key above every other (`free_back`
counts up); a held block's key is BIG. Finding the c smallest keys by a topk
over each instance's N keys costs the whole pool per call, though most calls
take one or two blocks per instance.

`free_ring` [B, R] (R a power of two, at least 2N) indexes the keys: the block
given key k is written at k mod R. Every free block's key lies in
[free_front, free_back), a span kept at most R wide, so no two free blocks
share a ring entry. An entry is live while its block's key still equals the
key it was written under: keys are never handed out twice, so a stale entry
never passes. Stale entries are holes: a block taken from the queue's middle
(a prefix-cache hit on a free block, admission.py) only has its key set to
BIG, and its entry stays behind.

Taking c blocks reads the c ring entries from free_front on, packed (one
per block taken); where they are all live, those are the blocks, and
free_front moves up by c. Otherwise (a hole among them) a window as wide as
the largest c is read (twice as wide, and again, while holes leave some
instance short), the first c live entries in key order are taken and
free_front moves just past the last one. Before freed blocks would stretch
an instance's span past R, its free blocks are renumbered 0, 1, ... in
queue order (a sort of that instance's keys; it takes about R - N holes or
taken blocks between renumberings).
"""

from __future__ import annotations

import torch

from schedspec.gpu_impl.batch_state import BIG, BatchState
from schedspec.gpu_impl.flat_index import flat_rows, pick, selected, write_rows


def pop_front(
    state: BatchState, inst: torch.Tensor, need: torch.Tensor, owner: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Take need[i] blocks from the front of instance inst[i]'s queue (inst distinct;
    owner [E] names each block taken by its instance's position in inst, grouped in
    inst order): the blocks and their flat positions (inst * N + block in the [B, N]
    block tensors), both [E] in (instance, queue) order. They leave the queue (key
    BIG, num_free); the caller has checked that each instance has need[i] free
    blocks. One host read (whether the front held a hole)."""
    entry = torch.arange(owner.numel(), device=owner.device)
    # Entry e takes the key free_front + (its position among its instance's entries).
    first = torch.cumsum(need, dim=0) - need
    keys = (state.free_front.index_select(0, inst) - first).index_select(0, owner) + entry
    rows = inst.index_select(0, owner)
    blocks = _ring_read(state, rows, keys)
    block_index = flat_rows(state.free_key, rows, blocks)
    if torch.equal(pick(state.free_key, block_index), keys):
        state.free_front.index_add_(0, inst, need)
    else:
        busy = selected(need > 0)
        blocks, block_index = _take_past_holes(
            state, inst.index_select(0, busy), need.index_select(0, busy), owner.numel()
        )
    write_rows(state.free_key, block_index, BIG)
    state.num_free.index_add_(0, inst, need, alpha=-1)
    return blocks, block_index


def _take_past_holes(
    state: BatchState, rows: torch.Tensor, need: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """pop_front's blocks where holes lie among the first need[k] keys of instance
    rows[k] (need >= 1, total = need.sum()): the first need[k] live entries from
    free_front on, and free_front just past the last of them."""
    ring = state.free_ring.shape[1]
    head = state.free_front.index_select(0, rows)
    width = min(int(need.max()), ring)
    while True:
        keys = head.unsqueeze(1) + torch.arange(width, device=rows.device)
        blocks = _ring_read(state, rows.unsqueeze(1), keys)
        block_index = flat_rows(state.free_key, rows.unsqueeze(1), blocks)
        live = pick(state.free_key, block_index.view(-1)).view(keys.shape) == keys
        rank = torch.cumsum(live, dim=1)
        at = selected(live & (rank <= need.unsqueeze(1)))
        if at.numel() == total:
            break
        if width == ring:
            raise RuntimeError("take_free_blocks: fewer free blocks than asked for")
        width = min(2 * width, ring)  # holes left some instance short
    # Every key before the last one taken is taken or a hole.
    write_rows(state.free_front, rows, head + (rank < need.unsqueeze(1)).sum(dim=1) + 1)
    return pick(blocks, at), pick(block_index, at)


def place(state: BatchState, rows: torch.Tensor, blocks: torch.Tensor, keys: torch.Tensor) -> None:
    """Give blocks [F] of instances rows [F] the queue keys `keys` (fresh ones, inside
    the span make_room left) and write them into the ring."""
    ring = state.free_ring.shape[1]
    write_rows(state.free_key, flat_rows(state.free_key, rows, blocks), keys)
    write_rows(state.free_ring, flat_rows(state.free_ring, rows, keys & (ring - 1)), blocks)


def make_room(
    state: BatchState, rows: torch.Tensor, front: torch.Tensor, back: torch.Tensor
) -> None:
    """Before front[k] keys are handed out below free_front and back[k] from free_back
    on (rows distinct): renumber the instances whose span would outgrow the ring."""
    span = state.free_back.index_select(0, rows) + back
    span -= state.free_front.index_select(0, rows) - front
    full = pick(rows, selected(span > state.free_ring.shape[1]))
    if full.numel() > 0:
        renumber(state, full)


def renumber(state: BatchState, rows: torch.Tensor) -> None:
    """Key the free blocks of instances rows 0, 1, ... in queue order (free_front 0,
    free_back their count) and write the ring afresh; the queue order is unchanged."""
    n = state.free_key.shape[1]
    keys = state.free_key.index_select(0, rows)
    order = torch.argsort(keys, dim=1)  # free blocks first, in queue order; held ones last
    count = state.num_free.index_select(0, rows)
    position = torch.arange(n, device=rows.device).expand_as(keys)
    keys.scatter_(1, order, torch.where(position < count.unsqueeze(1), position, BIG))
    state.free_key.index_copy_(0, rows, keys)
    ring = state.free_ring.index_select(0, rows)
    ring[:, :n] = order  # positions past the count name held blocks: stale entries
    state.free_ring.index_copy_(0, rows, ring)
    write_rows(state.free_front, rows, 0)
    write_rows(state.free_back, rows, count)


def ring_disagrees(state: BatchState) -> torch.Tensor:
    """[B] the free queue's ring part of CONSERVATION (taking blocks reads the ring, never
    the keys of every block): each free block's key lies in [free_front, free_back), a
    span the ring holds, and the ring names the block under its key."""
    n, ring = state.free_key.shape[1], state.free_ring.shape[1]
    free = state.free_key < BIG
    key = torch.where(free, state.free_key, state.free_front.unsqueeze(1))
    named = torch.gather(state.free_ring, 1, key & (ring - 1))
    misplaced = named != torch.arange(n, device=state.device)
    outside = (key < state.free_front.unsqueeze(1)) | (key >= state.free_back.unsqueeze(1))
    too_wide = state.free_back - state.free_front > ring
    return (free & (misplaced | outside)).any(dim=1) | too_wide


def _ring_read(state: BatchState, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The ring entries under keys of instances rows (broadcast to keys' shape)."""
    ring = state.free_ring.shape[1]
    index = flat_rows(state.free_ring, rows, keys & (ring - 1))
    return pick(state.free_ring, index.reshape(-1)).view(keys.shape)
