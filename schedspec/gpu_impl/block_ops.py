"""The block pool's moves on tensors: take free blocks, register cached content, free tables.

Each function works on a set of instances `inst` ([I] indices, no repeats)
and, per instance, requests in an order ([I, R]: their flat rows in the
[B, S] tensors, padding asking for nothing; release_tables: a slot mask),
doing for all of them at once what the reference does one request at a time.
The free queue is a key per block (batch_state.py): taking blocks takes
the smallest keys (free_queue.py finds them), a block put at the front gets
a key below every other, one put at the back a key above.

Most requests move a block or two per call, so the blocks moved are laid
out packed (`_entries`: one entry per block, in instance, request, block
order) rather than padded to the widest request.
"""

from __future__ import annotations

import torch

from schedspec.gpu_impl import prefix_index
from schedspec.gpu_impl.batch_state import BIG, NO_BLOCK, NO_HASH, BatchState
from schedspec.gpu_impl.flat_index import flat_rows, pick, put_at, selected, take_at
from schedspec.gpu_impl.free_queue import make_room, place, pop_front


def _rows(inst: torch.Tensor, *shape: int) -> torch.Tensor:
    """inst broadcast to [I, *shape]."""
    return inst.view(-1, *([1] * len(shape))).expand(-1, *shape)


def _entries(
    counts: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """counts[i, r] entries for each (instance, request) pair, packed in that order: each
    entry's pair (flat, i * R + r), each entry's instance (i), each pair's first entry
    (so entry e is the (e - first[pair[e]])-th of its pair) and each instance's number
    of entries. One host read (the number of entries)."""
    flat = counts.reshape(-1)
    per_inst = counts.sum(dim=1)
    # Given the output size, repeat_interleave skips a pass that sums the repeats.
    size = int(per_inst.sum())
    pair = torch.repeat_interleave(flat, output_size=size)
    owner = torch.repeat_interleave(per_inst, output_size=size)
    return pair, owner, torch.cumsum(flat, dim=0) - flat, per_inst


def take_free_blocks(
    state: BatchState, inst: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor
) -> None:
    """Append counts[i, r] blocks from the front of the free queue to the table of the
    request at flat row rows[i, r] of the [B, S] tensors (`flat_rows`), request after
    request; a taken block loses any cached content (eviction). Padding pairs carry a
    count of 0 (their row may name any slot).

    The caller has checked that each instance has enough free blocks.
    """
    pair, owner, first, per_inst = _entries(counts)
    if pair.numel() == 0:
        return
    # The queue hands its blocks out in (instance, queue) order, the entries ask in
    # (instance, request, block) order: the two line up.
    blocks, block_index = pop_front(state, inst, per_inst, owner)
    row = rows.reshape(-1)
    held = state.num_held.view(-1).index_select(0, row)
    # Entry e lands after its request's held blocks and its pair's earlier entries.
    to_table = row * state.table.shape[2] + held - first
    table_index = to_table.index_select(0, pair) + torch.arange(pair.numel(), device=pair.device)
    state.table.view(-1).index_copy_(0, table_index, blocks)
    state.ref_cnt.view(-1).index_fill_(0, block_index, 1)
    prefix_index.forget(state, block_index)
    state.block_hash.view(-1).index_fill_(0, block_index, NO_HASH)
    # Padding pairs add 0 (wherever their clamped slot points).
    state.num_held.view(-1).index_add_(0, row, counts.reshape(-1))


def register_blocks(
    state: BatchState,
    inst: torch.Tensor,
    rows: torch.Tensor,
    upto: torch.Tensor,
    block_size: int,
) -> None:
    """cache_blocks: register the full blocks among the first upto[i, r] tokens of the
    request at flat row rows[i, r] of the [B, S] tensors in the prefix cache, request
    after request (registration order is the lookup's tie-break). Padding pairs carry
    upto 0 (their row may name any slot)."""
    row = rows.reshape(-1)
    num_cached = state.num_cached_block.view(-1).index_select(0, row)
    full = _full_blocks(upto, block_size).reshape(-1)
    counts = (full - num_cached).clamp(min=0)
    pair, owner, first, per_inst = _entries(counts.view(rows.shape))
    if pair.numel() == 0:
        return
    entry = torch.arange(pair.numel(), device=pair.device)
    to_table = row * state.table.shape[2] + num_cached - first
    table_index = to_table.index_select(0, pair) + entry
    blocks = state.table.view(-1).index_select(0, table_index)
    hashes = state.req_hash.view(-1).index_select(0, table_index)
    block_index = (inst * state.ref_cnt.shape[1]).index_select(0, owner) + blocks
    # Registration order: the instance's counter, then the instance's entries in order.
    inst_first = first.view(rows.shape)[:, 0]
    seq = (state.next_reg.index_select(0, inst) - inst_first).index_select(0, owner) + entry
    # A block registered here is in this request's table only (a shared block is a hit,
    # registered before): the entries name distinct blocks.
    state.block_hash.view(-1).index_copy_(0, block_index, hashes)
    state.reg_seq.view(-1).index_copy_(0, block_index, seq)
    prefix_index.insert(state, block_index)
    state.next_reg.index_add_(0, inst, per_inst)
    # Padding pairs and requests with nothing new add 0: num_cached + counts = full blocks.
    state.num_cached_block.view(-1).index_add_(0, row, counts)


def _full_blocks(tokens: torch.Tensor, block_size: int) -> torch.Tensor:
    """Full blocks among `tokens` tokens (>= 0): a shift for a power-of-two block size."""
    if block_size & (block_size - 1) == 0:
        return tokens >> (block_size.bit_length() - 1)
    return torch.div(tokens, block_size, rounding_mode="floor")


def uncache_uncomputed(
    state: BatchState, inst: torch.Tensor, slot: torch.Tensor, block_size: int
) -> None:
    """Take back registrations past each request's computed tokens (a priority victim
    unscheduled in the step that registered them never computes those blocks). One
    request per instance: the (inst, slot) pairs are distinct."""
    if inst.numel() == 0:
        return
    m = state.table.shape[2]
    keep = take_at(state.num_computed, inst, slot) // block_size
    num_cached = take_at(state.num_cached_block, inst, slot)
    j = torch.arange(m, device=inst.device)
    drop = selected((j >= keep.unsqueeze(1)) & (j < num_cached.unsqueeze(1)))
    rows = pick(_rows(inst, m), drop)
    block_index = rows * state.block_hash.shape[1] + pick(take_at(state.table, inst, slot), drop)
    prefix_index.forget(state, block_index)
    state.block_hash.view(-1).index_fill_(0, block_index, NO_HASH)
    put_at(state.num_cached_block, inst, slot, torch.minimum(num_cached, keep), keep >= 0)


def release_tables(
    state: BatchState, inst: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor
) -> None:
    """free(): drop the tables of the masked slots ([I, S]), one request after another
    in rank order, each tail first.

    A block nobody holds any more goes to the front of the free queue without
    cached content, to the back with it; the request that drops the last
    reference places it. Requests freed later put their front blocks ahead of
    earlier ones' and their back blocks behind. With the blocks packed in
    (instance, request in rank order, table position from the tail) order,
    the back of the queue is filled in that order and the front in that order
    with each instance's requests reversed: both are prefix sums, no sort.
    """
    per_row = mask.sum(dim=1)
    width = int(per_row.max()) if per_row.numel() else 0
    if width == 0:
        return
    busy = selected(per_row > 0)
    inst, mask, rank = (t.index_select(0, busy) for t in (inst, mask, rank))
    order = torch.argsort(torch.where(mask, rank, BIG), dim=1, stable=True)[:, :width]
    real = torch.gather(mask, 1, order)  # [I, W] the freed requests, in rank order
    row = flat_rows(state.num_held, inst.unsqueeze(1), order).view(-1)
    held = torch.where(real.view(-1), state.num_held.view(-1).index_select(0, row), 0)
    pair, owner, first, _ = _entries(held.view(real.shape))
    if pair.numel() > 0:
        entry = torch.arange(pair.numel(), device=pair.device)
        # Tail first: entry e reads its table at held - 1 - (e - first[pair[e]]).
        to_table = row * state.table.shape[2] + held - 1 + first
        blocks = state.table.view(-1).index_select(0, to_table.index_select(0, pair) - entry)
        block_index = (inst * state.ref_cnt.shape[1]).index_select(0, owner) + blocks
        last = _drop_references(state, block_index)
        hashed = state.block_hash.view(-1).index_select(0, block_index) != NO_HASH
        _enqueue(state, inst, (blocks, pair, owner), last & hashed, last & ~hashed, width)
    cleared = pick(row, selected(real))
    state.table.view(-1, state.table.shape[2]).index_fill_(0, cleared, NO_BLOCK)
    state.num_held.view(-1).index_fill_(0, cleared, 0)
    state.num_cached_block.view(-1).index_fill_(0, cleared, 0)


def _drop_references(state: BatchState, block_index: torch.Tensor) -> torch.Tensor:
    """One reference fewer on each entry's block (flat positions, in the order the
    requests free them); True where that entry dropped the block's last reference. A
    table names each block once, so a block held once is named by one entry, which
    drops its last reference; a block named twice is shared by two freed requests and
    reaches zero at the later one, as the reference's one-by-one free does. Shared
    blocks are few, so only their entries are counted further."""
    refs = state.ref_cnt.view(-1)
    alone = refs.index_select(0, block_index) == 1
    refs.index_add_(0, block_index, torch.full_like(block_index, -1))
    shared = selected(~alone)
    shared_index = pick(block_index, shared)
    zero = refs.index_select(0, shared_index) == 0
    # Held blocks' queue keys are BIG until they are placed: they serve as scratch to
    # find, for each shared block, the last entry naming it.
    keys = state.free_key.view(-1)
    keys.scatter_reduce_(0, shared_index, shared, "amax", include_self=False)
    last = keys.index_select(0, shared_index) == shared
    keys.index_fill_(0, shared_index, BIG)
    return alone.index_copy_(0, shared, zero & last)


def _enqueue(
    state: BatchState,
    inst: torch.Tensor,
    entries: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    back: torch.Tensor,
    front: torch.Tensor,
    width: int,
) -> None:
    """Queue the entries' blocks marked back or front (entries packed as release_tables
    lays them out: blocks, pair = instance * width + request, owner = instance): the
    back ones in entry order from free_back on, the front ones below free_front in
    entry order with each instance's requests reversed."""
    blocks, pair, owner = entries
    num_inst = inst.numel()
    front_long, back_long = front.long(), back.long()
    front_per_pair = torch.zeros(num_inst * width, dtype=torch.int64, device=inst.device)
    front_per_pair.index_add_(0, pair, front_long)
    front_total = front_per_pair.view(num_inst, width).sum(dim=1)
    back_total = torch.zeros_like(inst).index_add_(0, owner, back_long)
    make_room(state, inst, front_total, back_total)
    # An entry's front position: its instance's front entries in later requests, then
    # its own request's front entries before it.
    later = front_total.unsqueeze(1) - torch.cumsum(front_per_pair.view(num_inst, width), dim=1)
    front_base = state.free_front.index_select(0, inst) - front_total
    from_pair = (front_base.unsqueeze(1) + later).view(-1)
    from_pair -= torch.cumsum(front_per_pair, dim=0) - front_per_pair
    # An entry's back position: its instance's back entries before it.
    from_inst = state.free_back.index_select(0, inst) - (torch.cumsum(back_total, 0) - back_total)
    back_before = torch.cumsum(back_long, 0) - back_long
    front_before = torch.cumsum(front_long, 0) - front_long
    at = selected(back | front)
    at_owner = pick(owner, at)
    keys = torch.where(
        pick(back, at),
        from_inst.index_select(0, at_owner) + pick(back_before, at),
        from_pair.index_select(0, pick(pair, at)) + pick(front_before, at),
    )
    place(state, inst.index_select(0, at_owner), pick(blocks, at), keys)
    state.free_back.index_add_(0, inst, back_total)
    state.free_front.index_add_(0, inst, -front_total)
    state.num_free.index_add_(0, inst, front_total + back_total)
