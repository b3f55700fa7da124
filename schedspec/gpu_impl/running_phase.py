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

import torch

from schedspec.gpu_impl.batch_state import BIG, RUNNING, BatchState, num_free_blocks
from schedspec.gpu_impl.block_ops import uncache_uncomputed
from schedspec.gpu_impl.flat_index import put_at, take_at
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


def _demand(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Tokens each running request would take with the budget unlimited."""
    rows = inst.unsqueeze(1).expand_as(slots)
    computed = take_at(state.num_computed, rows, slots)
    want = take_at(state.num_tokens, rows, slots) + take_at(state.num_spec, rows, slots) - computed
    want = apply_cap(want, plan.cap[inst].unsqueeze(1))
    # Leave room for the token this step samples: positions stay < max_model_len.
    return torch.minimum(want, config.max_model_len - 1 - computed).clamp(min=0)


def _blocks_needed(
    state: BatchState,
    config: SchedulerConfig,
    inst: torch.Tensor,
    slots: torch.Tensor,
    tokens: torch.Tensor,
) -> torch.Tensor:
    rows = inst.unsqueeze(1).expand_as(slots)
    computed = take_at(state.num_computed, rows, slots)
    held = take_at(state.num_held, rows, slots)
    zero = torch.zeros_like(tokens)
    need = blocks_to_allocate(config, held, computed + tokens + config.lookahead_tokens, zero, zero)
    return torch.where(tokens > 0, need, zero)


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
    order = torch.argsort(torch.where(eligible, run_key, BIG), dim=1, stable=True)
    # The walk is as wide as the longest running list, not the slot count (one host read
    # per segment): the columns cut off hold no running request.
    s = max(int(eligible.sum(dim=1).max()), 1)
    order = order[:, :s]
    valid = torch.gather(eligible, 1, order)
    demand = torch.where(valid, _demand(state, config, plan, inst, order), 0)
    before = torch.cumsum(demand, dim=1) - demand
    budget = plan.budget.index_select(0, inst)
    tokens = torch.minimum((budget.unsqueeze(1) - before).clamp(min=0), demand)
    blocks = _blocks_needed(state, config, inst, order, tokens)
    fits = torch.cumsum(blocks, dim=1) <= num_free_blocks(state).index_select(0, inst).unsqueeze(1)
    go = fits & (tokens > 0)
    _commit_running(state, config, plan, inst, torch.where(go, order, -1), tokens, blocks)
    stopped = ~fits.all(dim=1)
    first_fail = torch.where(stopped, (~fits).long().argmax(dim=1), s)
    at = first_fail.clamp(max=s - 1).unsqueeze(1)
    sorted_keys = torch.gather(run_key, 1, order)
    prev_key = torch.gather(sorted_keys, 1, (at - 1).clamp(min=0)).squeeze(1)
    moved = stopped & (first_fail > 0)
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
    blocks = _blocks_needed(state, config, inst, request.unsqueeze(1), tokens)
    fits = ~itself & (blocks.squeeze(1) <= num_free_blocks(state)[inst])
    slots = torch.where(fits, request, -1).unsqueeze(1)
    _commit_running(state, config, plan, inst, slots, tokens, blocks)
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
    slots: torch.Tensor,
    tokens: torch.Tensor,
    blocks: torch.Tensor,
) -> None:
    """Schedule running requests; drafts ride in the same budget (a short budget drops
    the trailing ones) and are consumed either way."""
    real = slots >= 0
    rows = inst.unsqueeze(1).expand_as(slots)
    safe = slots.clamp(min=0)
    put_at(plan.new_from, rows, safe, take_at(state.num_held, rows, safe), real)
    commit(state, config, plan, inst, slots, tokens, blocks, SCHEDULED_RUNNING)
    computed = take_at(state.num_computed, rows, safe)
    verified = tokens + computed - take_at(state.num_tokens, rows, safe)
    put_at(plan.num_drafts, rows, safe, verified.clamp(min=0), real)
    put_at(state.num_spec, rows, safe, 0, real)
