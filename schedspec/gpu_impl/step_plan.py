"""What one schedule() call decides for B instances, and the moves both phases share.

The plan's tensors are the batched SchedulerOutput: tokens per slot, the
scheduling order, which kind of entry (running, new, resumed), where each
table's new blocks start, the drafts verified and who was preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedspec.gpu_impl.batch_state import (
    ARRIVAL_SHIFT,
    BIG,
    PREEMPTED,
    RUNNING,
    BatchState,
    cdiv,
)
from schedspec.gpu_impl.block_ops import register_blocks, release_tables, take_free_blocks
from schedspec.gpu_impl.flat_index import pick, selected, write_rows
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants.vllm.reorder import cache_aware_window

# Entry kinds in a step.
NOT_SCHEDULED = 0
SCHEDULED_RUNNING = 1
SCHEDULED_NEW = 2
SCHEDULED_RESUMED = 3


@dataclass
class StepPlan:
    budget: torch.Tensor  # [B] tokens left
    scheduled: torch.Tensor  # [B, S] tokens this step
    rank: torch.Tensor  # [B, S] scheduling order (BIG: not scheduled)
    next_rank: torch.Tensor  # [B]
    kind: torch.Tensor  # [B, S] NOT_SCHEDULED / SCHEDULED_*
    computed_before: torch.Tensor  # [B, S] num_computed_tokens before the step
    # [B, S] output placeholders before the step: the in-flight outputs the runner
    # counts (CachedRequestData.num_output_tokens) and the demand counted past num_tokens.
    placeholders_before: torch.Tensor
    new_from: torch.Tensor  # [B, S] table index where this step's new blocks start
    drafts: torch.Tensor  # [B, S, K] the drafts each request held at the start
    num_drafts: torch.Tensor  # [B, S] drafts verified this step
    preempted: torch.Tensor  # [B, S] bool
    cap: torch.Tensor  # [B] the long-prefill cap (BIG: none)
    active: torch.Tensor  # [B] bool: the instances that schedule this step
    # Queued (WAITING, PREEMPTED) and RUNNING requests per instance [B] at the start of
    # the step, counted once for both phases: the running walk changes a status only by
    # preempting, and an instance that preempted admits nothing, so the counts hold for
    # every instance admission looks at.
    queued: torch.Tensor
    running: torch.Tensor
    # False while no preempt() ran this step (plan.preempted is all False): admission
    # then skips the pass over it.
    some_preempted: bool = False
    # Cache-aware admission only (None without it), for the device checks: the wait_keys
    # at the start of the step ([B, S]), and the cached prefix in blocks of each request
    # the reorder ranked (-1: not ranked; cache_aware.py).
    wait_key_before: torch.Tensor | None = None
    ranked_depth: torch.Tensor | None = None

    @staticmethod
    def start(state: BatchState, config: SchedulerConfig, active: torch.Tensor) -> StepPlan:
        """A fresh plan; instances not `active` get no budget (they sit this step out)."""
        # WAITING (1) and PREEMPTED (3) are the odd codes (a test pins that).
        queued = (state.status & 1).sum(dim=1)
        running = (state.status == RUNNING).sum(dim=1)
        # BIG where there is no cap, so that a plain minimum applies it.
        threshold = long_prefill_threshold(config)
        cap = torch.where(queued + running > 1, threshold if threshold > 0 else BIG, BIG)
        budget = torch.where(active, config.max_num_batched_tokens, 0)
        per_slot = state.status  # the [B, S] fields take its shape and dtype
        ranked = cache_aware_window(config) > 0
        return StepPlan(
            budget=budget,
            scheduled=torch.zeros_like(per_slot),
            rank=torch.full_like(per_slot, BIG),
            next_rank=torch.zeros_like(state.next_arrival),
            kind=torch.zeros_like(per_slot),
            computed_before=state.num_computed.clone(),
            placeholders_before=state.num_placeholders.clone(),
            new_from=torch.zeros_like(per_slot),
            drafts=state.spec.clone(),
            num_drafts=torch.zeros_like(per_slot),
            preempted=torch.zeros_like(state.is_prefill_chunk),
            cap=cap,
            active=active,
            queued=queued,
            running=running,
            wait_key_before=state.wait_key.clone() if ranked else None,
            ranked_depth=torch.full_like(per_slot, -1) if ranked else None,
        )


def long_prefill_threshold(config: SchedulerConfig) -> int:
    """The long-prefill threshold in effect (0: no cap). Under
    long_prefill_needs_chunked_prefill (vLLM 0.34.0's rule) chunked prefill off means no
    cap at all: a prompt admitted whole runs whole. vLLM 0.33.0's rule (False) caps with
    chunking off too, so a capped prompt runs in chunks even then."""
    if config.long_prefill_needs_chunked_prefill and not config.enable_chunked_prefill:
        return 0
    return config.long_prefill_token_threshold


def blocks_to_allocate(
    config: SchedulerConfig,
    tokens: torch.Tensor,
    num_hit_blocks: torch.Tensor,
    evictable_hits: torch.Tensor,
) -> torch.Tensor:
    """Free blocks consumed to cover `tokens` tokens (capped at max_model_len) for a
    request holding no blocks but `num_hit_blocks` prefix hits, of which
    `evictable_hits` are free (admission's case; the running walk has its own)."""
    covered = cdiv(torch.clamp(tokens, max=config.max_model_len), config.block_size)
    return (covered - num_hit_blocks).clamp(min=0) + evictable_hits


def commit(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    tokens: torch.Tensor,
    new_blocks: torch.Tensor,
    kind: torch.Tensor | int,
    *,
    real: torch.Tensor,
    rows: torch.Tensor,
    upto: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Schedule the requests at flat rows rows[i, r] of the [B, S] tensors (`flat_rows`;
    padding, where `real` is False, names any slot) for tokens[i, r] tokens, in order:
    take their new blocks, register their full blocks among the first upto[i, r] tokens
    (min(computed + tokens, num_tokens): both callers have read those counts already),
    and record them in the plan. Returns the committed entries' flat positions in [I, R]
    (`selected(real)`) and their rows, for the caller's own writes."""
    take_free_blocks(state, inst, rows, new_blocks * real)
    if config.enable_prefix_caching:
        register_blocks(state, inst, rows, upto * real, config.block_size)
    # The plan's writes go to the committed rows only, compacted once: a slot is
    # committed at most once a step (so the rows are distinct) and nothing else writes
    # these fields before the step's last commit.
    at = selected(real)
    committed = pick(rows, at)
    write_rows(plan.scheduled, committed, pick(tokens, at))
    write_rows(plan.kind, committed, kind if isinstance(kind, int) else pick(kind, at))
    # Ranks count on from the instance's next rank, in order along each row.
    counted = torch.cumsum(real, dim=1)
    first = plan.next_rank.index_select(0, inst).unsqueeze(1) - 1
    write_rows(plan.rank, committed, pick(counted + first, at))
    plan.next_rank.index_add_(0, inst, counted[:, -1])
    plan.budget.index_add_(0, inst, (tokens * real).sum(dim=1), alpha=-1)
    return at, committed


def preempt(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    slot: torch.Tensor,
) -> None:
    """Preemption by recomputation of slot[i] in instance inst[i]: drop all KV, keep the
    tokens, queue it again at the head (fcfs) or where its key puts it (priority). Output
    still in flight for it turns stale: delivered when it lands, but moving none of the
    counters reset here."""
    mask = torch.zeros((inst.numel(), state.slots), dtype=torch.bool, device=inst.device)
    mask[torch.arange(inst.numel(), device=inst.device), slot] = True
    release_tables(state, inst, mask, torch.zeros_like(state.status[inst]))
    state.status[inst, slot] = PREEMPTED
    state.num_computed[inst, slot] = 0
    state.num_spec[inst, slot] = 0
    state.num_preemptions[inst, slot] += 1
    state.num_stale[inst, slot] = state.num_in_flight[inst, slot]
    state.num_placeholders[inst, slot] = 0
    if config.policy == "fcfs":
        state.wait_front[inst] -= 1
        state.wait_key[inst, slot] = state.wait_front[inst]
    else:
        state.wait_key[inst, slot] = waiting_priority_key(
            state.priority[inst, slot], state.arrival[inst, slot]
        )
    plan.preempted[inst, slot] = True
    plan.some_preempted = True


def waiting_priority_key(priority: torch.Tensor, arrival: torch.Tensor) -> torch.Tensor:
    """(priority, arrival) packed into one sortable int64."""
    return priority * ARRIVAL_SHIFT + arrival
