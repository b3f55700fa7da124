"""The `sglang` profile: SGLang 0.5.23's exact decisions, as named invariants.

They read the abstract state's SGLang part (State.sglang: new_token_ratio, the
admission latch, the chunked request, the kind of batch the step ran) beside the
requests and the pool, under the mapping of docs/SPEC.md, "Two families". The
arithmetic is spec.sglang_arithmetic's, which the reference's SGLang family uses too.
What these do not pin down exactly (the radix cache's LRU order among evictable
leaves) the worked examples and the lockstep diff do (docs/SPEC.md says which).
"""

from __future__ import annotations

from dataclasses import dataclass

from schedspec.spec.block_hash import BlockHash, extend_block_hashes
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.sglang.prefill_pass import (
    TOLERANCE,
    RunningBatch,
    maybe_out_of_batch,
)
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.sglang_arithmetic import (
    decayed,
    ratio_after_retract,
    ratio_schedule,
)
from schedspec.spec.sglang_refresh import WAITING_QUEUE_PREFIX_MATCH_MAX, pass_refreshes
from schedspec.spec.state import State


def missing_policy_state(name: str) -> list[Violation]:
    """The violation of a sglang-profile check on an engine that reports no State.sglang."""
    return [
        Violation(
            name,
            "the engine reports no SGLang policy state (State.sglang)",
            expected="State.sglang",
            actual="None",
        )
    ]


@invariant(
    "SG-PREFILL-FIRST",
    "schedule",
    "sglang",
    "Prefill first: a step runs one kind of batch. An extend batch holds only the chunked "
    "request's next chunk and admissions; a decode batch (one token per running request, "
    "nothing admitted) runs only when no request is chunked, or when the chunked request is "
    "held back because the pool had no free or evictable block for its chunk; a mixed batch "
    "(an extend plus the running requests' decodes) only with enable_mixed_chunk; an idle "
    "step schedules nothing. The chunked request's chunk is in every step that does not hold it "
    "back. A decode or mixed batch decodes every running request but the "
    "chunked one, the step's victims, and those whose result in flight finishes them.",
)
def check_prefill_first(t: ScheduleTransition) -> list[Violation]:
    pre, post = t.pre.sglang, t.post.sglang
    if pre is None or post is None:
        return missing_policy_state("SG-PREFILL-FIRST")
    scheduled = t.output.num_scheduled_tokens
    admitted = t.admitted_ids
    kind = post.last_batch_kind
    chunked = pre.chunked_request_id
    continuing = chunked if chunked is not None and chunked in t.post.requests else None
    # (message, expected, actual) of each broken clause.
    problems: list[tuple[str, object, object]] = []
    if (kind == "idle") != (not scheduled):
        problems.append(
            (
                f"a {kind} step scheduled {dict(scheduled)}",
                "nothing scheduled" if kind == "idle" else "tokens scheduled",
                dict(scheduled),
            )
        )
    # A chunk is held back only when the pool cannot give it a page (docs/SPEC.md,
    # "A chunk the pool cannot hold"); the pre state's free blocks (free and
    # evictable) are a lower bound on what the step's allocation could reach.
    held_back = not t.pre.kv.free_block_ids
    chunk_due = continuing is not None and continuing in t.post.running and not held_back
    if kind == "decode":
        if admitted or any(n != 1 for n in scheduled.values()):
            problems.append(
                (
                    "a decode step admitted or scheduled more than one token",
                    "no admission, 1 token each",
                    {"admitted": list(admitted), "scheduled": dict(scheduled)},
                )
            )
        if chunk_due:
            problems.append(
                (f"a decode step while {continuing!r} is chunked", "an extend step", kind)
            )
    elif chunk_due and continuing not in scheduled:
        problems.append(
            (
                f"a {kind} step without the chunked request {continuing!r}'s chunk",
                f"{continuing!r} scheduled",
                sorted(scheduled),
            )
        )
    if kind == "extend":
        others = [r for r in scheduled if r not in admitted and r != continuing]
        if others:
            problems.append(
                (f"an extend step decoded {others}", "only admissions and the chunk", others)
            )
    elif kind == "mixed" and not t.post.config.enable_mixed_chunk:
        problems.append(("a mixed step without enable_mixed_chunk", "enable_mixed_chunk", "off"))
    if kind in ("decode", "mixed"):
        skipped = [
            r.request_id
            for r in RunningBatch.of(t).sure
            # the step itself leaves out a request whose result in flight finishes it
            if not maybe_out_of_batch(t.pre.config, r)
            and r.request_id not in scheduled
            and r.request_id not in t.output.preempted_req_ids
        ]
        if skipped:
            problems.append(
                (
                    f"a {kind} step left running requests {skipped} out",
                    "every running request decoded",
                    f"{skipped} left out",
                )
            )
    return [
        Violation("SG-PREFILL-FIRST", message, expected=expected, actual=actual)
        for message, expected, actual in problems
    ]


@invariant(
    "SG-ONE-CHUNKED",
    "state",
    "sglang",
    "At most one request is between the chunks of its prefill: the chunked request "
    "(State.sglang.chunked_request_id), RUNNING and last in the running order; no other "
    "running request's last step was a prefill chunk.",
)
def check_one_chunked(state: State) -> list[Violation]:
    policy = state.sglang
    if policy is None:
        return missing_policy_state("SG-ONE-CHUNKED")
    chunked = policy.chunked_request_id
    out: list[Violation] = []
    for rid in state.running:
        request = state.requests.get(rid)
        mid_prefill = request is not None and request.is_prefill_chunk
        if mid_prefill and rid != chunked:
            out.append(
                Violation(
                    "SG-ONE-CHUNKED",
                    "mid-prefill but not the chunked request",
                    rid,
                    expected=f"only the chunked request {chunked!r} mid-prefill",
                    actual=rid,
                )
            )
    if chunked is not None and (not state.running or state.running[-1] != chunked):
        out.append(
            Violation(
                "SG-ONE-CHUNKED",
                "the chunked request is not last in running",
                chunked,
                expected=chunked,
                actual=state.running[-1] if state.running else "running is empty",
            )
        )
    return out


@invariant(
    "SG-RATIO",
    "schedule",
    "sglang",
    "new_token_ratio: unchanged by an extend or mixed step; a decode step lowers it by "
    "(init - min) / 600 down to min (init = min(0.7 * schedule_conservativeness, 1), min = "
    "0.14 * init); a step that retracts sets it to min(1, (survivors' outputs + 20 per "
    "survivor) / (their max_new_tokens + 1)); an idle step keeps it or resets it to init.",
)
def check_ratio(t: ScheduleTransition) -> list[Violation]:
    pre, post = t.pre.sglang, t.post.sglang
    if pre is None or post is None:
        return missing_policy_state("SG-RATIO")
    schedule = ratio_schedule(t.post.config.schedule_conservativeness)
    kind = post.last_batch_kind
    allowed: list[float]
    if t.output.preempted_req_ids:
        survivors = [t.post.requests[r] for r in t.output.num_scheduled_tokens]
        allowed = [
            ratio_after_retract(
                sum(len(r.output_token_ids) for r in survivors),
                sum(r.max_tokens for r in survivors),
                len(survivors),
            )
        ]
    elif kind == "decode":
        allowed = [decayed(pre.new_token_ratio, schedule)]
    elif kind == "idle":
        allowed = [pre.new_token_ratio, schedule.init]
    else:
        allowed = [pre.new_token_ratio]
    if any(abs(post.new_token_ratio - a) <= TOLERANCE for a in allowed):
        return []
    expected = allowed[0] if len(allowed) == 1 else tuple(allowed)
    return [
        Violation(
            "SG-RATIO",
            f"new_token_ratio after a {kind} step",
            expected=expected,
            actual=post.new_token_ratio,
        )
    ]


@invariant(
    "SG-RETRACT",
    "schedule",
    "sglang",
    "Retraction (a decode that does not fit): the victims are the decoding requests with "
    "the fewest outputs, ties broken by the longest prompt, then by the later place in the "
    "running order (a chunked request held back in the step among them, with none); they "
    "join the back of the waiting queue, the last-ranked first; the survivors keep running, "
    "ranked most outputs first.",
)
def check_retract(t: ScheduleTransition) -> list[Violation]:
    victims = t.output.preempted_req_ids
    if not victims:
        return []
    survivors = list(t.output.num_scheduled_tokens)
    batch = [r for r in t.pre.running if r in victims or r in survivors]

    def key(rid: str) -> tuple[int, int]:
        request = t.pre.requests[rid]
        return (len(request.output_token_ids), -len(request.prompt_token_ids))

    ranked = sorted(batch, key=key, reverse=True)
    kept, retracted = ranked[: len(survivors)], ranked[len(survivors) :]
    out: list[Violation] = []
    if set(kept) != set(survivors) or set(retracted) != set(victims):
        out.append(
            Violation(
                "SG-RETRACT",
                "the wrong victims",
                expected=tuple(sorted(retracted)),
                actual=tuple(sorted(victims)),
            )
        )
        return out
    expected_waiting = (*t.pre.waiting, *reversed(retracted))
    if t.post.waiting != expected_waiting:
        out.append(
            Violation(
                "SG-RETRACT",
                "victims not at the back of the queue, last-ranked first",
                expected=expected_waiting,
                actual=t.post.waiting,
            )
        )
    if tuple(t.post.running[: len(kept)]) != tuple(kept):
        out.append(
            Violation(
                "SG-RETRACT",
                "survivors not ranked most outputs first",
                expected=tuple(kept),
                actual=t.post.running[: len(kept)],
            )
        )
    return out


def _evictable_order(state: State) -> list[int]:
    """The evictable blocks (free, with a hash) in free_block_ids' order."""
    hashes = state.kv.block_hashes
    return [b for b in state.kv.free_block_ids if hashes[b] is not None]


def _refreshed(t: ScheduleTransition) -> bool:
    """Did the step's prefill pass refresh the waiting requests' prefix recency (its
    pass counted, at a multiple of the interval), with nothing retracted after it?"""
    pre, post = t.pre.sglang, t.post.sglang
    if pre is None or post is None or pre.prefill_passes is None:
        return False
    return (
        post.prefill_passes == pre.prefill_passes + 1
        and pass_refreshes(pre.prefill_passes)
        and post.eviction_order_observed
        and not t.output.preempted_req_ids
    )


def _cached_path(
    t: ScheduleTransition, rid: str, blocks_of: dict[BlockHash, tuple[int, ...]], limit: int = 0
) -> list[BlockHash]:
    """The hashes of the whole pages of the request's sequence (prompt, then outputs, as
    it waited before the step; `limit` tokens off its end) that the cache holds after the
    step, from its first page down to the first it does not: the path a match stamps."""
    request = t.pre.requests.get(rid)
    if request is None:
        return []
    tokens = (*request.prompt_token_ids, *request.output_token_ids)
    pages = extend_block_hashes([], tokens[: len(tokens) - limit], t.post.config.block_size)
    cached = next((i for i, page in enumerate(pages) if not blocks_of.get(page)), len(pages))
    return pages[:cached]


@dataclass(frozen=True)
class _Refresh:
    """What a refreshing pass did to the evictable blocks' access times, as far as the
    state tells. `owner`: each evictable block on a refreshed path, with the place of the
    foremost waiting request whose path holds it (the refresh's last stamp on it).
    `newest`: the most recent place each of those blocks may stand at, -1 for after the
    whole refresh. A match that ends inside a radix node splits it and gives the tail a
    fresh access time, so a block below the end of any match may be as recent as that
    match: the refresh's (its request's place), or admission's after it (-1). The state
    has no node boundaries, so every block below a match's end is taken as possibly
    split there."""

    owner: dict[int, int]
    newest: dict[int, int]


def _refresh(t: ScheduleTransition) -> _Refresh:
    if not _refreshed(t):
        return _Refresh({}, {})
    blocks_of = dict(t.post.kv.prefix_cache)
    evictable = set(_evictable_order(t.post))
    refreshed = t.pre.waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]
    owner: dict[int, int] = {}
    above: dict[int, list[BlockHash]] = {}  # each owned block's ancestor pages
    ends: dict[BlockHash, int] = {}  # a match's last page, with the latest such match
    for place, rid in enumerate(refreshed):
        path = _cached_path(t, rid, blocks_of)
        for depth, page in enumerate(path):
            for block in blocks_of[page]:
                if block in evictable and block not in owner:
                    owner[block] = place
                    above[block] = path[:depth]
        if path:
            ends.setdefault(path[-1], place)
    # Admission's matches after the refresh leave out the last token: the requests the
    # pass admitted, and the first it left waiting, which it may have tried.
    tried = [rid for rid in t.pre.waiting if rid in t.admitted_ids]
    tried += [rid for rid in t.post.waiting[:1] if rid in t.pre.requests]
    for rid in tried:
        path = _cached_path(t, rid, blocks_of, limit=1)
        if path:
            ends[path[-1]] = -1
    newest = {
        block: min([place, *(ends[up] for up in above[block] if up in ends)])
        for block, place in owner.items()
    }
    return _Refresh(owner, newest)


def refreshed_pages(t: ScheduleTransition) -> dict[int, int]:
    """After a step that refreshed the waiting requests' prefixes (else empty): each
    evictable block on the cached path of a request waiting when the pass began, from
    the first 128, with the queue place of the foremost such request. A request the pass
    then admitted counts: the refresh stamped its whole path first, and its admission's
    match, which leaves out the last token, locks (and stamps again) all of it but the
    page that token ends, which stays evictable at its place's recency (a one-page
    prompt locks nothing, so a first page it shares with a request further back keeps
    the admitted request's place)."""
    return _refresh(t).owner


def _refresh_order(t: ScheduleTransition) -> list[Violation]:
    """The refresh matches the first waiting requests' prefixes tail first, stamping each
    path at one tick, so a block on those paths is at least as recent as the foremost
    waiting request whose path holds it (later stamps only make it more recent), and at
    most as recent as its `newest` place (splits). The LRU evicts a block only once it is
    a leaf: so an evictable block `b` that goes after a block `a` that is surely more
    recent than anything `b` may be (a's owner ahead of b's newest place) breaks the order.
    Nothing under `b` can excuse it: a block below `b` is owned by a request whose path
    holds `b`, so no further ahead than b's owner, and a split below `b` is a match
    through `b`, by a request behind a's owner or by admission's (which locks `b`, or is
    the request below, whose path is not judged)."""
    refresh = _refresh(t)
    owner = refresh.owner
    # The first request the pass left waiting, behind requests it admitted, may have been
    # tried after the refresh: its match then stamped its path last, more recent than any
    # page a request ahead left unlocked (a one-page prompt locks nothing). Whether the
    # pass tried it the state does not say, so no block on its path is judged. (At the
    # head of the queue, place 0, its path is the most recent either way.)
    if t.post.waiting and t.post.waiting[0] in t.pre.waiting[1:]:
        blocks_of = dict(t.post.kv.prefix_cache)
        for page in _cached_path(t, t.post.waiting[0], blocks_of):
            for block in blocks_of[page]:
                owner.pop(block, None)
    if len(set(owner.values())) < 2:
        return []
    newest_seen: int | None = None  # of the blocks evicted so far, the foremost owner's
    for block in _evictable_order(t.post):
        if block not in owner:
            continue
        if newest_seen is not None and owner[newest_seen] < refresh.newest[block]:
            return [
                Violation(
                    "SG-EVICT-ORDER",
                    "after a waiting-prefix refresh, refreshed pages not in reverse queue "
                    f"order: block {newest_seen} (place {owner[newest_seen]}) is evicted "
                    f"before block {block} (place {owner[block]})",
                    expected=(block, newest_seen),
                    actual=(newest_seen, block),
                )
            ]
        if newest_seen is None or owner[block] < owner[newest_seen]:
            newest_seen = block
    return []


@invariant(
    "SG-EVICT-ORDER",
    "schedule",
    "sglang",
    "The radix cache's eviction order: free_block_ids lists the allocator's free slots (no "
    "hash) before the evictable ones, and a step that matches no prefix (nothing waiting, "
    "nothing chunked) and retracts nothing evicts only evictable blocks, the first ones of "
    "that evictable order (least recently used leaf first) where the engine exposes the order. "
    "After a step whose prefill pass refreshed the waiting requests' prefixes (and that "
    "retracted nothing), the evictable blocks on a waiting request's cached path come in "
    "reverse queue order: the pages of requests further back are evicted first.",
)
def check_evict_order(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    for state in (t.pre, t.post):
        free = state.kv.free_block_ids
        hashes = state.kv.block_hashes
        first_cached = next((i for i, b in enumerate(free) if hashes[b] is not None), len(free))
        stray = [b for b in free[first_cached:] if hashes[b] is None]
        if stray:
            out.append(
                Violation(
                    "SG-EVICT-ORDER",
                    "a free slot without a hash after evictable ones",
                    expected=f"no unhashed slot after index {first_cached}",
                    actual=stray,
                )
            )
            return out
    policy = t.pre.sglang
    if policy is None:
        return missing_policy_state("SG-EVICT-ORDER")
    out += _refresh_order(t)
    # A match refreshes recency, and a retraction unlocks its victim's prefix (then
    # evicts), both before the step evicts: the pre state's order no longer applies.
    if t.pre.waiting or policy.chunked_request_id is not None or t.output.preempted_req_ids:
        return out
    before = t.pre.kv.block_hashes
    after = t.post.kv.block_hashes
    evicted = {b for b, h in enumerate(before) if h is not None and after[b] != h}
    order = _evictable_order(t.pre)
    if not evicted:
        return out
    stray_evictions = evicted - set(order)
    if stray_evictions:
        out.append(
            Violation(
                "SG-EVICT-ORDER",
                "evicted blocks that were not evictable (held, or without a hash)",
                expected=tuple(order),
                actual=tuple(sorted(stray_evictions)),
            )
        )
    elif policy.eviction_order_observed and set(order[: len(evicted)]) != evicted:
        out.append(
            Violation(
                "SG-EVICT-ORDER",
                "evicted blocks are not the first of the eviction order",
                expected=tuple(order[: len(evicted)]),
                actual=tuple(sorted(evicted)),
            )
        )
    return out
