"""The block pool's moves on tensors: take free blocks, register cached content, free tables.

Each function works on a set of instances `inst` ([I] indices, no repeats)
and, per instance, requests in an order ([I, R]: their flat rows in the
[B, S] tensors, padding asking for nothing; release_tables: a slot mask;
release_rows: the requests' flat rows, packed, with every instance taking
part), doing for all of them at once what the reference does one request at
a time.
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
from schedspec.gpu_impl.batch_state import BIG, NO_BLOCK, NO_HASH, BatchState, floor_div
from schedspec.gpu_impl.flat_index import flat_rows, pick, put_at, selected, take_at, write_rows
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
    if flat.numel() == 0:
        return flat, flat, flat, counts.sum(dim=1)
    ends = torch.cumsum(flat, dim=0)
    # Given the output size, repeat_interleave skips a pass that sums the repeats.
    size = int(ends[-1])
    pair = torch.repeat_interleave(flat, output_size=size)
    if counts.shape[1] == 1:
        return pair, pair, ends - flat, flat  # one request per instance: pair = instance
    first = ends - flat
    # An instance's entries: where its last pair ends less where its first starts (a
    # sum over the short rows of counts costs several times as much).
    per_inst = ends.view(counts.shape)[:, -1] - first.view(counts.shape)[:, 0]
    owner = torch.repeat_interleave(per_inst, output_size=size)
    return pair, owner, first, per_inst


def _offsets(pair: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Each entry's position among its pair's entries (e - first[pair[e]])."""
    return torch.arange(pair.numel(), device=pair.device) - first.index_select(0, pair)


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
    # One row per entry: an entry's reads and writes cost its own count, not the
    # padded [I, R] pairs' (most pairs take nothing).
    row = rows.reshape(-1).index_select(0, pair)
    held = state.num_held.view(-1).index_select(0, row)
    # Entry e lands after its request's held blocks and its pair's earlier entries (row
    # * M + held in one fused add: an op's own cost is most of it at these sizes).
    table_index = torch.add(held, row, alpha=state.table.shape[2]) + _offsets(pair, first)
    write_rows(state.table, table_index, blocks)
    one = torch.ones_like(row)  # the taken blocks' reference count, and one held more
    write_rows(state.ref_cnt, block_index, one)
    prefix_index.forget(state, block_index)  # clears block_hash where a block had an id
    # scatter_add_: on the CPU about half index_add_'s cost over thousands of entries.
    state.num_held.view(-1).scatter_add_(0, row, one)


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
    full = floor_div(upto, block_size).reshape(-1)  # full blocks
    counts = (full - num_cached).clamp(min=0)
    pair, owner, first, per_inst = _entries(counts.view(rows.shape))
    if pair.numel() == 0:
        return
    entry = torch.arange(pair.numel(), device=pair.device)
    # One row per entry (most pairs register nothing): the table from num_cached on.
    entry_row = row.index_select(0, pair)
    from_pair = num_cached.index_select(0, pair) - first.index_select(0, pair)
    table_index = torch.add(from_pair, entry_row, alpha=state.table.shape[2]) + entry
    blocks = state.table.view(-1).index_select(0, table_index)
    hashes = state.req_hash.view(-1).index_select(0, table_index)
    block_index = flat_rows(state.ref_cnt, inst.index_select(0, owner), blocks)
    # Registration order: the instance's counter, then the instance's entries in order.
    inst_first = first.view(rows.shape)[:, 0]
    seq = (state.next_reg.index_select(0, inst) - inst_first).index_select(0, owner) + entry
    # A block registered here is in this request's table only (a shared block is a hit,
    # registered before): the entries name distinct blocks.
    write_rows(state.block_hash, block_index, hashes)
    write_rows(state.reg_seq, block_index, seq)
    prefix_index.insert(state, block_index, hashes)
    state.next_reg.index_add_(0, inst, per_inst)
    # num_cached + counts = full blocks.
    state.num_cached_block.view(-1).scatter_add_(0, entry_row, torch.ones_like(entry_row))


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
    prefix_index.forget(state, block_index)  # clears their block_hash too
    put_at(state.num_cached_block, inst, slot, torch.minimum(num_cached, keep), keep >= 0)


def release_tables(
    state: BatchState, inst: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor
) -> None:
    """free(): drop the tables of the masked slots ([I, S]), one request after another
    in rank order (ties in slot order), each tail first.

    A block nobody holds any more goes to the front of the free queue without
    cached content, to the back with it; the request that drops the last
    reference places it. Requests freed later put their front blocks ahead of
    earlier ones' and their back blocks behind. With the blocks packed in
    (instance, request in rank order, table position from the tail) order,
    the back of the queue is filled in that order and the front in that order
    with each instance's requests reversed: both are prefix sums. Only the freed
    requests are sorted (by rank), never the blocks.
    """
    slots = mask.shape[1]
    freed = selected(mask)  # flat in [I, S], instance by instance
    if freed.numel() == 0:
        return
    # The freed requests in (instance, rank, slot) order: two stable sorts of the few
    # freed requests (sorting every busy instance's [S] row costs several times more).
    by_rank = torch.argsort(pick(rank, freed), stable=True)
    pos = floor_div(freed, slots).index_select(0, by_rank)
    by_inst = torch.argsort(pos, stable=True)
    freed = freed.index_select(0, by_rank.index_select(0, by_inst))
    pos = pos.index_select(0, by_inst)
    row = inst.index_select(0, pos) * state.num_held.shape[1] + (freed - pos * slots)
    _release_ordered(state, inst, pos, row)


def release_rows(state: BatchState, rows: torch.Tensor, rank: torch.Tensor) -> None:
    """release_tables for the requests at flat rows `rows` ([F], ascending) of the [B, S]
    tensors, rank[f] being each one's rank: distinct within an instance and in [0, S), as
    a step's scheduling order is. update_from_output knows its finished requests packed:
    this spares the passes over every slot that a [B, S] mask costs, and with such ranks
    one sort of (instance, rank) orders them."""
    if rows.numel() == 0:
        return
    slots = state.num_held.shape[1]
    key = torch.add(rank, floor_div(rows, slots), alpha=slots)  # instance * S + rank
    key, order = torch.sort(key)  # distinct keys
    inst = torch.arange(state.num_held.shape[0], device=rows.device)
    _release_ordered(state, inst, floor_div(key, slots), rows.index_select(0, order))


def _release_ordered(
    state: BatchState, inst: torch.Tensor, pos: torch.Tensor, row: torch.Tensor
) -> None:
    """Free the requests at flat rows `row` of the [B, S] tensors, in that order: pos
    names each one's instance by its position in inst (distinct), grouped in inst
    order (see release_tables)."""
    held = state.num_held.view(-1).index_select(0, row)
    pair, _, first, _ = _entries(held.unsqueeze(1))
    if pair.numel() > 0:
        # Tail first: entry e reads its table at held - 1 - (e - first[pair[e]]), that
        # is held + first[pair[e]] - (e + 1).
        after = torch.arange(1, pair.numel() + 1, device=pair.device)
        to_table = torch.add(held + first, row, alpha=state.table.shape[2])
        table_index = to_table.index_select(0, pair) - after
        blocks = state.table.view(-1).index_select(0, table_index)
        # A table holds NO_BLOCK past its held blocks: clearing the held entries clears
        # it (a scatter over the blocks costs less than an index_fill_ of whole rows).
        write_rows(state.table, table_index, NO_BLOCK)
        owner = pos.index_select(0, pair)
        block_index = flat_rows(state.ref_cnt, inst.index_select(0, owner), blocks)
        # Only the entries that dropped a block's last reference queue it: compacted
        # once, everything after works on them (a fifth to a quarter fewer).
        at = selected(_drop_references(state, block_index))
        back = state.block_hash.view(-1).index_select(0, pick(block_index, at)) != NO_HASH
        _enqueue(state, inst, (pick(blocks, at), pick(pair, at), pick(owner, at)), pos, back)
    write_rows(state.num_held, row, 0)
    write_rows(state.num_cached_block, row, 0)


def _drop_references(state: BatchState, block_index: torch.Tensor) -> torch.Tensor:
    """One reference fewer on each entry's block (flat positions, in the order the
    requests free them); True where that entry dropped the block's last reference. A
    table names each block once, so a block held once is named by one entry, which
    drops its last reference; a block named twice is shared by two freed requests and
    reaches zero at the later one, as the reference's one-by-one free does. Shared
    blocks are few, and fewer reach zero (a few hundred of the 17K entries a B = 4096
    update frees), so only their entries are counted further."""
    refs = state.ref_cnt.view(-1)
    alone = refs.index_select(0, block_index) == 1
    refs.scatter_add_(0, block_index, torch.full_like(block_index, -1))
    shared = selected(~alone)
    # The entries whose shared block nobody holds any more.
    gone = pick(shared, selected(refs.index_select(0, pick(block_index, shared)) == 0))
    gone_index = pick(block_index, gone)
    # Held blocks' queue keys are BIG until they are placed: they serve as scratch to
    # find, for each such block, the last entry naming it.
    keys = state.free_key.view(-1)
    keys.scatter_reduce_(0, gone_index, gone, "amax", include_self=False)
    last = keys.index_select(0, gone_index) == gone
    write_rows(keys, gone_index, BIG)
    return alone.scatter_(0, gone, last)


def _enqueue(
    state: BatchState,
    inst: torch.Tensor,
    entries: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    pos: torch.Tensor,
    back: torch.Tensor,
) -> None:
    """Queue the entries' blocks (entries packed as release_tables lays them out, less
    those whose block is still held: blocks, pair = request, owner = instance position
    in inst; pos: each request's instance position, grouped in inst order), at the back
    where `back` holds, at the front elsewhere: the back ones in entry order from
    free_back on, the front ones below free_front in entry order with each instance's
    requests reversed."""
    blocks, pair, owner = entries
    back_long = back.long()
    front_per_req = torch.zeros_like(pos).scatter_add_(0, pair, 1 - back_long)
    front_total = torch.zeros_like(inst).index_add_(0, pos, front_per_req)
    back_total = torch.zeros_like(inst).scatter_add_(0, owner, back_long)
    make_room(state, inst, front_total, back_total)
    # An entry's front position: below free_front by its instance's front entries, then
    # its instance's front entries in later requests, then its own request's front
    # entries before it. With global prefix sums over instances (CI), requests (CQ)
    # and entries (before): free_front - (CI_incl - CI_excl) + (CI_incl - CQ_incl)
    # + (before - CQ_excl), the requests being grouped by instance in inst order.
    ends = torch.cumsum(front_per_req, dim=0)
    to_front = state.free_front.index_select(0, inst) + torch.cumsum(front_total, 0) - front_total
    from_req = to_front.index_select(0, pos) - ends - (ends - front_per_req)
    # An entry's back position: its instance's back entries before it.
    from_inst = state.free_back.index_select(0, inst) - (torch.cumsum(back_total, 0) - back_total)
    back_before = torch.cumsum(back_long, 0) - back_long
    # Every entry goes to one end: the front entries before it are the rest.
    front_before = torch.arange(back.numel(), device=back.device) - back_before
    keys = torch.where(
        back,
        from_inst.index_select(0, owner) + back_before,
        from_req.index_select(0, pair) + front_before,
    )
    place(state, inst.index_select(0, owner), blocks, keys)
    state.free_back.index_add_(0, inst, back_total)
    state.free_front.index_add_(0, inst, front_total, alpha=-1)
    state.num_free.index_add_(0, inst, front_total + back_total)
