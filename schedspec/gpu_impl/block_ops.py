"""The block pool's moves on tensors: take free blocks, register cached content, free tables.

Each function works on a set of instances `inst` ([I] indices, no repeats)
and, per instance, requests in an order (slots [I, R], -1 padded), doing
for all of them at once what the reference does one request at a time.
The free queue is a key per block (batch_state.py): taking blocks takes
the smallest keys (free_queue.py finds them), a block put at the front gets a key below every other,
one put at the back a key above.

Most requests move a block or two per call, so where the blocks moved are
laid out packed (`_entries`: one entry per block, in instance, request,
block order) rather than padded to the widest request, the ops run on the
real entries only.
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


def _entries(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """counts[i, r] entries for each (instance, request) pair, packed in that order: each
    entry's pair (flat, i * R + r), each entry's instance (i), and each pair's first
    entry (so entry e is the (e - first[pair[e]])-th of its pair). One host read (the
    number of entries)."""
    flat = counts.reshape(-1)
    per_inst = counts.sum(dim=1)
    # Given the output size, repeat_interleave skips a pass that sums the repeats.
    size = int(per_inst.sum())
    pair = torch.repeat_interleave(flat, output_size=size)
    owner = torch.repeat_interleave(per_inst, output_size=size)
    return pair, owner, torch.cumsum(flat, dim=0) - flat


def _busy(
    inst: torch.Tensor, counts: torch.Tensor, *others: torch.Tensor
) -> tuple[int, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """The rows with any count, and the widest count (0: nothing to do). One host read:
    loops over [I, R, width] stay as wide as the work, not as max_model_len."""
    width = int(counts.max()) if counts.numel() else 0
    if width <= 0:
        return 0, inst[:0], counts[:0], tuple(o[:0] for o in others)
    busy = torch.nonzero((counts > 0).any(dim=1)).squeeze(1)
    return (
        width,
        inst.index_select(0, busy),
        counts.index_select(0, busy),
        tuple(o.index_select(0, busy) for o in others),
    )


def take_free_blocks(
    state: BatchState, inst: torch.Tensor, slots: torch.Tensor, counts: torch.Tensor
) -> None:
    """Append counts[i, r] blocks from the front of the free queue to slots[i, r]'s table,
    request after request; a taken block loses any cached content (eviction).

    The caller has checked that each instance has enough free blocks.
    """
    counts = torch.where(slots >= 0, counts, 0)
    pair, _, first = _entries(counts)
    if pair.numel() == 0:
        return
    total = counts.sum(dim=1)
    busy = selected(total > 0)
    # The queue hands its blocks out in (instance, queue) order, the entries ask in
    # (instance, request, block) order: the two line up.
    blocks, block_index = pop_front(
        state, inst.index_select(0, busy), total.index_select(0, busy), pair.numel()
    )
    row = flat_rows(state.num_held, inst.unsqueeze(1), slots.clamp(min=0)).view(-1)
    held = state.num_held.view(-1).index_select(0, row)
    # Entry e lands after its request's held blocks and its pair's earlier entries.
    to_table = row * state.table.shape[2] + held - first
    table_index = to_table.index_select(0, pair) + torch.arange(pair.numel(), device=pair.device)
    state.table.view(-1).index_copy_(0, table_index, blocks)
    state.ref_cnt.view(-1).index_fill_(0, block_index, 1)
    prefix_index.forget(state, block_index)
    state.block_hash.view(-1).index_fill_(0, block_index, NO_HASH)
    # Padding pairs add 0 (wherever their clamped slot points).
    state.num_held.view(-1).index_add_(0, row, counts.view(-1))


def register_blocks(
    state: BatchState,
    inst: torch.Tensor,
    slots: torch.Tensor,
    upto: torch.Tensor,
    block_size: int,
) -> None:
    """cache_blocks: register each request's full blocks among its first upto[i, r]
    tokens in the prefix cache, request after request (registration order is the
    lookup's tie-break)."""
    row = flat_rows(state.num_cached_block, inst.unsqueeze(1), slots.clamp(min=0)).view(-1)
    num_cached = state.num_cached_block.view(-1).index_select(0, row)
    num_full = torch.div(upto, block_size, rounding_mode="floor").reshape(-1)
    counts = torch.where(slots.reshape(-1) >= 0, (num_full - num_cached).clamp(min=0), 0)
    pair, owner, first = _entries(counts.view(slots.shape))
    if pair.numel() == 0:
        return
    entry = torch.arange(pair.numel(), device=pair.device)
    to_table = row * state.table.shape[2] + num_cached - first
    table_index = to_table.index_select(0, pair) + entry
    blocks = state.table.view(-1).index_select(0, table_index)
    hashes = state.req_hash.view(-1).index_select(0, table_index)
    block_index = (inst * state.ref_cnt.shape[1]).index_select(0, owner) + blocks
    # Registration order: the instance's counter, then the instance's entries in order.
    inst_first = first.view(slots.shape)[:, 0]
    seq = (state.next_reg.index_select(0, inst) - inst_first).index_select(0, owner) + entry
    # A block registered here is in this request's table only (a shared block is a hit,
    # registered before): the entries name distinct blocks.
    state.block_hash.view(-1).index_copy_(0, block_index, hashes)
    state.reg_seq.view(-1).index_copy_(0, block_index, seq)
    prefix_index.insert(state, block_index)
    state.next_reg.index_add_(0, inst, counts.view(slots.shape).sum(dim=1))
    # Padding pairs and requests with nothing new add 0: num_cached + counts = full blocks.
    state.num_cached_block.view(-1).index_add_(0, row, counts)


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
    earlier ones' and their back blocks behind. Laid out as [request in rank
    order, table position from the tail], the back of the queue is filled in
    reading order and the front in reading order with the requests reversed:
    both are prefix sums, no sort.
    """
    per_row = mask.sum(dim=1, keepdim=True)
    width, inst, _, (mask, rank) = _busy(inst, per_row, mask, rank)
    if width == 0:
        return
    num_inst = inst.numel()
    m = state.table.shape[2]
    order = torch.argsort(torch.where(mask, rank, BIG), dim=1, stable=True)[:, :width]
    real = torch.gather(mask, 1, order)  # [I, R] the freed requests, in rank order
    rows2 = inst.unsqueeze(1).expand_as(order)
    held = torch.where(real, take_at(state.num_held, rows2, order), 0)
    j = torch.arange(m, device=mask.device)
    valid = j < held.unsqueeze(-1)  # [I, R, M]
    tables = take_at(state.table, rows2, order)
    tail_first = (held.unsqueeze(-1) - 1 - j).clamp(min=0)
    blocks = torch.gather(tables, 2, tail_first).clamp(min=0)
    flat_blocks = blocks.view(num_inst, -1)
    zeroes = _drop_references(state, inst, blocks, valid).view(num_inst, -1)
    hashed = (
        take_at(state.block_hash, inst.unsqueeze(1).expand_as(flat_blocks), flat_blocks) != NO_HASH
    )
    back = (zeroes & hashed).view(num_inst, width, m)
    front = (zeroes & ~hashed).view(num_inst, width, m)
    back_pos = _positions(back)
    front_pos = _positions(front.flip(1)).flip(1)
    front_total = front.sum(dim=(1, 2))
    back_total = back.sum(dim=(1, 2))
    make_room(state, inst, front_total, back_total)
    front_base = state.free_front[inst] - front_total
    _assign_keys(state, inst, blocks, back, state.free_back[inst].view(-1, 1, 1) + back_pos)
    _assign_keys(state, inst, blocks, front, front_base.view(-1, 1, 1) + front_pos)
    state.free_back[inst] += back_total
    state.free_front[inst] = front_base
    state.num_free.index_add_(0, inst, zeroes.sum(dim=1))
    # `order` names distinct slots of each row (a prefix of a sort's permutation): the
    # pairs never collide, so the rows not freed can be written back unchanged.
    flat_tables = state.table.view(-1, m)
    cleared = torch.where(real.unsqueeze(-1), NO_BLOCK, tables)
    flat_tables.index_copy_(
        0, flat_rows(state.table, rows2, order).reshape(-1), cleared.view(-1, m)
    )
    put_at(state.num_held, rows2, order, 0, real)
    put_at(state.num_cached_block, rows2, order, 0, real)


def _drop_references(
    state: BatchState, inst: torch.Tensor, blocks: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """One reference fewer on each valid block ([I, R, M]), request after request; True
    where that request dropped the block's last reference. A table names each block
    once, so within one request no block repeats; a block two freed requests share
    reaches zero at the later one, as the reference's one-by-one free does. The loop
    runs over the R freed requests per row (a handful), never over instances."""
    n = state.ref_cnt.shape[1]
    refs = state.ref_cnt.view(-1)
    zeroes = torch.zeros_like(valid)
    for r in range(blocks.shape[1]):
        index = (inst.unsqueeze(1) * n + blocks[:, r]).view(-1)
        held = valid[:, r]
        refs.scatter_add_(0, index, -held.long().view(-1))
        zeroes[:, r] = held & (refs.index_select(0, index).view_as(held) == 0)
    return zeroes


def _positions(chosen: torch.Tensor) -> torch.Tensor:
    """Each chosen entry's position among the chosen ones, in reading order."""
    flat = chosen.reshape(chosen.shape[0], -1).long()
    return (torch.cumsum(flat, dim=1) - 1).view(chosen.shape)


def _assign_keys(
    state: BatchState,
    inst: torch.Tensor,
    blocks: torch.Tensor,
    chosen: torch.Tensor,
    keys: torch.Tensor,
) -> None:
    """Queue keys for the chosen blocks (each chosen once: its last reference's drop)."""
    at = selected(chosen)
    place(state, pick(inst.view(-1, 1, 1).expand_as(blocks), at), pick(blocks, at), pick(keys, at))
