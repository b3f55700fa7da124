"""The waiting loop of schedule(): admit queue heads while budget, seats and blocks last.

Each admission's prefix-cache hits depend on the blocks the admission before
it registered and evicted in the same step, so admissions are taken one
queue position at a time; each round admits (or stops at) the head of
every instance's queue at once, so the rounds are bounded by max_num_seqs,
not by the number of instances. An instance stops at its first refusal:
the reference breaks at the head of the line too.
"""

from __future__ import annotations

import torch

from schedspec.gpu_impl import prefix_index
from schedspec.gpu_impl.batch_state import (
    BIG,
    EMPTY_BUCKET,
    NO_HASH,
    RUNNING,
    WAITING,
    BatchState,
    floor_div,
    num_free_blocks,
)
from schedspec.gpu_impl.flat_index import flat_rows, pick, put_flat, selected, take_at, write_rows
from schedspec.gpu_impl.step_plan import (
    SCHEDULED_NEW,
    SCHEDULED_RESUMED,
    StepPlan,
    blocks_to_allocate,
    commit,
)
from schedspec.spec import SchedulerConfig


def schedule_waiting(state: BatchState, config: SchedulerConfig, plan: StepPlan) -> None:
    # Per instance, the queued and running requests, counted at the plan's start: a round
    # only turns admitted heads from queued to running, so later rounds update the counts
    # of the instances still open on [I] alone.
    queued, running = plan.queued, plan.running
    open_ = (queued > 0) & (running < config.max_num_seqs) & (plan.budget > 0)
    if plan.some_preempted:
        # A step that preempted admits nothing: freed blocks go to running requests first.
        open_ &= ~plan.preempted.any(dim=1)
    inst = selected(open_)
    queued, running = queued.index_select(0, inst), running.index_select(0, inst)
    while inst.numel() > 0:
        admitted = _admit_heads(state, config, plan, inst, running > 0)
        queued, running = queued - 1, running + 1
        go_on = admitted & (queued > 0) & (running < config.max_num_seqs)
        left = selected(go_on & (plan.budget.index_select(0, inst) > 0))
        inst, queued, running = (pick(t, left) for t in (inst, queued, running))


def longest_cached_prefix(
    state: BatchState, config: SchedulerConfig, inst: torch.Tensor, slot: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """get_computed_blocks: the cached blocks ([I, M], -1 padded) holding the request's
    longest prefix of whole blocks, never its last token, and how many there are."""
    hashes = take_at(state.req_hash, inst, slot)  # [I, M]
    if not config.enable_prefix_caching:
        return torch.full_like(hashes, -1), torch.zeros_like(slot)
    max_hit = (take_at(state.num_tokens, inst, slot) - 1) // config.block_size
    j = torch.arange(hashes.shape[1], device=inst.device)
    wanted = (hashes != NO_HASH) & (j < max_hit.unsqueeze(1))
    # Content ids are chained: nothing after a miss can hit. About half the heads miss
    # their first block, so only the others look up the rest. Holders land in a flat
    # [I * M] tensor (EMPTY_BUCKET: not looked up, or no holder).
    m = hashes.shape[1]
    oldest = torch.full((hashes.numel(),), EMPTY_BUCKET, dtype=hashes.dtype, device=inst.device)
    heads = selected(wanted[:, 0])
    first = prefix_index.oldest_holders(
        state, inst.index_select(0, heads), hashes[:, 0].index_select(0, heads)
    )
    write_rows(oldest, heads * m, first)
    rows = pick(heads, selected(first >= 0))
    if rows.numel() > 0:
        at = selected(wanted.index_select(0, rows)[:, 1:])
        # Flat positions in [I, M] of the rest of those heads' wanted ids.
        position = pick((rows * m + 1).unsqueeze(1) + j[: m - 1], at)
        owner = pick(inst.index_select(0, rows).unsqueeze(1).expand(-1, m - 1), at)
        holder = prefix_index.oldest_holders(
            state, owner, hashes.view(-1).index_select(0, position)
        )
        write_rows(oldest, position, holder)
    oldest = oldest.view(hashes.shape)
    chain = torch.cumprod((oldest >= 0).long(), dim=1).bool()
    return torch.where(chain, oldest, -1), chain.sum(dim=1)


def _admit_heads(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    running: torch.Tensor,
) -> torch.Tensor:
    """Try to admit each instance's queue head (`running`: whether something in the
    instance runs); True where it was admitted. Reads and writes go through flat_index
    (one head per instance: the pairs are distinct)."""
    status = state.status.index_select(0, inst)
    # WAITING (1) and PREEMPTED (3) are the odd codes; the others never head the queue.
    keys = state.wait_key.index_select(0, inst).masked_fill_((status & 1) == 0, BIG)
    head = torch.argmin(keys, dim=1)
    hits, num_hit_blocks = longest_cached_prefix(state, config, inst, head)
    num_hit = num_hit_blocks * config.block_size
    num_tokens = take_at(state.num_tokens, inst, head)
    budget = plan.budget.index_select(0, inst)
    tokens = torch.minimum(num_tokens - num_hit, plan.cap.index_select(0, inst))  # BIG: none
    ok = torch.ones_like(head, dtype=torch.bool)
    if not config.enable_chunked_prefill:
        ok &= tokens <= budget  # head-of-line: nothing behind it is tried this step
    tokens = torch.minimum(tokens, budget)
    # The watermark is charged to admissions only while something runs.
    spare = torch.where(running, config.watermark_blocks, 0)
    hit = _HitEntries(state, inst, hits)
    # Hits still in the free queue (no table holds them).
    free_hit = state.ref_cnt.view(-1).index_select(0, hit.block_index) == 0
    evictable = torch.zeros_like(head).index_add_(0, hit.row, free_hit.long())
    free = num_free_blocks(state).index_select(0, inst)
    zero = torch.zeros_like(tokens)
    # The whole known sequence must fit today's free blocks, and so must this chunk.
    whole = blocks_to_allocate(config, zero, num_tokens, num_hit_blocks, evictable)
    slots_needed = num_hit + tokens + config.lookahead_tokens
    chunk = blocks_to_allocate(config, zero, slots_needed, num_hit_blocks, evictable)
    ok &= (whole + spare <= free) & (chunk + spare <= free)
    # The heads' flat rows in the [B, S] tensors. A queued request has computed nothing
    # and holds no blocks (preemption resets both, a freed slot is emptied): the writes
    # of those counts add to zeros.
    row = flat_rows(state.status, inst, head)
    admitted = ok.long()
    _take_hits(state, inst, row, hit, num_hit_blocks * admitted, evictable, ok)
    for field in (state.num_computed, plan.computed_before):
        field.view(-1).index_add_(0, row, num_hit * admitted)
    head_status = status.gather(1, head.unsqueeze(1)).squeeze(1)
    kind = torch.where(head_status == WAITING, SCHEDULED_NEW, SCHEDULED_RESUMED)
    slots = torch.where(ok, head, -1).unsqueeze(1)
    commit(
        state,
        config,
        plan,
        inst,
        slots,
        tokens.unsqueeze(1),
        (chunk - evictable).unsqueeze(1),
        kind.unsqueeze(1),
    )
    state.status.view(-1).index_add_(0, row, (RUNNING - head_status) * admitted)
    put_flat(state.run_key.view(-1), row, state.next_run.index_select(0, inst), ok)
    state.next_run.index_add_(0, inst, admitted)
    return ok


class _HitEntries:
    """The heads' hit blocks packed, one entry per hit (a few per head) instead of the
    [I, M] padded table: at (the flat position in hits), row (the head's index in
    inst), blocks (block ids) and block_index (flat positions in the [B, N] tensors)."""

    def __init__(self, state: BatchState, inst: torch.Tensor, hits: torch.Tensor) -> None:
        self.at = selected(hits >= 0)
        self.row = floor_div(self.at, hits.shape[1])
        self.blocks = pick(hits, self.at)
        self.block_index = inst.index_select(0, self.row) * state.ref_cnt.shape[1] + self.blocks


def _take_hits(
    state: BatchState,
    inst: torch.Tensor,
    row: torch.Tensor,
    hit: _HitEntries,
    count: torch.Tensor,
    evictable: torch.Tensor,
    ok: torch.Tensor,
) -> None:
    """touch(): where ok, the hit blocks start the table of the request at flat row
    row[i] of the [B, S] tensors, one more reference each (the `evictable` free ones
    leave the free queue), and count as already registered: count[i] of them (0 where
    not ok), added to the request's zero counts."""
    taken = selected(ok.index_select(0, hit.row))
    # Hits name distinct blocks within a row and rows are distinct instances.
    block_index = pick(hit.block_index, taken)
    state.ref_cnt.view(-1).index_add_(0, block_index, torch.ones_like(block_index))
    write_rows(state.free_key, block_index, BIG)
    state.num_free.index_add_(0, inst, -torch.where(ok, evictable, 0))
    # Hit j of head r (flat position r * m + j in hits) goes to column j of its table row.
    m = state.table.shape[2]
    rows = torch.arange(inst.numel(), device=inst.device)
    shift = (row - rows) * m
    table_index = shift.index_select(0, pick(hit.row, taken)) + pick(hit.at, taken)
    write_rows(state.table, table_index, pick(hit.blocks, taken))
    state.num_held.view(-1).index_add_(0, row, count)
    state.num_cached_block.view(-1).index_add_(0, row, count)
