"""The running loop of schedule(), for B instances at once.

The reference walks the running list: each request asks for
min(cap(tokens with drafts - computed), budget left, room before
max_model_len) tokens and the blocks those need, and when the blocks do not
fit it preempts victims until they do or it preempted itself. Here a
*segment* does that walk for every instance in one go: the budget split is
an exclusive prefix sum over the demands, blocks needed are elementwise,
and the first request whose cumulative blocks exceed the free ones stops
the segment. Everything before it commits. Only the instances stopped
that way then loop (retry): preempt one victim, try the stopped request
again with its token count unchanged (the reference fixes it before
allocating), and go back to segments once it fits or is gone.

A cursor (a run_key) marks how far each instance's walk has got, so
victims removed from the list never shift anyone's place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedspec.gpu_impl.batch_state import BIG, RUNNING, BatchState, num_free_blocks
from schedspec.gpu_impl.block_ops import uncache_uncomputed
from schedspec.gpu_impl.flat_index import flat_rows, pick
from schedspec.gpu_impl.step_plan import (
    NOT_SCHEDULED,
    SCHEDULED_RUNNING,
    StepPlan,
    apply_cap,
    blocks_to_allocate,
    commit,
    preempt,
    waiting_priority_key,
)
from schedspec.spec import SchedulerConfig


def schedule_running(state: BatchState, config: SchedulerConfig, plan: StepPlan) -> None:
    b = state.batch
    device = state.device
    active = plan.budget > 0
    cursor = torch.full((b,), -1, dtype=torch.int64, device=device)  # run_keys are >= 0
    pending = torch.full((b,), -1, dtype=torch.int64, device=device)
    pending_tokens = torch.zeros((b,), dtype=torch.int64, device=device)
    while True:
        active &= (pending >= 0) | (plan.budget > 0)
        segment = torch.nonzero(active & (pending < 0)).squeeze(1)
        retry = torch.nonzero(active & (pending >= 0)).squeeze(1)
        if segment.numel() == 0 and retry.numel() == 0:
            return
        if segment.numel():
            _segment(state, config, plan, segment, cursor, pending, pending_tokens, active)
        if retry.numel():
            _retry(state, config, plan, retry, cursor, pending, pending_tokens, active)


@dataclass(frozen=True)
class _Reads:
    """The per-slot fields a walk step reads, gathered once at the requests' flat rows
    in the [B, S] tensors (demand, blocks and the commit all read them at the same
    places; nothing they read changes before the commit's last read)."""

    rows: torch.Tensor  # [I, R] flat row numbers (padding: some real slot)
    computed: torch.Tensor
    num_tokens: torch.Tensor
    num_spec: torch.Tensor
    held: torch.Tensor  # blocks in the table before the commit

    @staticmethod
    def at(state: BatchState, inst: torch.Tensor, slots: torch.Tensor) -> _Reads:
        """At slots[i, r] (all real slot ids) of instances inst[i]."""
        rows = flat_rows(state.status, inst.unsqueeze(1), slots)
        return _Reads(
            rows=rows,
            computed=pick(state.num_computed, rows),
            num_tokens=pick(state.num_tokens, rows),
            num_spec=pick(state.num_spec, rows),
            held=pick(state.num_held, rows),
        )


def _demand(
    config: SchedulerConfig, plan: StepPlan, inst: torch.Tensor, reads: _Reads
) -> torch.Tensor:
    """Tokens each running request would take with the budget unlimited."""
    want = reads.num_tokens + reads.num_spec - reads.computed
    want = apply_cap(want, plan.cap.index_select(0, inst).unsqueeze(1))
    # Leave room for the token this step samples: positions stay < max_model_len.
    return torch.minimum(want, config.max_model_len - 1 - reads.computed).clamp(min=0)


def _blocks_needed(config: SchedulerConfig, reads: _Reads, tokens: torch.Tensor) -> torch.Tensor:
    """Blocks each request takes to hold `tokens` more tokens (0 where it takes none)."""
    need = blocks_to_allocate(config, reads.held, reads.computed + tokens + config.lookahead_tokens)
    return need * (tokens > 0)


def _segment(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    cursor: torch.Tensor,
    pending: torch.Tensor,
    pending_tokens: torch.Tensor,
    active: torch.Tensor,
) -> None:
    run_key = state.run_key.index_select(0, inst)
    status = state.status.index_select(0, inst)
    at_cursor = cursor.index_select(0, inst)
    eligible = (status == RUNNING) & (run_key > at_cursor.unsqueeze(1))
    num_eligible = eligible.sum(dim=1)
    # The walk is as wide as the longest running list, not the slot count (one host read
    # per segment): the columns cut off hold no running request.
    s = max(int(num_eligible.max()), 1)
    # Running requests' run_keys are distinct, so any sort puts them in one order; the
    # ineligible ones (BIG) sort last, past num_eligible: padding, masked by `valid`.
    order = torch.argsort(torch.where(eligible, run_key, BIG), dim=1)[:, :s]
    valid = torch.arange(s, device=inst.device) < num_eligible.unsqueeze(1)
    reads = _Reads.at(state, inst, order)
    demand = _demand(config, plan, inst, reads) * valid
    before = torch.cumsum(demand, dim=1) - demand
    budget = plan.budget.index_select(0, inst).unsqueeze(1)
    tokens = torch.minimum((budget - before).clamp(min=0), demand)
    blocks = _blocks_needed(config, reads, tokens)
    free = num_free_blocks(state).index_select(0, inst).unsqueeze(1)
    fits = torch.cumsum(blocks, dim=1) <= free
    go = fits & (tokens > 0)
    _commit_running(state, config, plan, inst, order, go, tokens, blocks, reads)
    # Blocks are >= 0, so the cumulative sum only grows: `fits` holds on a prefix of each
    # row, and its length is the column of the first request that does not fit.
    num_fit = fits.sum(dim=1)
    stopped = num_fit < s
    at = num_fit.clamp(max=s - 1).unsqueeze(1)
    prev_slot = torch.gather(order, 1, (at - 1).clamp(min=0))
    prev_key = torch.gather(run_key, 1, prev_slot).squeeze(1)
    moved = stopped & (num_fit > 0)
    # inst names distinct instances: whole-row copies, no advanced indexing.
    cursor.index_copy_(0, inst, torch.where(moved, prev_key, at_cursor))
    pending.index_copy_(0, inst, torch.where(stopped, torch.gather(order, 1, at).squeeze(1), -1))
    stopped_tokens = torch.where(stopped, torch.gather(tokens, 1, at).squeeze(1), 0)
    pending_tokens.index_copy_(0, inst, stopped_tokens)
    active.index_copy_(0, inst, stopped)


def _retry(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    cursor: torch.Tensor,
    pending: torch.Tensor,
    pending_tokens: torch.Tensor,
    active: torch.Tensor,
) -> None:
    """One victim per stopped instance, then the stopped request tries again."""
    victim = _pick_victim(state, config, inst)
    request = pending[inst]
    _unschedule(state, config, plan, inst, victim)
    preempt(state, config, plan, inst, victim)
    itself = victim == request
    if config.policy == "fcfs":
        active[inst[itself]] = False  # out of KV: nothing after it runs this step
    tokens = pending_tokens[inst].unsqueeze(1)
    reads = _Reads.at(state, inst, request.unsqueeze(1))
    blocks = _blocks_needed(config, reads, tokens)
    fits = ~itself & (blocks.squeeze(1) <= num_free_blocks(state)[inst])
    order = request.unsqueeze(1)
    _commit_running(state, config, plan, inst, order, fits.unsqueeze(1), tokens, blocks, reads)
    cursor[inst] = torch.where(fits, state.run_key[inst, request], cursor[inst])
    pending[inst] = torch.where(fits | itself, -1, request)


def _pick_victim(state: BatchState, config: SchedulerConfig, inst: torch.Tensor) -> torch.Tensor:
    """fcfs: the newest running request. priority: the largest (priority, arrival)."""
    running = state.status[inst] == RUNNING
    if config.policy == "fcfs":
        key = state.run_key[inst]
    else:
        key = waiting_priority_key(state.priority[inst], state.arrival[inst])
    return torch.argmax(torch.where(running, key, -BIG), dim=1)


def _unschedule(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    victim: torch.Tensor,
) -> None:
    """A victim scheduled earlier in this step (priority only) gives back its budget and
    the cache registrations of KV it will no longer compute."""
    tokens = plan.scheduled[inst, victim]
    plan.budget[inst] += tokens
    plan.scheduled[inst, victim] = 0
    plan.kind[inst, victim] = NOT_SCHEDULED
    plan.rank[inst, victim] = BIG
    plan.num_drafts[inst, victim] = 0
    was = tokens > 0
    if config.enable_prefix_caching and bool(was.any()):
        uncache_uncomputed(state, inst[was], victim[was], config.block_size)


def _commit_running(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    order: torch.Tensor,
    go: torch.Tensor,
    tokens: torch.Tensor,
    blocks: torch.Tensor,
    reads: _Reads,
) -> None:
    """Schedule the running requests order[i, r] where go holds; drafts ride in the same
    budget (a short budget drops the trailing ones) and are consumed either way."""
    upto = None
    if config.enable_prefix_caching:
        upto = torch.minimum(reads.computed + tokens, reads.num_tokens)
    at, committed = commit(
        state,
        config,
        plan,
        inst,
        order,
        tokens,
        blocks,
        SCHEDULED_RUNNING,
        real=go,
        rows=reads.rows,
        upto=upto,
    )
    # The committed rows are distinct; held was read before the commit took blocks.
    plan.new_from.view(-1).index_copy_(0, committed, pick(reads.held, at))
    verified = (tokens + reads.computed - reads.num_tokens).clamp(min=0)
    plan.num_drafts.view(-1).index_copy_(0, committed, pick(verified, at))
    state.num_spec.view(-1).index_fill_(0, committed, 0)
