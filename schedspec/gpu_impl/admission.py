"""The waiting loop of schedule(): admit queue heads while budget, seats and blocks last.

Each admission's prefix-cache hits depend on the blocks the admission before
it registered and evicted in the same step, so admissions are taken one
queue position at a time; each round admits (or stops at) the head of
every instance's queue at once, so the rounds are bounded by max_num_seqs,
not by the number of instances. An instance stops at its first refusal:
the reference breaks at the head of the line too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedspec.gpu_impl import prefix_index
from schedspec.gpu_impl.batch_state import (
    BIG,
    EMPTY_BUCKET,
    RUNNING,
    WAITING,
    BatchState,
    floor_div,
    num_free_blocks,
)
from schedspec.gpu_impl.flat_index import flat_rows, pick, put_flat, selected, write_rows
from schedspec.gpu_impl.step_plan import (
    SCHEDULED_NEW,
    SCHEDULED_RESUMED,
    SCHEDULED_RUNNING,
    StepPlan,
    blocks_to_allocate,
    commit,
)
from schedspec.spec import PLACEHOLDER_TOKEN_ID, SchedulerConfig


def schedule_waiting(state: BatchState, config: SchedulerConfig, plan: StepPlan) -> None:
    # Per instance, the queued and running requests, counted at the plan's start: a round
    # only turns admitted heads from queued to running, so later rounds update the counts
    # of the instances still open on [I] alone.
    queued, running = plan.queued, plan.running
    awaiting = None
    if config.async_scheduling:
        # Requests awaiting stale output are passed over where they stand: the others
        # are the queue admission walks.
        awaiting = awaits_stale_output(state)
        queued = queued - awaiting.sum(dim=1)
    open_ = (queued > 0) & (running < config.max_num_seqs) & (plan.budget > 0)
    if plan.some_preempted:
        # A step that preempted admits nothing: freed blocks go to running requests first.
        open_ &= ~plan.preempted.any(dim=1)
    inst = selected(open_)
    queued, running = queued.index_select(0, inst), running.index_select(0, inst)
    may_pad = _may_pad(state, config, plan, inst)
    while inst.numel() > 0:
        admitted = _admit_heads(state, config, plan, inst, running > 0, awaiting, may_pad)
        queued, running = queued - 1, running + 1
        go_on = admitted & (queued > 0) & (running < config.max_num_seqs)
        left = selected(go_on & (plan.budget.index_select(0, inst) > 0))
        inst, queued, running = (pick(t, left) for t in (inst, queued, running))
        if may_pad is not None:
            may_pad = may_pad.only(left)


def awaits_stale_output(state: BatchState) -> torch.Tensor:
    """[B, S] the queued requests whose output from before their preemption is still in
    flight: resumed now, they would compute again a position that output delivers."""
    # WAITING (1) and PREEMPTED (3) are the odd codes.
    return ((state.status & 1) == 1) & (state.num_stale > 0)


@dataclass(frozen=True)
class _PadGate:
    """Per open instance, what spec-decode padding asks of the running phase's step: no
    running request scheduled in it continues a prefill (no_chunk: its flag is from the
    step before, as the running phase read it), and whether any running request is in it
    (runs). Admissions change neither."""

    no_chunk: torch.Tensor
    runs: torch.Tensor

    def only(self, keep: torch.Tensor) -> _PadGate:
        """The gate of the instances at positions keep (from `selected`)."""
        return _PadGate(pick(self.no_chunk, keep), pick(self.runs, keep))


def _may_pad(
    state: BatchState, config: SchedulerConfig, plan: StepPlan, inst: torch.Tensor
) -> _PadGate | None:
    """The padding gate of instances inst, or None without pad_spec_decode."""
    if not config.pad_spec_decode:
        return None
    scheduled = plan.kind.index_select(0, inst) == SCHEDULED_RUNNING
    chunk = (scheduled & state.is_prefill_chunk.index_select(0, inst)).any(dim=1)
    return _PadGate(~chunk, scheduled.any(dim=1))


def _padding(
    config: SchedulerConfig,
    gate: _PadGate,
    num_new: torch.Tensor,
    num_hit: torch.Tensor,
    budget: torch.Tensor,
    cap: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec-decode padding of the heads ([I]): a head with exactly one token to compute,
    in a step where no running request's prefill continues and either some running
    request runs or the head hit the prefix cache, is scheduled as 1 + K tokens (K
    placeholder drafts) if that leaves room below max_model_len for the token it
    samples. Returns (padded, waits): waits where the padded count is over the budget
    left (the head is refused: vLLM prefers no step to an unpadded one); not padded where
    the long-prefill cap (BIG: none) would cut it (vLLM pads and then fails its own
    assertion, docs/FINDINGS.md F3)."""
    size = 1 + config.num_speculative_tokens
    candidate = (num_new == 1) & (num_hit + size + 1 <= config.max_model_len)
    candidate &= gate.no_chunk & (gate.runs | (num_hit > 0))
    waits = candidate & (budget < size)
    return candidate & ~waits & (cap >= size), waits


def longest_cached_prefix(
    state: BatchState, config: SchedulerConfig, inst: torch.Tensor, slot: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """get_computed_blocks: the cached blocks ([I, M], -1 padded) holding the request's
    longest prefix of whole blocks, never its last token, and how many there are."""
    row = flat_rows(state.status, inst, slot)
    oldest, hit, count = cached_prefix(state, config, inst, row, pick(state.num_tokens, row))
    return torch.where(hit, oldest, -1), count


def cached_prefix(
    state: BatchState,
    config: SchedulerConfig,
    inst: torch.Tensor,
    row: torch.Tensor,
    num_tokens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """longest_cached_prefix for the requests at flat rows `row` of the [B, S] tensors
    (of instances inst, any number per instance: admission asks for its heads,
    cache_aware.py for the requests it ranks), holding num_tokens tokens, the hits
    unmasked: each id's oldest holder ([I, M]), a mask of the hits among them (a prefix
    of each row) and the hits per request. It reads the cache and moves nothing."""
    m = state.req_hash.shape[2]
    if not config.enable_prefix_caching:
        none = torch.zeros((inst.numel(), m), dtype=torch.bool, device=inst.device)
        return torch.full_like(none, -1, dtype=row.dtype), none, torch.zeros_like(row)
    # Every full block of known tokens has its content id in req_hash, and the blocks
    # below max_hit are full and known. The ids are read where they are looked up (a
    # gather of the heads' [I, M] rows read mostly ids never looked up).
    ids = state.req_hash.view(-1)
    first_id = row * m  # each head's id 0 in ids
    max_hit = floor_div(num_tokens - 1, config.block_size)
    # Content ids are chained: nothing after a miss can hit. About half the heads miss
    # their first block, so only the others look up the rest. Holders land in a flat
    # [I * M] tensor (EMPTY_BUCKET: not looked up, or no holder).
    oldest = torch.full((inst.numel() * m,), EMPTY_BUCKET, dtype=ids.dtype, device=inst.device)
    heads = selected(max_hit > 0)
    head_id = first_id.index_select(0, heads)
    first = prefix_index.oldest_holders(
        state, inst.index_select(0, heads), ids.index_select(0, head_id)
    )
    write_rows(oldest, heads * m, first)
    found = selected(first >= 0)
    rows = pick(heads, found)
    if rows.numel() > 0:
        j = torch.arange(1, m, device=inst.device)
        at = selected(j < max_hit.index_select(0, rows).unsqueeze(1))
        # Flat positions in [I, M] of the rest of those heads' wanted ids, and in ids.
        position = pick((rows * m).unsqueeze(1) + j, at)
        id_at = pick(pick(head_id, found).unsqueeze(1) + j, at)
        owner = pick(inst.index_select(0, rows).unsqueeze(1).expand(-1, m - 1), at)
        holder = prefix_index.oldest_holders(state, owner, ids.index_select(0, id_at))
        write_rows(oldest, position, holder)
    oldest = oldest.view(-1, m)
    chain = torch.cumprod((oldest >= 0).long(), dim=1).bool()
    return oldest, chain, chain.sum(dim=1)


def _admit_heads(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    running: torch.Tensor,
    awaiting: torch.Tensor | None,
    may_pad: _PadGate | None,
) -> torch.Tensor:
    """Try to admit each instance's queue head (`running`: whether something in the
    instance runs; awaiting: [B, S] the queued requests passed over, None without async
    scheduling; may_pad: the padding gate, None without padding); True where it was
    admitted. Reads and writes go through flat_index (one head per instance: the pairs
    are distinct)."""
    status = state.status.index_select(0, inst)
    # WAITING (1) and PREEMPTED (3) are the odd codes; the others never head the queue.
    queued = status & 1
    if awaiting is not None:
        # A request awaiting stale output is passed over: the head is the first other.
        queued = queued & ~awaiting.index_select(0, inst)
    keys = state.wait_key.index_select(0, inst)
    if config.policy == "fcfs":
        # fcfs keys are counters, far from -+2**62: queued keys drop by BIG, below every
        # other slot's, in one add instead of a compare and a masked fill (whose branches
        # mispredict). Priority keys span about 2**63: they take the masked fill.
        keys = torch.add(keys, queued, alpha=-BIG)
    else:
        keys.masked_fill_(queued == 0, BIG)
    head = torch.argmin(keys, dim=1)
    # The heads' flat rows in the [B, S] tensors: every read and write below goes there.
    row = flat_rows(state.status, inst, head)
    num_tokens = pick(state.num_tokens, row)
    oldest, is_hit, num_hit_blocks = cached_prefix(state, config, inst, row, num_tokens)
    num_hit = num_hit_blocks * config.block_size
    budget = plan.budget.index_select(0, inst)
    cap = plan.cap.index_select(0, inst)  # BIG: none
    tokens = torch.minimum(num_tokens - num_hit, cap)
    padded = waits = None
    if may_pad is not None:
        padded, waits = _padding(config, may_pad, num_tokens - num_hit, num_hit, budget, cap)
        tokens = torch.where(padded, 1 + config.num_speculative_tokens, tokens)
    # Head-of-line without chunking: nothing behind a head that does not fit is tried.
    fits_budget = None if config.enable_chunked_prefill else tokens <= budget
    tokens = torch.minimum(tokens, budget)
    # The watermark is charged to admissions only while something runs.
    spare = torch.where(running, config.watermark_blocks, 0)
    hit = _HitEntries(state, inst, oldest, is_hit)
    # Hits still in the free queue (no table holds them).
    free_hit = state.ref_cnt.view(-1).index_select(0, hit.block_index) == 0
    evictable = torch.zeros_like(head).index_add_(0, hit.row, free_hit.long())
    free = num_free_blocks(state).index_select(0, inst)
    # The whole known sequence must fit today's free blocks, and so must this chunk (a
    # queued request holds no blocks).
    whole = blocks_to_allocate(config, num_tokens, num_hit_blocks, evictable)
    slots_needed = num_hit + tokens + config.lookahead_tokens
    chunk = blocks_to_allocate(config, slots_needed, num_hit_blocks, evictable)
    ok = torch.maximum(whole, chunk) <= free - spare
    if fits_budget is not None:
        ok &= fits_budget
    if waits is not None:
        ok &= ~waits
    # A queued request has computed nothing and holds no blocks (preemption resets both,
    # a freed slot is emptied): the writes of those counts add to zeros (scatter_add_:
    # about half index_add_'s cost on the CPU).
    admitted = ok.long()
    _take_hits(state, inst, row, hit, num_hit_blocks * admitted, evictable, ok)
    computed = num_hit * admitted
    for field in (state.num_computed, plan.computed_before):
        field.view(-1).scatter_add_(0, row, computed)
    head_status = status.gather(1, head.unsqueeze(1)).squeeze(1)
    kind = torch.where(head_status == WAITING, SCHEDULED_NEW, SCHEDULED_RESUMED)
    tokens = tokens.unsqueeze(1)
    commit(
        state,
        config,
        plan,
        inst,
        tokens,
        (chunk - evictable).unsqueeze(1),
        kind.unsqueeze(1),
        real=ok.unsqueeze(1),
        rows=row.unsqueeze(1),
        upto=torch.minimum(computed.unsqueeze(1) + tokens, num_tokens.unsqueeze(1)),
    )
    state.status.view(-1).scatter_add_(0, row, (RUNNING - head_status) * admitted)
    put_flat(state.run_key.view(-1), row, state.next_run.index_select(0, inst), ok)
    state.next_run.index_add_(0, inst, admitted)
    if padded is not None:
        _mark_padded(config, plan, pick(row, selected(padded & ok)))
    return ok


def _mark_padded(config: SchedulerConfig, plan: StepPlan, rows: torch.Tensor) -> None:
    """The padded admissions at flat rows `rows` verify K drafts, all placeholders."""
    if rows.numel() == 0:
        return
    k = config.num_speculative_tokens  # >= 1 with padding: the drafts' full width
    write_rows(plan.num_drafts, rows, k)
    plan.drafts.view(-1, k).index_fill_(0, rows, PLACEHOLDER_TOKEN_ID)


class _HitEntries:
    """The heads' hit blocks packed, one entry per hit (a few per head) instead of the
    [I, M] padded table: at (the flat position in [I, M]), row (the head's index in
    inst), blocks (block ids) and block_index (flat positions in the [B, N] tensors)."""

    def __init__(
        self, state: BatchState, inst: torch.Tensor, oldest: torch.Tensor, is_hit: torch.Tensor
    ) -> None:
        self.at = selected(is_hit)
        self.row = floor_div(self.at, is_hit.shape[1])
        self.blocks = pick(oldest, self.at)
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
    state.ref_cnt.view(-1).scatter_add_(0, block_index, torch.ones_like(block_index))
    write_rows(state.free_key, block_index, BIG)
    state.num_free.index_add_(0, inst, -torch.where(ok, evictable, 0))
    # Hit j of head r (flat position r * m + j in [I, M]) goes to column j of its table row.
    m = state.table.shape[2]
    rows = torch.arange(inst.numel(), device=inst.device)
    shift = (row - rows) * m
    table_index = shift.index_select(0, pick(hit.row, taken)) + pick(hit.at, taken)
    write_rows(state.table, table_index, pick(hit.blocks, taken))
    state.num_held.view(-1).scatter_add_(0, row, count)
    state.num_cached_block.view(-1).scatter_add_(0, row, count)
