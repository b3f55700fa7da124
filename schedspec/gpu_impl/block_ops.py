"""The block pool's moves on tensors: take free blocks, register cached content, free tables.

Each function works on a set of instances `inst` ([I] indices, no repeats)
and, per instance, requests in an order (slots [I, R], -1 padded), doing
for all of them at once what the reference does one request at a time.
The free queue is a key per block (batch_state.py): taking blocks takes
the smallest keys, a block put at the front gets a key below every other,
one put at the back a key above.
"""

from __future__ import annotations

import torch

from schedspec.gpu_impl.batch_state import BIG, NO_BLOCK, NO_HASH, BatchState

# Ranks order the requests of one release; they stay below this.
RANK_LIMIT = 2**20


def _rows(inst: torch.Tensor, *shape: int) -> torch.Tensor:
    """inst broadcast to [I, *shape]."""
    return inst.view(-1, *([1] * len(shape))).expand(-1, *shape)


def take_free_blocks(
    state: BatchState, inst: torch.Tensor, slots: torch.Tensor, counts: torch.Tensor
) -> None:
    """Append counts[i, r] blocks from the front of the free queue to slots[i, r]'s table,
    request after request; a taken block loses any cached content (eviction).

    The caller has checked that each instance has enough free blocks.
    """
    num_inst, num_req = slots.shape
    if num_inst == 0:
        return
    m = state.table.shape[2]
    n = state.ref_cnt.shape[1]
    counts = torch.where(slots >= 0, counts, torch.zeros_like(counts))
    keys = torch.where(state.ref_cnt[inst] == 0, state.free_key[inst], BIG)
    order = torch.argsort(keys, dim=1, stable=True)  # free queue, front first
    start = torch.cumsum(counts, dim=1) - counts
    j = torch.arange(m, device=slots.device)
    valid = j < counts.unsqueeze(-1)  # [I, R, M]
    pos = (start.unsqueeze(-1) + j).clamp(max=n - 1)
    blocks = torch.gather(order, 1, pos.view(num_inst, -1)).view(num_inst, num_req, m)
    safe_slots = slots.clamp(min=0)
    held = state.num_held[inst.unsqueeze(1), safe_slots]
    rows = _rows(inst, num_req, m)[valid]
    slot_e = safe_slots.unsqueeze(-1).expand(-1, -1, m)[valid]
    block_e = blocks[valid]
    state.table[rows, slot_e, (held.unsqueeze(-1) + j)[valid]] = block_e
    state.ref_cnt[rows, block_e] = 1
    state.block_hash[rows, block_e] = NO_HASH
    real = slots >= 0
    state.num_held[_rows(inst, num_req)[real], slots[real]] = (held + counts)[real]


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
    num_inst, num_req = slots.shape
    if num_inst == 0:
        return
    m = state.table.shape[2]
    real = slots >= 0
    safe_slots = slots.clamp(min=0)
    rows2 = inst.unsqueeze(1)
    num_cached = state.num_cached_block[rows2, safe_slots]
    num_full = upto // block_size
    counts = torch.where(real, (num_full - num_cached).clamp(min=0), torch.zeros_like(upto))
    start = torch.cumsum(counts, dim=1) - counts
    j = torch.arange(m, device=slots.device)
    valid = j < counts.unsqueeze(-1)
    k = (num_cached.unsqueeze(-1) + j).clamp(max=m - 1)
    rows3 = _rows(inst, num_req, m)
    slot3 = safe_slots.unsqueeze(-1).expand(-1, -1, m)
    blocks = state.table[rows3, slot3, k]
    hashes = state.req_hash[rows3, slot3, k]
    seq = state.next_reg[inst].view(-1, 1, 1) + start.unsqueeze(-1) + j
    rows_e = rows3[valid]
    blocks_e = blocks[valid]
    state.block_hash[rows_e, blocks_e] = hashes[valid]
    state.reg_seq[rows_e, blocks_e] = seq[valid]
    state.next_reg[inst] += counts.sum(dim=1)
    grew = counts > 0
    state.num_cached_block[_rows(inst, num_req)[grew], slots[grew]] = num_full[grew]


def uncache_uncomputed(
    state: BatchState, inst: torch.Tensor, slot: torch.Tensor, block_size: int
) -> None:
    """Take back registrations past each request's computed tokens (a priority victim
    unscheduled in the step that registered them never computes those blocks)."""
    if inst.numel() == 0:
        return
    m = state.table.shape[2]
    keep = state.num_computed[inst, slot] // block_size
    num_cached = state.num_cached_block[inst, slot]
    j = torch.arange(m, device=inst.device)
    drop = (j >= keep.unsqueeze(1)) & (j < num_cached.unsqueeze(1))
    blocks = state.table[inst, slot]  # [I, M]
    rows = inst.unsqueeze(1).expand(-1, m)
    state.block_hash[rows[drop], blocks[drop]] = NO_HASH
    state.num_cached_block[inst, slot] = torch.minimum(num_cached, keep)


def release_tables(
    state: BatchState, inst: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor
) -> None:
    """free(): drop the tables of the masked slots ([I, S]), one request after another
    in rank order, each tail first.

    A block nobody holds any more goes to the front of the free queue without
    cached content, to the back with it; the request that drops the last
    reference places it. Requests freed later put their front blocks ahead of
    earlier ones' and their back blocks behind.
    """
    num_inst, s = mask.shape
    if num_inst == 0:
        return
    m = state.table.shape[2]
    k = torch.arange(m, device=mask.device)
    held = state.num_held[inst]
    valid = mask.unsqueeze(-1) & (k < held.unsqueeze(-1))  # [I, S, M]
    blocks = state.table[inst].clamp(min=0)
    flat_blocks = blocks.view(num_inst, -1)
    flat_valid = valid.view(num_inst, -1)
    rev = held.unsqueeze(-1) - 1 - k  # position from the tail: the tail goes first
    rank3 = rank.unsqueeze(-1).expand(-1, -1, m)
    ref = state.ref_cnt[inst]
    ref_after = ref - torch.zeros_like(ref).scatter_add_(1, flat_blocks, flat_valid.long())
    last_rank = torch.full_like(ref, -1).scatter_reduce_(
        1, flat_blocks, torch.where(valid, rank3, -1).view(num_inst, -1), "amax"
    )
    zeroes = (
        flat_valid
        & (torch.gather(ref_after, 1, flat_blocks) == 0)
        & (rank3.reshape(num_inst, -1) == torch.gather(last_rank, 1, flat_blocks))
    )
    hashed = torch.gather(state.block_hash[inst], 1, flat_blocks) != NO_HASH
    flat_rank = rank3.reshape(num_inst, -1)
    flat_rev = rev.reshape(num_inst, -1)
    front = zeroes & ~hashed
    back = zeroes & hashed
    _place(state, inst, flat_blocks, front, (RANK_LIMIT - flat_rank) * m + flat_rev, True)
    _place(state, inst, flat_blocks, back, flat_rank * m + flat_rev, False)
    state.ref_cnt[inst] = ref_after
    rows = inst.unsqueeze(1).expand(-1, s)[mask]
    slots = torch.arange(s, device=mask.device).expand(num_inst, -1)[mask]
    state.table[rows, slots] = NO_BLOCK
    state.num_held[rows, slots] = 0
    state.num_cached_block[rows, slots] = 0


def _place(
    state: BatchState,
    inst: torch.Tensor,
    blocks: torch.Tensor,
    chosen: torch.Tensor,
    order_key: torch.Tensor,
    at_front: bool,
) -> None:
    """Give the chosen blocks consecutive free keys in order_key order, at the front
    of the queue (below every key) or at the back (above every key)."""
    num_inst, width = blocks.shape
    order = torch.argsort(torch.where(chosen, order_key, BIG), dim=1, stable=True)
    total = chosen.sum(dim=1)
    pos = torch.arange(width, device=blocks.device).expand(num_inst, -1)
    take = pos < total.unsqueeze(1)
    base = state.free_front[inst] - total if at_front else state.free_back[inst]
    keys = base.unsqueeze(1) + pos
    rows = inst.unsqueeze(1).expand(-1, width)[take]
    state.free_key[rows, torch.gather(blocks, 1, order)[take]] = keys[take]
    if at_front:
        state.free_front[inst] -= total
    else:
        state.free_back[inst] += total
