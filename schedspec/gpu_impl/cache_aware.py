"""Cache-aware admission (vLLM 0.34.0's cache_aware_admission_window), for B instances at once.

At the start of the waiting phase, in each instance that preempted nothing, has two or
more requests queued and KV usage (1 - free / num_blocks) at or above the threshold, the
plain waiting requests (WAITING, nothing computed) among the first `window` of the queue
trade places: deepest cached prefix first (the blocks admission's lookup would hit now),
queue position breaking ties. Every other request keeps its exact place.

The queue is the queued slots ordered by wait_key, so a reorder is a permutation of
keys: the j-th place held by a request that may move, in queue order, takes the j-th
request of the ranking, by handing it that place's key. Nothing else changes, so the
others keep their keys and places, and the queue stays reordered for the steps after,
as the reference's deque does.

Per step: one host read (does any instance reorder?), a sort of the reordering
instances' keys for their first `window` places, one batched prefix-cache lookup for
the requests that may move there (admission's, `cached_prefix`), and two sorts of
[I, window] ranks. No loop over requests or instances.
"""

from __future__ import annotations

import torch

from schedspec.gpu_impl.admission import cached_prefix
from schedspec.gpu_impl.batch_state import BIG, WAITING, BatchState, floor_div
from schedspec.gpu_impl.flat_index import flat_rows, pick, selected, write_rows
from schedspec.gpu_impl.step_plan import StepPlan
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants.vllm.reorder import cache_aware_window


def most_free_blocks(config: SchedulerConfig) -> int:
    """The most free blocks at which KV usage, 1 - free / num_blocks as the spec computes
    it in floats, is at or above the threshold (-1: never). The usage only falls as free
    blocks grow, so the gate is one integer compare per instance, exact to the float."""
    n, threshold = config.num_blocks, config.cache_aware_admission_threshold
    # Within rounding of (1 - threshold) * n: start just above it and walk down.
    free = min(n, int((1.0 - threshold) * n) + 2)
    while free >= 0 and 1.0 - free / n < threshold:
        free -= 1
    return free


def reorder_waiting(state: BatchState, config: SchedulerConfig, plan: StepPlan) -> None:
    """Reorder the head of the waiting queue in every instance where the reorder runs
    (called after the running phase: the usage and the cache it reads are this step's)."""
    window = cache_aware_window(config)
    if not window:
        return
    # fcfs: wait_keys are counters (preempted requests' going down), so places are keys.
    may_move = (state.status == WAITING) & (state.num_computed == 0)
    runs = plan.active & (state.num_free <= most_free_blocks(config))
    if plan.some_preempted:
        runs &= ~plan.preempted.any(dim=1)  # a step that preempted has no waiting phase
    # Fewer than two that may move anywhere: fewer in the window, nothing to trade. (Two
    # that may move are two queued: the rule's "two or more waiting" holds within it.)
    runs &= may_move.sum(dim=1) >= 2
    inst = selected(runs)
    if inst.numel() == 0:
        return
    assert plan.ranked_depth is not None  # made where the window is in effect
    # The first w places of each queue (queued keys drop by BIG below every other slot's,
    # as admission finds its head); places past the queue hold slots that are not queued.
    w = min(window, state.slots)
    queued = state.status.index_select(0, inst) & 1
    keys = state.wait_key.index_select(0, inst)
    _, slot = torch.topk(torch.add(keys, queued, alpha=-BIG), w, dim=1, largest=False)
    rows = flat_rows(state.status, inst.unsqueeze(1), slot)  # [I, w], one place a column
    moves = pick(may_move, rows)
    at = selected(moves)
    mover = pick(rows, at)
    owner = inst.index_select(0, floor_div(at, w))
    _, _, depth = cached_prefix(state, config, owner, mover, pick(state.num_tokens, mover))
    write_rows(plan.ranked_depth, mover, depth)
    # Ranks (distinct, so any sort is stable enough): the movers deepest first, then by
    # place; the others after them all, by place. Places: the movers' in queue order,
    # then the others'. So rank j takes place j; the others take their own places back.
    deepest = state.req_hash.shape[2]  # no cached prefix is deeper than a table
    column = torch.arange(w, device=inst.device)
    shallowness = torch.full_like(rows, deepest + 1)
    write_rows(shallowness, at, deepest - depth)
    ranked = torch.argsort(shallowness * w + column, dim=1)
    places = torch.argsort(torch.where(moves, 0, w) + column, dim=1)
    place_keys = keys.gather(1, slot).gather(1, places)
    write_rows(state.wait_key, rows.gather(1, ranked).view(-1), place_keys.view(-1))
