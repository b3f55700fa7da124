"""The waiting queue as a step's waiting phase sees it: cache-aware admission's reorder.

vLLM 0.34.0 (Scheduler._reorder_waiting_by_cached_prefix) reorders the head of the
waiting queue at the start of the waiting phase, after the running requests took their
blocks and before any admission; the queue stays reordered. Neither the step's pre
state nor its post state is that moment, so what the reorder reads there, the KV usage
and the prefix cache, is worked out from both (`waiting_phase`), and the order follows.
Pure functions of the transition: every predicate that speaks of queue order reads the
queue from here, so with cache-aware admission off it is the pre-step queue, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schedspec.spec.block_hash import BlockHash
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import RequestState

# Why the reorder did not run where the config has it off (window 0, or ignored).
OFF = "off: window 0, or not fcfs with prefix caching"


def cache_aware_window(config: SchedulerConfig) -> int:
    """The window in effect: 0 (off) unless fcfs with prefix caching, as vLLM resolves it
    (a priority heap has no positions to trade, and without a cache nothing ranks)."""
    if config.policy != "fcfs" or not config.enable_prefix_caching:
        return 0
    return config.cache_aware_admission_window


def may_move(request: RequestState) -> bool:
    """A plain waiting request, never run and nothing computed: the only kind that moves.
    A preempted one (or one holding computed tokens) keeps its place."""
    return request.status is RequestStatus.WAITING and request.num_computed_tokens == 0


@dataclass(frozen=True)
class WaitingPhase:
    """What the reorder of one step read and did."""

    # Why it did not run ("" when it ran): off, a preemption, fewer than two waiting,
    # usage below the threshold, fewer than two requests that may move in the window.
    skipped: str
    usage: float  # KV usage at the start of the waiting phase (0.0 when not worked out)
    slots: tuple[int, ...]  # queue positions of the requests that may move
    # Their cached prefix in tokens then (get_num_cached_tokens), by request id.
    cached_tokens: dict[str, int]
    queue: tuple[str, ...]  # the waiting queue after the reorder
    moved: bool  # the reorder changed the queue


def _off(queue: tuple[str, ...], why: str, usage: float = 0.0) -> WaitingPhase:
    return WaitingPhase(why, usage, (), {}, queue, False)


def usage_at_waiting_phase(t: ScheduleTransition) -> float:
    """KV usage when the waiting phase starts (vLLM's kv_cache_manager.usage: held blocks
    over all blocks; free cached blocks count as free). The free blocks then are the
    step's end plus those only admissions hold now: in a step without preemption nothing
    is freed, and a block an admission took was free until it did."""
    kv = t.post.kv
    free = len(kv.free_block_ids) + len(_taken_by_admissions(t))
    return 1.0 - free / kv.num_blocks


def _taken_by_admissions(t: ScheduleTransition) -> set[int]:
    """Blocks that only admitted requests hold after the step."""
    admitted = t.admitted_ids
    by_admitted: set[int] = set()
    by_others: set[int] = set()
    for rid, request in t.post.requests.items():
        (by_admitted if rid in admitted else by_others).update(request.block_ids)
    return by_admitted - by_others


def cached_at_waiting_phase(t: ScheduleTransition) -> Callable[[BlockHash], bool]:
    """Whether a hash is in the prefix cache when the waiting phase starts. A block that
    only admissions hold was free from the step's start until an admission took it, and
    the running requests neither cached nor evicted it: it stood then as before the step.
    Every other block stood then as it stands after the step: admissions register and
    evict only blocks they take, and nothing is freed."""
    taken = _taken_by_admissions(t)
    after = dict(t.post.kv.prefix_cache)
    before = dict(t.pre.kv.prefix_cache) if taken else {}

    def cached(block_hash: BlockHash) -> bool:
        holders = after.get(block_hash, ())
        if any(b not in taken for b in holders):
            return True
        return any(b in taken for b in before.get(block_hash, ()))

    return cached


def cached_prefix_tokens(
    own: Sequence[BlockHash],
    cached: Callable[[BlockHash], bool],
    num_tokens: int,
    block_size: int,
) -> int:
    """get_num_cached_tokens: the cached leading blocks of a request's chain, never the
    block holding its last token, in tokens."""
    depth = 0
    for block_hash in own[: (num_tokens - 1) // block_size]:
        if not cached(block_hash):
            break
        depth += 1
    return depth * block_size


def waiting_phase(t: ScheduleTransition) -> WaitingPhase:
    """The reorder of this step, as vLLM 0.34.0 makes it; worked out once per transition
    (several predicates read it, on every step)."""
    found = t.__dict__.get(_MEMO)
    if not isinstance(found, WaitingPhase):
        found = _waiting_phase(t)
        object.__setattr__(t, _MEMO, found)  # a frozen record: its own cache, nothing else
    return found


_MEMO = "_waiting_phase"


def _waiting_phase(t: ScheduleTransition) -> WaitingPhase:
    pre = t.pre
    queue = tuple(pre.waiting)
    window = cache_aware_window(pre.config)
    if not window:
        return _off(queue, OFF)
    if t.output.preempted_req_ids:
        return _off(queue, "a preemption: no waiting phase")
    if len(queue) < 2:
        return _off(queue, "fewer than two waiting")
    usage = usage_at_waiting_phase(t)
    if usage < pre.config.cache_aware_admission_threshold:
        return _off(queue, "usage below the threshold", usage)
    slots = tuple(i for i, rid in enumerate(queue[:window]) if may_move(pre.requests[rid]))
    if len(slots) < 2:
        return _off(queue, "fewer than two requests may move", usage)
    cached = cached_at_waiting_phase(t)
    bs = pre.config.block_size
    depths = {
        queue[i]: cached_prefix_tokens(
            t.hashes.of(pre.requests[queue[i]]), cached, pre.requests[queue[i]].num_tokens, bs
        )
        for i in slots
    }

    # Deepest cached prefix first, queue position breaking ties.
    order = sorted(slots, key=lambda i: (-depths[queue[i]], i))
    reordered = list(queue)
    for slot, source in zip(slots, order, strict=True):
        reordered[slot] = queue[source]
    return WaitingPhase("", usage, slots, depths, tuple(reordered), order != list(slots))


def waiting_phase_queue(t: ScheduleTransition) -> tuple[str, ...]:
    """The waiting queue admissions of this step work through, head first."""
    return waiting_phase(t).queue
