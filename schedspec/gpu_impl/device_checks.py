"""Safety invariants checked on the device, for all B instances at once.

Each check returns a [B] bool tensor, True where the instance breaks it;
nothing is read back. They are the tensor forms of catalogue invariants
(docs/SPEC.md) over what the tensors hold, named by the same ids; the
full predicates run when a finding is replayed through the harness.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from schedspec.gpu_impl.batch_state import (
    BIG,
    EMPTY,
    EMPTY_BUCKET,
    NO_BLOCK,
    NO_HASH,
    PREEMPTED,
    RUNNING,
    TOMBSTONE,
    WAITING,
    BatchState,
)
from schedspec.gpu_impl.free_queue import ring_disagrees
from schedspec.gpu_impl.step_plan import (
    SCHEDULED_NEW,
    SCHEDULED_RESUMED,
    SCHEDULED_RUNNING,
    StepPlan,
)
from schedspec.spec import PLACEHOLDER_TOKEN_ID, SchedulerConfig
from schedspec.spec.invariants.vllm.reorder import cache_aware_window

StateCheck = Callable[[BatchState, SchedulerConfig], torch.Tensor]
StepCheck = Callable[[BatchState, StepPlan, SchedulerConfig], torch.Tensor]


def conservation(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """CONSERVATION: each ref count equals the number of tables holding the block, and
    the free queue (ref 0) holds each free block once (distinct keys below BIG, each
    found through the ring under its key), held blocks sit outside it (key BIG) and the
    free count is the queue's length."""
    b, n = state.ref_cnt.shape
    tables = state.table.view(b, -1)
    held = tables != NO_BLOCK
    counts = torch.zeros((b, n + 1), dtype=torch.int64, device=state.device)
    counts.scatter_add_(1, torch.where(held, tables, n), held.long())
    wrong_refs = (counts[:, :n] != state.ref_cnt).any(dim=1)
    free = state.ref_cnt == 0
    # Free blocks carry a queue key, held ones BIG: taking the smallest keys relies on it.
    misplaced = (free == (state.free_key == BIG)).any(dim=1)
    miscounted = free.sum(dim=1) != state.num_free
    bad = wrong_refs | misplaced | miscounted | (state.ref_cnt < 0).any(dim=1)
    # Distinct keys need no sort: the ring names one block per key, and the keys span
    # at most the ring, so two free blocks sharing a key leave one of them misplaced.
    return bad | ring_disagrees(state)


def exclusive(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """EXCLUSIVE: a block held by two tables is cached content (a prefix hit)."""
    return ((state.ref_cnt > 1) & (state.block_hash == NO_HASH)).any(dim=1)


def cache_index(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """CACHE-INDEX (the device's index, prefix_index.py): every block holding a content id
    has exactly one entry, in the bucket its cache_bucket names, where a lookup reaches
    it (no EMPTY_BUCKET between the id's home and the entry, and closer than
    cache_reach); no entry names a block holding no id; the deletion count bounds the
    tombstones."""
    n, h = state.block_hash.shape[1], state.cache_index.shape[1]
    entries = state.cache_index
    recorded = state.cache_bucket >= 0
    bucket = state.cache_bucket.clamp(0, h - 1)
    back = torch.gather(entries, 1, bucket)
    owned = back == torch.arange(n, device=state.device)
    lost = ((state.block_hash != NO_HASH) != recorded) | (recorded & ~owned)
    # Per block (N columns, not H): a lookup walks from the id's home to the first
    # EMPTY_BUCKET, so the entry must lie closer than cache_reach with no empty bucket
    # from the home up to it (counted by prefix sums, cyclically).
    home = state.block_hash & (h - 1)
    distance = (bucket - home) & (h - 1)
    empty = (entries == EMPTY_BUCKET).long()
    empties = torch.cumsum(empty, dim=1)  # in buckets 0..j
    between = torch.gather(empties, 1, bucket) - torch.gather(empties - empty, 1, home)
    between += torch.where(bucket < home, empties[:, -1:], 0)
    unreachable = recorded & ((between > 0) | (distance >= state.cache_reach.unsqueeze(1)))
    tombs = (entries == TOMBSTONE).sum(dim=1)
    unknown = (entries < TOMBSTONE).any(dim=1) | (state.cache_bucket >= h).any(dim=1)
    # Each recorded block owns the bucket it names, so as many entries as recorded blocks
    # leaves no entry over: none names a block without an id, or one twice.
    stray = (entries >= 0).sum(dim=1) != recorded.sum(dim=1)
    broken = stray | (lost | unreachable).any(dim=1)
    return broken | (tombs > state.cache_deleted) | unknown


def seqs(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """SEQS: at most max_num_seqs requests run."""
    return (state.status == RUNNING).sum(dim=1) > config.max_num_seqs


def queued_hold_nothing(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """QUEUES (the table part): waiting, preempted and empty slots hold no blocks."""
    return ((state.status != RUNNING) & (state.num_held > 0)).any(dim=1)


def no_leak(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """NO-LEAK: an instance with no live request has every block free."""
    idle = (state.status == EMPTY).all(dim=1)
    return idle & (state.ref_cnt != 0).any(dim=1)


def budget(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """BUDGET: the step's tokens fit the budget, and no entry is negative."""
    over = plan.scheduled.sum(dim=1) > config.max_num_batched_tokens
    return over | (plan.scheduled < 0).any(dim=1)


def no_overshoot(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """NO-OVERSHOOT: a scheduled request computes at most its tokens, the output
    positions in flight and its verified drafts (a padded admission's placeholders
    among them), and stays below max_model_len (the sampled token needs a position)."""
    scheduled = plan.scheduled > 0
    limit = state.num_tokens + plan.placeholders_before + plan.num_drafts
    past_known = state.num_computed > limit
    past_len = state.num_computed >= config.max_model_len
    return (scheduled & (past_known | past_len)).any(dim=1)


def kv_cover(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """KV-COVER: a scheduled request's table covers its computed tokens plus lookahead."""
    scheduled = plan.scheduled > 0
    need = torch.clamp(state.num_computed + config.lookahead_tokens, max=config.max_model_len)
    return (scheduled & (state.num_held * config.block_size < need)).any(dim=1)


def preempt_reset(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """PREEMPT-RESET: a request preempted this step is PREEMPTED with nothing computed,
    no blocks and no drafts, and was not scheduled."""
    reset = (
        (state.status == PREEMPTED)
        & (state.num_computed == 0)
        & (state.num_held == 0)
        & (state.num_spec == 0)
        & (plan.scheduled == 0)
        & (state.num_placeholders == 0)
        & (state.num_stale == state.num_in_flight)  # all its output in flight is stale
    )
    return (plan.preempted & ~reset).any(dim=1)


def max_tokens(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """MAX-TOKENS: a running request whose step in flight is sure to bring it to
    max_tokens (all its drafts rejected still counted) is not scheduled again."""
    placeholders = plan.placeholders_before
    sure = plan.computed_before + 2 - placeholders
    done = (placeholders > 0) & (sure >= state.num_prompt + state.max_tokens)
    return ((plan.kind == SCHEDULED_RUNNING) & done).any(dim=1)


def stale_hold(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """STALE-HOLD: a preempted request is not resumed while output from before its
    preemption is in flight (schedule() moves no stale count but a preemption's)."""
    return ((plan.kind == SCHEDULED_RESUMED) & (state.num_stale > 0)).any(dim=1)


def cache_aware_keep(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """CACHE-AWARE-KEEP (on the queue's keys): a schedule() changes a request's wait_key
    only by preempting it or by the cache-aware reorder, which runs only in a step that
    preempted nothing and moves only plain waiting requests (nothing computed) among the
    first window places of the queue, each taking another's key (the keys that moved are
    the same set before and after). Without a window in effect, nothing is checked (the
    plan keeps no keys from before the step)."""
    before = plan.wait_key_before
    if before is None:
        return torch.zeros_like(state.num_free, dtype=torch.bool)
    moved = (state.wait_key != before) & ~plan.preempted
    admitted = (plan.kind == SCHEDULED_NEW) | (plan.kind == SCHEDULED_RESUMED)
    # Queued before the step: still queued (and not preempted in it), or admitted in it.
    # WAITING (1) and PREEMPTED (3) are the odd codes.
    was_queued = (((state.status & 1) == 1) & ~plan.preempted) | admitted
    # Nothing turns a request WAITING within a step, and only a WAITING one is admitted
    # as new (its computed_before counts the prefix hits admission gave it).
    plain = ((state.status == WAITING) & (plan.computed_before == 0)) | (plan.kind == SCHEDULED_NEW)
    plain &= was_queued
    # The place each had in the queue: the queued requests with smaller keys, [B, S, S].
    ahead = (was_queued.unsqueeze(1) & (before.unsqueeze(1) < before.unsqueeze(2))).sum(dim=2)
    bad = (moved & ~(plain & (ahead < cache_aware_window(config)))).any(dim=1)
    bad |= moved.any(dim=1) & plan.preempted.any(dim=1)
    keys_before = torch.sort(torch.where(moved, before, BIG), dim=1).values
    keys_after = torch.sort(torch.where(moved, state.wait_key, BIG), dim=1).values
    return bad | (keys_before != keys_after).any(dim=1)


def cache_aware_order(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """CACHE-AWARE-ORDER (on the queue's keys): the requests the reorder ranked stand,
    after the step, deepest cached prefix first, ties in their order before the step.
    The depths are the ones the reorder read (plan.ranked_depth, admission's own lookup,
    which the lockstep diff holds to the reference's): the check holds the permutation
    the reorder made to them. Nothing is checked without a window in effect."""
    depth, before = plan.ranked_depth, plan.wait_key_before
    if depth is None or before is None:
        return torch.zeros_like(state.num_free, dtype=torch.bool)
    ranked = depth >= 0
    pair = ranked.unsqueeze(2) & ranked.unsqueeze(1)  # [B, S, S]: (a, b)
    deeper = depth.unsqueeze(2) > depth.unsqueeze(1)
    tie = (depth.unsqueeze(2) == depth.unsqueeze(1)) & (before.unsqueeze(2) < before.unsqueeze(1))
    after = state.wait_key.unsqueeze(2) < state.wait_key.unsqueeze(1)
    return (pair & (deeper | tie) & ~after).any(dim=2).any(dim=1)


def pipeline(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """PIPELINE: the in-flight, placeholder and stale counts are >= 0 with placeholders
    and stale tokens at most the tokens in flight; without async scheduling there are no
    placeholders, stale tokens or placeholder drafts, with it a request's drafts are all
    placeholders; a WAITING request has nothing in flight, a PREEMPTED one no
    placeholders and all its in-flight tokens stale, a RUNNING one none stale, its
    confirmed computed tokens short of its last known token, and no placeholders while
    its last step was a prefill chunk."""
    live = state.status != EMPTY
    in_flight, placeholders, stale = state.num_in_flight, state.num_placeholders, state.num_stale
    bad = (torch.minimum(torch.minimum(in_flight, placeholders), stale) < 0) | (
        torch.maximum(placeholders, stale) > in_flight
    )
    drafts = torch.arange(state.spec.shape[2], device=state.device) < state.num_spec.unsqueeze(2)
    placeholder = state.spec == PLACEHOLDER_TOKEN_ID
    if config.async_scheduling:
        bad |= (drafts & ~placeholder).any(dim=2)
    else:
        bad |= (placeholders != 0) | (stale != 0) | (drafts & placeholder).any(dim=2)
    status = state.status
    bad |= (status == WAITING) & (in_flight != 0)
    bad |= (status == PREEMPTED) & ((placeholders != 0) | (stale != in_flight))
    confirmed = state.num_computed - in_flight
    running_bad = (stale != 0) | (confirmed < 0) | (confirmed > state.num_tokens - 1)
    running_bad |= state.is_prefill_chunk & (placeholders != 0)
    bad |= (status == RUNNING) & running_bad
    return (live & bad).any(dim=1)


STATE_CHECKS: tuple[tuple[str, StateCheck], ...] = (
    ("CONSERVATION", conservation),
    ("EXCLUSIVE", exclusive),
    ("CACHE-INDEX", cache_index),
    ("SEQS", seqs),
    ("QUEUES", queued_hold_nothing),
    ("NO-LEAK", no_leak),
    ("PIPELINE", pipeline),
)
STEP_CHECKS: tuple[tuple[str, StepCheck], ...] = (
    ("BUDGET", budget),
    ("NO-OVERSHOOT", no_overshoot),
    ("KV-COVER", kv_cover),
    ("PREEMPT-RESET", preempt_reset),
    ("MAX-TOKENS", max_tokens),
    ("STALE-HOLD", stale_hold),
    ("CACHE-AWARE-KEEP", cache_aware_keep),
    ("CACHE-AWARE-ORDER", cache_aware_order),
)
CHECK_IDS: tuple[str, ...] = tuple(name for name, _ in (*STATE_CHECKS, *STEP_CHECKS))


@torch.inference_mode()  # read-only: skip autograd's bookkeeping, as the engine's steps do
def check_step(state: BatchState, plan: StepPlan, config: SchedulerConfig) -> torch.Tensor:
    """[B, len(CHECK_IDS)] violations right after schedule(), in CHECK_IDS order."""
    columns = [check(state, config) for _, check in STATE_CHECKS]
    columns += [check(state, plan, config) for _, check in STEP_CHECKS]
    return torch.stack(columns, dim=1)


@torch.inference_mode()
def check_state(state: BatchState, config: SchedulerConfig) -> torch.Tensor:
    """[B, len(CHECK_IDS)] violations of the state checks (step columns False)."""
    columns = [check(state, config) for _, check in STATE_CHECKS]
    false = torch.zeros_like(columns[0])
    return torch.stack(columns + [false] * len(STEP_CHECKS), dim=1)
