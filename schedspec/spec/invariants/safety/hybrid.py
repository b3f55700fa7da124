"""Safety over hybrid KV cache groups (docs/SPEC.md, "Hybrid KV cache groups"): each
request's per-group tables, the null block, window frees, coverage in every group, and
prefix hits every group backs. Checked only on configs with kv_cache_groups; the
single group's tables are CONSERVATION's, KV-COVER's and CACHE-CONTENT's."""

from __future__ import annotations

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    ChunkedLocalGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    group_block_hashes,
    num_skipped_tokens,
)
from schedspec.spec.state import RequestState, State


def _flat(tables: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return tuple(b for table in tables for b in table if b != NULL_BLOCK_ID)


@invariant(
    "HYBRID-TABLES",
    "state",
    "safety",
    "With kv_cache_groups, each live request has one block table per group, in group "
    "order; an entry is a block of the pool or the null block; block_ids lists the "
    "non-null entries, group 0's first; and no block sits twice among a request's tables "
    "(one group's new block is never another group's hit, vLLM #33775).",
    groups="hybrid",
)
def check_hybrid_tables(state: State) -> list[Violation]:
    groups = len(state.config.kv_cache_groups)
    num_blocks = state.kv.num_blocks
    out: list[Violation] = []
    for rid, request in state.requests.items():
        tables = request.group_block_ids
        if len(tables) != groups:
            out.append(
                Violation(
                    "HYBRID-TABLES", "one table per group", rid, expected=groups, actual=len(tables)
                )
            )
            continue
        for gid, table in enumerate(tables):
            for index, block in enumerate(table):
                if block != NULL_BLOCK_ID and not 0 <= block < num_blocks:
                    out.append(
                        Violation(
                            "HYBRID-TABLES",
                            f"group {gid}, index {index}: not a block of the pool nor the null "
                            "block",
                            rid,
                            block,
                            expected=f"0..{num_blocks - 1} or {NULL_BLOCK_ID}",
                            actual=block,
                        )
                    )
        flat = _flat(tables)
        if request.block_ids != flat:
            out.append(
                Violation(
                    "HYBRID-TABLES",
                    "block_ids are not the tables' non-null blocks in group order",
                    rid,
                    expected=flat,
                    actual=request.block_ids,
                )
            )
        seen: set[int] = set()
        for block in flat:
            if block in seen:
                out.append(
                    Violation(
                        "HYBRID-TABLES",
                        "a block sits twice among the request's tables",
                        rid,
                        block,
                        expected=1,
                        actual=flat.count(block),
                    )
                )
            seen.add(block)
    return out


@invariant(
    "NULL-BLOCK",
    "schedule",
    "safety",
    "With kv_cache_groups, the null block (NULL_BLOCK_ID) is never handed out (in no "
    "block id of the output), never freed (not in the free queue) and never cached (no "
    "prefix-cache entry holds it).",
    groups="hybrid",
)
def check_null_block(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    for new in t.output.scheduled_new_reqs:
        if NULL_BLOCK_ID in new.block_ids:
            out.append(_null("handed out to a new request", new.request_id, new.block_ids))
    for cached in t.output.scheduled_cached_reqs:
        if NULL_BLOCK_ID in cached.new_block_ids:
            out.append(_null("handed out as a new block", cached.request_id, cached.new_block_ids))
    kv = t.post.kv
    if NULL_BLOCK_ID in kv.free_block_ids:
        out.append(_null("freed into the free queue", None, kv.free_block_ids))
    for block_hash, holders in kv.prefix_cache:
        if NULL_BLOCK_ID in holders:
            out.append(_null(f"cached under hash {block_hash}", None, holders))
    return out


def _null(where: str, request_id: str | None, ids: tuple[int, ...]) -> Violation:
    return Violation(
        "NULL-BLOCK",
        f"the null block {where}",
        request_id,
        NULL_BLOCK_ID,
        expected="no null block",
        actual=ids,
    )


def _scheduled(t: ScheduleTransition) -> list[RequestState]:
    """The requests the step scheduled that are live after it, with a table per group."""
    groups = len(t.post.config.kv_cache_groups)
    scheduled = (t.post.requests.get(rid) for rid in t.output.num_scheduled_tokens)
    return [r for r in scheduled if r is not None and len(r.group_block_ids) == groups]


def _windowed(group: KVCacheGroupSpec) -> bool:
    return isinstance(group, SlidingWindowGroup | ChunkedLocalGroup)


@invariant(
    "WINDOW-FREED",
    "schedule",
    "safety",
    "With kv_cache_groups, after schedule() a scheduled request's sliding-window and "
    "chunked-local tables hold the null block for every block wholly inside the group's "
    "skipped prefix of its processed tokens (computed less in flight), and a block for "
    "every later one up to its computed and scheduled tokens: no block outside the window "
    "is kept past processing, none inside it is dropped.",
    groups="hybrid",
)
def check_window_freed(t: ScheduleTransition) -> list[Violation]:
    groups = t.post.config.kv_cache_groups
    out: list[Violation] = []
    for post in _scheduled(t):
        rid = post.request_id
        processed = post.num_computed_tokens - post.num_in_flight_tokens
        for gid, group in enumerate(groups):
            if not _windowed(group):
                continue
            table = post.group_block_ids[gid]
            freed = num_skipped_tokens(group, processed) // group.block_size
            needed = cdiv(post.num_computed_tokens, group.block_size)
            for index, block in enumerate(table[:needed]):
                if index < freed and block != NULL_BLOCK_ID:
                    message = "a block wholly before the window kept past processing"
                    expected: object = NULL_BLOCK_ID
                elif index >= freed and block == NULL_BLOCK_ID:
                    message = "a block inside the window dropped"
                    expected = "a block"
                else:
                    continue
                out.append(
                    Violation(
                        "WINDOW-FREED",
                        f"group {gid}, index {index} ({processed} tokens processed): {message}",
                        rid,
                        block if block != NULL_BLOCK_ID else None,
                        expected=expected,
                        actual=block,
                    )
                )
    return out


@invariant(
    "HYBRID-COVER",
    "schedule",
    "safety",
    "With kv_cache_groups, after schedule() every scheduled request has its slots in every "
    "group (an allocation is all or nothing across groups): each table reaches its computed "
    "and scheduled tokens at the group's block size, and a Mamba group in align mode holds "
    "a block for the state after them (at their last block, or later where rejected drafts "
    "left the table longer).",
    groups="hybrid",
)
def check_hybrid_cover(t: ScheduleTransition) -> list[Violation]:
    groups = t.post.config.kv_cache_groups
    out: list[Violation] = []
    for post in _scheduled(t):
        rid = post.request_id
        for gid, group in enumerate(groups):
            table = post.group_block_ids[gid]
            needed = cdiv(post.num_computed_tokens, group.block_size)
            if len(table) < needed:
                out.append(
                    Violation(
                        "HYBRID-COVER",
                        f"group {gid} does not cover {post.num_computed_tokens} tokens",
                        rid,
                        expected=needed,
                        actual=len(table),
                    )
                )
            elif _aligned_mamba(group) and needed and set(table[needed - 1 :]) <= {NULL_BLOCK_ID}:
                out.append(
                    Violation(
                        "HYBRID-COVER",
                        f"group {gid}: no block for the state after "
                        f"{post.num_computed_tokens} tokens",
                        rid,
                        expected="a block",
                        actual=NULL_BLOCK_ID,
                    )
                )
    return out


def _aligned_mamba(group: KVCacheGroupSpec) -> bool:
    return isinstance(group, MambaGroup) and group.mamba_cache_mode == "align"


@invariant(
    "HYBRID-HIT",
    "schedule",
    "safety",
    "With kv_cache_groups, an admission's prefix hit ends on a scheduler-block boundary, "
    "never covers the last token, and every group backs it: each block the group still "
    "reads within the hit (full attention: all; a window or chunk: those past its skipped "
    "prefix; Mamba: the state at the hit's end) is a cached block holding that group's "
    "hash of the request's own tokens (so the hit is no longer than any group's own hit, "
    "vLLM #46453).",
    groups="hybrid",
)
def check_hybrid_hit(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    out: list[Violation] = []
    for rid in t.admitted:
        hit = t.computed_before.get(rid, 0)
        post = t.post.requests.get(rid)
        if not hit or post is None or post.remote_kv is not None:
            continue
        if hit % config.block_size or hit > post.num_tokens - 1:
            out.append(
                Violation(
                    "HYBRID-HIT",
                    f"hit of {hit} tokens: not whole scheduler blocks of "
                    f"{config.block_size} below the last token",
                    rid,
                    expected=f"a multiple of {config.block_size} <= {post.num_tokens - 1}",
                    actual=hit,
                )
            )
            continue
        out += _unbacked_hit(t.post, config, post, hit)
    return out


def _unbacked_hit(
    state: State, config: SchedulerConfig, request: RequestState, hit: int
) -> list[Violation]:
    groups = config.kv_cache_groups
    if len(request.group_block_ids) != len(groups):
        return []
    tokens = request.prompt_token_ids + request.output_token_ids
    own = group_block_hashes(tokens[:hit], groups)
    carried = state.kv.block_hashes
    out: list[Violation] = []
    for gid, group in enumerate(groups):
        table = request.group_block_ids[gid]
        last = hit // group.block_size
        # A Mamba state stands for its whole prefix: only the one at the hit's end counts.
        if isinstance(group, MambaGroup):
            first = last - 1
        else:
            first = num_skipped_tokens(group, hit) // group.block_size
        for index in range(first, last):
            block = table[index] if index < len(table) else NULL_BLOCK_ID
            held = carried[block] if 0 <= block < len(carried) else None
            if held != own[gid][index]:
                out.append(
                    Violation(
                        "HYBRID-HIT",
                        f"group {gid}, index {index}: the hit of {hit} tokens is not backed "
                        "by a cached block of the request's own content",
                        request.request_id,
                        block if block != NULL_BLOCK_ID else None,
                        expected=own[gid][index],
                        actual="no block" if block == NULL_BLOCK_ID else held or "no hash",
                    )
                )
    return out
