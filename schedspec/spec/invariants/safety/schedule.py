"""Safety invariants of one schedule() call: pre --schedule()--> post."""

from __future__ import annotations

from schedspec.spec.block_hash import BlockHash
from schedspec.spec.invariants.registry import (
    FieldCheck,
    Violation,
    field_violations,
    holds_nothing,
    invariant,
)
from schedspec.spec.invariants.safety.connector import connector_in_play, is_load
from schedspec.spec.invariants.transitions import ChainHashes, ScheduleTransition
from schedspec.spec.request import PLACEHOLDER_TOKEN_ID, RequestStatus
from schedspec.spec.state import KVState, RequestState


@invariant(
    "BUDGET",
    "schedule",
    "safety",
    "sum(num_scheduled_tokens) <= max_num_batched_tokens and equals "
    "total_num_scheduled_tokens; every entry is > 0 and names a running request.",
)
def check_budget(t: ScheduleTransition) -> list[Violation]:
    scheduled = t.output.num_scheduled_tokens
    total = sum(scheduled.values())
    budget = t.post.config.max_num_batched_tokens
    out: list[Violation] = []
    if total > budget:
        out.append(
            Violation(
                "BUDGET", "step over the token budget", None, None, expected=budget, actual=total
            )
        )
    if total != t.output.total_num_scheduled_tokens:
        out.append(
            Violation(
                "BUDGET",
                "total_num_scheduled_tokens is not the sum of the entries",
                expected=total,
                actual=t.output.total_num_scheduled_tokens,
            )
        )
    running = set(t.post.running)
    for rid, num in scheduled.items():
        if num <= 0:
            out.append(
                Violation("BUDGET", f"scheduled {num} tokens", rid, expected="> 0", actual=num)
            )
        if rid not in running:
            out.append(
                Violation(
                    "BUDGET",
                    "scheduled but not running",
                    rid,
                    expected="in running",
                    actual=t.post.queue_of(rid),
                )
            )
    return out


@invariant(
    "NO-OVERSHOOT",
    "schedule",
    "safety",
    "A scheduled request never runs past its known tokens, in-flight output positions and "
    "drafts (computed + scheduled <= num_tokens_with_spec + num_output_placeholders; a "
    "padded admission counts its placeholder drafts) and leaves room below max_model_len "
    "for the token the step samples.",
)
def check_no_overshoot(t: ScheduleTransition) -> list[Violation]:
    before = t.computed_before
    last_position = t.post.config.max_model_len - 1
    out: list[Violation] = []
    for rid, num in t.output.num_scheduled_tokens.items():
        pre = t.pre.requests.get(rid)
        if pre is None or rid not in before:
            continue  # BUDGET / OUTPUT report these
        end = before[rid] + num
        limit = pre.num_tokens_with_spec + pre.num_output_placeholders
        if is_padded_admission(t, pre):
            limit = pre.num_tokens + len(t.output.scheduled_spec_decode_tokens[rid])
        if end > limit:
            out.append(
                Violation(
                    "NO-OVERSHOOT",
                    "past the known tokens and drafts (in-flight outputs counted)",
                    rid,
                    None,
                    expected=limit,
                    actual=end,
                )
            )
        if end > last_position:
            out.append(
                Violation(
                    "NO-OVERSHOOT",
                    "no room for the sampled token below max_model_len",
                    rid,
                    None,
                    expected=last_position,
                    actual=end,
                )
            )
    return out


@invariant(
    "KV-COVER",
    "schedule",
    "safety",
    "After schedule(), each scheduled request's block table covers its computed and "
    "scheduled tokens plus the lookahead slots, capped at max_model_len.",
    groups="single",
)
def check_kv_cover(t: ScheduleTransition) -> list[Violation]:
    config = t.post.config
    out: list[Violation] = []
    for rid in t.output.num_scheduled_tokens:
        post = t.post.requests.get(rid)
        if post is None:
            continue
        needed = min(post.num_computed_tokens + config.lookahead_tokens, config.max_model_len)
        slots = len(post.block_ids) * config.block_size
        if slots < needed:
            out.append(
                Violation("KV-COVER", "table too short", rid, None, expected=needed, actual=slots)
            )
    return out


@invariant(
    "MONOTONE",
    "schedule",
    "safety",
    "schedule() moves num_computed_tokens only forward, by exactly the tokens scheduled (from "
    "the prefix-cache hit for an admitted request); preemption is the only way to 0.",
)
def check_monotone_schedule(t: ScheduleTransition) -> list[Violation]:
    before = t.computed_before
    scheduled = t.output.num_scheduled_tokens
    out: list[Violation] = []
    for rid, post in t.post.requests.items():
        pre = t.pre.requests.get(rid)
        if pre is post and rid not in scheduled:
            continue  # the very record, of a request the step did not run: count kept
        if pre is None:
            out.append(
                Violation(
                    "MONOTONE",
                    "appeared during schedule()",
                    rid,
                    expected="absent (add_request adds)",
                    actual=post.status.name,
                )
            )
            continue
        if rid in t.output.preempted_req_ids:
            continue  # PREEMPT-RESET covers the reset
        if rid not in scheduled and is_load(t.pre, t.post, rid):
            continue  # LOAD-PARKED, LOAD-PROMOTION and LOAD-FAILURE judge a load's count
        if rid in scheduled and rid in before:
            expected = before[rid] + scheduled[rid]
            if pre.status is RequestStatus.RUNNING and before[rid] != pre.num_computed_tokens:
                out.append(
                    Violation(
                        "MONOTONE",
                        "reported computed count is not the state's",
                        rid,
                        None,
                        expected=pre.num_computed_tokens,
                        actual=before[rid],
                    )
                )
        else:
            expected = pre.num_computed_tokens
        if post.num_computed_tokens != expected:
            out.append(
                Violation(
                    "MONOTONE",
                    "num_computed_tokens moved by other than the tokens scheduled",
                    rid,
                    None,
                    expected=expected,
                    actual=post.num_computed_tokens,
                )
            )
    return out


def is_padded_admission(t: ScheduleTransition, pre: RequestState) -> bool:
    """Spec-decode padding: an admission (its drafts cannot be proposed ones: a
    waiting request has none) whose scheduled drafts are all placeholders."""
    drafts = t.output.scheduled_spec_decode_tokens.get(pre.request_id, ())
    return (
        pre.status is not RequestStatus.RUNNING
        and bool(drafts)
        and all(d == PLACEHOLDER_TOKEN_ID for d in drafts)
    )


@invariant(
    "DRAFTS",
    "schedule",
    "safety",
    "Scheduled drafts are a prefix of the request's drafts (placeholders included), at most "
    "num_speculative_tokens, and ride only past all known tokens and in-flight output "
    "positions (never on a prefill chunk); a padded admission (pad_spec_decode) has exactly "
    "one token to compute and carries num_speculative_tokens placeholder drafts. Drafts are "
    "consumed: a scheduled request leaves schedule() with none, or with async scheduling "
    "with num_speculative_tokens placeholders if its step samples.",
)
def check_drafts(t: ScheduleTransition) -> list[Violation]:
    before = t.computed_before
    config = t.post.config
    limit = config.num_speculative_tokens
    out: list[Violation] = []
    for rid, drafts in t.output.scheduled_spec_decode_tokens.items():
        pre = t.pre.requests.get(rid)
        num = t.output.num_scheduled_tokens.get(rid)
        if pre is None or num is None or rid not in before:
            out.append(
                Violation(
                    "DRAFTS",
                    "drafts for a request not scheduled",
                    rid,
                    expected="no drafts",
                    actual=len(drafts),
                )
            )
            continue
        padded = is_padded_admission(t, pre)
        if padded:
            if not config.pad_spec_decode or len(drafts) != limit or num != 1 + limit:
                out.append(
                    Violation(
                        "DRAFTS",
                        "placeholder drafts on an admission that is not a padding of one "
                        "token to 1 + num_speculative_tokens",
                        rid,
                        None,
                        expected=1 + limit if config.pad_spec_decode else 0,
                        actual=num,
                    )
                )
        elif tuple(drafts) != pre.spec_token_ids[: len(drafts)]:
            out.append(
                Violation(
                    "DRAFTS",
                    "not a prefix of the proposed drafts",
                    rid,
                    None,
                    expected=pre.spec_token_ids,
                    actual=tuple(drafts),
                )
            )
        if len(drafts) > limit or not drafts:
            out.append(
                Violation(
                    "DRAFTS",
                    "draft count out of range",
                    rid,
                    None,
                    expected=limit,
                    actual=len(drafts),
                )
            )
        known = pre.num_tokens + (0 if padded else pre.num_output_placeholders)
        if before[rid] + num - len(drafts) != known:
            out.append(
                Violation(
                    "DRAFTS",
                    "drafts scheduled before the known tokens are done",
                    rid,
                    None,
                    expected=known,
                    actual=before[rid] + num - len(drafts),
                )
            )
    placeholders = (PLACEHOLDER_TOKEN_ID,) * limit
    for rid in t.output.num_scheduled_tokens:
        post = t.post.requests.get(rid)
        if post is None:
            continue
        expected = placeholders if config.async_scheduling and not post.is_prefill_chunk else ()
        if post.spec_token_ids != expected:
            out.append(
                Violation(
                    "DRAFTS",
                    "drafts not consumed by the step",
                    rid,
                    None,
                    expected=expected,
                    actual=post.spec_token_ids,
                )
            )
    return out


@invariant(
    "PREEMPT-RESET",
    "schedule",
    "safety",
    "A preempted request was running, is not scheduled, and is now PREEMPTED in the waiting "
    "queue with num_computed_tokens 0, no blocks, no drafts, no output placeholders, all its "
    "in-flight output stale, and num_preemptions one higher.",
)
def check_preempt_reset(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    waiting = set(t.post.waiting)
    for rid in t.output.preempted_req_ids:
        pre = t.pre.requests.get(rid)
        post = t.post.requests.get(rid)
        if pre is None or post is None:
            out.append(
                Violation(
                    "PREEMPT-RESET",
                    "preempted request is not live",
                    rid,
                    expected="live before and after",
                    actual=f"live before: {pre is not None}, after: {post is not None}",
                )
            )
            continue
        if pre.status is not RequestStatus.RUNNING:
            out.append(
                Violation(
                    "PREEMPT-RESET",
                    f"preempted while {pre.status.name}",
                    rid,
                    expected=RequestStatus.RUNNING.name,
                    actual=pre.status.name,
                )
            )
        if rid in t.output.num_scheduled_tokens:
            out.append(
                Violation(
                    "PREEMPT-RESET",
                    "preempted and scheduled in one step",
                    rid,
                    expected="not scheduled",
                    actual=t.output.num_scheduled_tokens[rid],
                )
            )
        out += field_violations(
            "PREEMPT-RESET",
            "not reset",
            rid,
            [
                FieldCheck("status", RequestStatus.PREEMPTED.name, post.status.name),
                *holds_nothing(post),
                FieldCheck("spec_token_ids", (), tuple(post.spec_token_ids)),
                FieldCheck("num_output_placeholders", 0, post.num_output_placeholders),
                FieldCheck(
                    "num_stale_output_tokens",
                    pre.num_in_flight_tokens,
                    post.num_stale_output_tokens,
                ),
                FieldCheck(
                    "queue", "waiting", "waiting" if rid in waiting else t.post.queue_of(rid)
                ),
            ],
        )
        if post.num_preemptions != pre.num_preemptions + 1:
            out.append(
                Violation(
                    "PREEMPT-RESET",
                    "num_preemptions not raised by one",
                    rid,
                    None,
                    expected=pre.num_preemptions + 1,
                    actual=post.num_preemptions,
                )
            )
    return out


@invariant(
    "OUTPUT",
    "schedule",
    "safety",
    "SchedulerOutput tells the runner the truth: new requests were WAITING and carry their "
    "prompt and whole table; resumed ones were PREEMPTED and carry their whole table; "
    "running ones carry their computed count, their outputs (in-flight ones included) and "
    "exactly the blocks appended, where a block the runner already had may have been swapped "
    "for a cached block of the same content (SGLang's runner reads the whole table each step; "
    "vllm-v1's TABLE-GROWS forbids the swap); every scheduled request is described once.",
)
def check_output(t: ScheduleTransition) -> list[Violation]:
    out: list[Violation] = []
    described: list[str] = []
    for new in t.output.scheduled_new_reqs:
        described.append(new.request_id)
        pre = t.pre.requests.get(new.request_id)
        post = t.post.requests.get(new.request_id)
        # A KV connector's load is promoted and admitted in one schedule(): it was parked.
        if pre is None or post is None:
            out.append(
                Violation(
                    "OUTPUT",
                    "new request was not WAITING",
                    new.request_id,
                    expected="live before and after",
                    actual=f"live before: {pre is not None}, after: {post is not None}",
                )
            )
            continue
        promoted = pre.status is RequestStatus.WAITING_FOR_REMOTE_KVS and not pre.num_preemptions
        if not (pre.status is RequestStatus.WAITING or promoted):
            out.append(
                Violation(
                    "OUTPUT",
                    "new request was not WAITING",
                    new.request_id,
                    expected=RequestStatus.WAITING.name,
                    actual=pre.status.name,
                )
            )
            continue
        out += field_violations(
            "OUTPUT",
            "new request data differs from the state",
            new.request_id,
            [
                FieldCheck("prompt_token_ids", pre.prompt_token_ids, new.prompt_token_ids),
                FieldCheck("block_ids", post.block_ids, new.block_ids),
            ],
        )
    for cached in t.output.scheduled_cached_reqs:
        rid = cached.request_id
        described.append(rid)
        pre = t.pre.requests.get(rid)
        post = t.post.requests.get(rid)
        if pre is None or post is None:
            out.append(
                Violation(
                    "OUTPUT",
                    "cached request is not live",
                    rid,
                    expected="live before and after",
                    actual=f"live before: {pre is not None}, after: {post is not None}",
                )
            )
            continue
        expected_status = RequestStatus.PREEMPTED if cached.resumed else RequestStatus.RUNNING
        if pre.status is not expected_status:
            out.append(
                Violation(
                    "OUTPUT",
                    f"resumed={cached.resumed} but was {pre.status.name}",
                    rid,
                    expected=expected_status.name,
                    actual=pre.status.name,
                )
            )
            continue
        table = cached.new_block_ids if cached.resumed else pre.block_ids + cached.new_block_ids
        if t.post.config.kv_cache_groups and not cached.resumed:
            table = _hybrid_table(pre.block_ids, cached.new_block_ids, post.block_ids)
        if table != post.block_ids and not _swapped_for_same_content(t, post, table):
            out.append(
                Violation(
                    "OUTPUT",
                    "block ids do not rebuild the table",
                    rid,
                    None,
                    expected=post.block_ids,
                    actual=table,
                )
            )
        # Outputs in flight count: the runner knows them, the scheduler does not yet.
        outputs = len(pre.output_token_ids) + pre.num_output_placeholders
        if cached.num_output_tokens != outputs:
            out.append(
                Violation(
                    "OUTPUT",
                    "num_output_tokens differs",
                    rid,
                    None,
                    expected=outputs,
                    actual=cached.num_output_tokens,
                )
            )
    if sorted(described) != sorted(t.output.num_scheduled_tokens):
        out.append(
            Violation(
                "OUTPUT",
                "request data and num_scheduled_tokens name different requests",
                expected=sorted(t.output.num_scheduled_tokens),
                actual=sorted(described),
            )
        )
    return out


def _hybrid_table(
    before: tuple[int, ...], new: tuple[int, ...], after: tuple[int, ...]
) -> tuple[int, ...]:
    """A hybrid request's flat table as the runner rebuilds it: each group appends its new
    blocks to its own table and windows free blocks in place, so the flat table is the
    blocks it held (less those freed) and the new ones, in group order. Returned as
    `after` when it is that, else as what the output implies (the blocks held and the
    new ones, in that order), for the violation to show."""
    if set(new) <= set(after) and set(after) <= set(before) | set(new):
        return after
    return before + new


def _swapped_for_same_content(
    t: ScheduleTransition, post: RequestState, table: tuple[int, ...]
) -> bool:
    """The post table is `table` with some blocks replaced by cached blocks holding the
    same tokens (the chain hash of the request's tokens up to that block)."""
    if len(table) != len(post.block_ids):
        return False
    hashes = t.hashes.of(post)
    cached = t.post.kv.block_hashes
    return all(
        mine == theirs or (i < len(hashes) and cached[theirs] == hashes[i])
        for i, (mine, theirs) in enumerate(zip(table, post.block_ids, strict=True))
    )


@invariant(
    "CACHE-CONTENT",
    "schedule",
    "safety",
    "A prefix-cache hit covers whole blocks, never the last token, and each hit block's "
    "content is the request's own prefix; a block is registered in the cache only for "
    "content its holder has computed or scheduled, never for drafts or lookahead, and a "
    "block this step registered is still held, or its tokens were computed or in flight "
    "before the step (not taken back with a victim's step); every cached block a live "
    "request holds carries that request's content hash (no stale entry survives a block's "
    "reuse).",
    groups="single",
)
def check_cache_content(t: ScheduleTransition) -> list[Violation]:
    return [
        *_hits_are_own_prefix(t),
        *_registrations_are_held(t),
        *_held_blocks_carry_own_hashes(t),
    ]


def _hits_are_own_prefix(t: ScheduleTransition) -> list[Violation]:
    """CACHE-CONTENT on each admission: its hit is whole blocks short of the last token,
    and each hit block carries the request's own content hash."""
    bs = t.post.config.block_size
    before = t.computed_before
    hashes = t.post.kv.block_hashes
    out: list[Violation] = []
    for rid in t.admitted:
        post = t.post.requests.get(rid)
        if post is None or rid not in before:
            continue
        hit = before[rid]
        # A KV connector's load counts its tokens as computed: any count, whole blocks
        # or not, that leaves the last token to compute (LOAD-PROMOTION).
        loaded = t.post.config.kv_connector and post.remote_kv is not None
        if (hit % bs and not loaded) or hit > post.num_tokens - 1:
            out.append(
                Violation(
                    "CACHE-CONTENT",
                    "hit is not whole blocks short of the last token",
                    rid,
                    None,
                    expected=f"multiple of {bs}, <= {post.num_tokens - 1}",
                    actual=hit,
                )
            )
            continue
        own = t.hashes.of(post)
        for index in range(min(hit // bs, len(post.block_ids))):
            block = post.block_ids[index]
            if not 0 <= block < len(hashes):
                continue  # CONSERVATION reports ids out of range
            if hashes[block] != own[index] and not (loaded and hashes[block] is None):
                out.append(
                    Violation(
                        "CACHE-CONTENT",
                        f"hit block at index {index} holds other content",
                        rid,
                        block,
                        expected=own[index],
                        actual=hashes[block],
                    )
                )
    return out


def _registrations_are_held(t: ScheduleTransition) -> list[Violation]:
    """CACHE-CONTENT on this step's registrations: each belongs to a live holder, or to
    tokens a step scheduled before this one computes (async: a request preempted now
    whose earlier step is still in flight; that step still runs)."""
    hashes = t.post.kv.block_hashes
    pre_hashes = t.pre.kv.block_hashes
    # Most steps register nothing: one comparison of the hash tuples tells, and the
    # holders are worked out only for a step that did register.
    if hashes == pre_hashes:
        return []
    registered = [
        block
        for block, block_hash in enumerate(hashes[: len(pre_hashes)])
        if block_hash is not None and block_hash != pre_hashes[block]
    ]
    if not registered:
        return []
    bs = t.post.config.block_size
    held = {b for request in t.post.requests.values() for b in request.block_ids}
    computed_before_this_step = {
        block
        for request in t.pre.requests.values()
        for index, block in enumerate(request.block_ids)
        if (index + 1) * bs <= min(request.num_computed_tokens, request.num_tokens)
    }
    return [
        Violation(
            "CACHE-CONTENT",
            "registered by this step but held by no live request (its KV will never be computed)",
            None,
            block,
            expected="held by a live request",
            actual="held by none",
        )
        for block in registered
        if block not in held and block not in computed_before_this_step
    ]


def _held_blocks_carry_own_hashes(t: ScheduleTransition, shortcut: bool = True) -> list[Violation]:
    """CACHE-CONTENT on every cached block a live request holds: it carries that request's
    own content hash at that position, whether registered by this step (and then only
    once its tokens are known and scheduled) or before it (a reused block whose old hash
    was never evicted is a stale entry). `shortcut` False: without the unchanged-hashes
    shortcut below (the tests hold the two to the same answer)."""
    bs = t.post.config.block_size
    hashes = t.post.kv.block_hashes
    pre_hashes = t.pre.kv.block_hashes
    out: list[Violation] = []
    # Most steps register and evict nothing: then every table carries before the step
    # what it carries after, and one comparison of the hash tuples says so for all.
    unchanged = shortcut and hashes == pre_hashes
    for rid, post in t.post.requests.items():
        if not post.block_ids:
            continue  # no block to carry a hash (most waiting requests)
        if _holds_only_its_own_old_hashes(post, t.post.kv, t.pre.kv, t.hashes, unchanged):
            continue
        known = min(post.num_computed_tokens, post.num_tokens)
        before = t.pre.requests.get(rid)
        if before is not None and is_load(t.pre, t.post, rid):
            # A promoted load registers what it loaded, the last token included, which
            # it then computes again (LOAD-PROMOTION).
            known = max(known, min(before.num_computed_tokens, post.num_tokens))
        # Worked out at the first hashed block that needs it, not for every request.
        content: list[BlockHash] | None = None
        for index, block in enumerate(post.block_ids):
            if not 0 <= block < len(hashes):
                continue  # CONSERVATION reports ids out of range
            block_hash = hashes[block]
            if block_hash is None:
                continue
            fresh = block_hash != pre_hashes[block]
            if fresh and (index + 1) * bs > known:
                out.append(
                    Violation(
                        "CACHE-CONTENT",
                        f"block at index {index} registered "
                        "before its tokens are known and scheduled",
                        rid,
                        block,
                        expected=f"<= {known} tokens known",
                        actual=f"{(index + 1) * bs} tokens hashed",
                    )
                )
                continue
            content = content if content is not None else t.hashes.of(post)
            if index >= len(content) or content[index] != block_hash:
                what = "registered" if fresh else "holds a stale entry"
                out.append(
                    Violation(
                        "CACHE-CONTENT",
                        f"block at index {index} {what} under another content's hash",
                        rid,
                        block,
                        expected=content[index] if index < len(content) else "no hash",
                        actual=block_hash,
                    )
                )
    return out


def _holds_only_its_own_old_hashes(
    request: RequestState,
    post: KVState,
    pre: KVState,
    chain: ChainHashes,
    unchanged: bool = False,
) -> bool:
    """The common case of _held_blocks_carry_own_hashes, in C loops: the request's blocks
    (ids in range) carry the hashes they carried before the step (no fresh registration),
    its own content's at the leading ones and none after. False means: look block by
    block. `unchanged`: the caller saw pre's and post's hash tuples equal, so the blocks
    carry before what they carry after, and pre's side need not be read."""
    carried = post.hashes_carried(request.block_ids)
    if carried is None or (not unchanged and carried != pre.hashes_carried(request.block_ids)):
        return False
    leading = carried.index(None) if None in carried else len(carried)
    if carried.count(None) != len(carried) - leading:
        return False
    return leading == 0 or carried[:leading] == chain.of(request)[:leading]


@invariant(
    "CACHE-COMPUTED",
    "schedule",
    "safety",
    "A prefix-cache hit only covers blocks whose KV is really there for that content: "
    "computed by an earlier step, or being computed in this very step by another scheduled "
    "request (a block registered by a step that then never ran its tokens must not be hit).",
    groups="single",
)
def check_cache_computed(t: ScheduleTransition) -> list[Violation]:
    bs = t.post.config.block_size
    out: list[Violation] = []
    before = t.computed_before
    for rid in t.admitted:
        post = t.post.requests.get(rid)
        if post is None or rid not in before or before[rid] % bs:
            continue
        own = t.hashes.of(post)
        for index in range(min(before[rid] // bs, len(own), len(post.block_ids))):
            block = post.block_ids[index]
            if t.kv_written.get(block) == own[index]:
                continue
            if _computed_this_step(t, block, index, rid):
                continue
            out.append(
                Violation(
                    "CACHE-COMPUTED",
                    f"hit at index {index} on a block whose KV was never computed for this content",
                    rid,
                    block,
                    expected=f"KV written for hash {own[index]}",
                    actual=(
                        "never written"
                        if t.kv_written.get(block) is None
                        else f"KV of hash {t.kv_written.get(block)}"
                    ),
                )
            )
    return out


def _computed_this_step(t: ScheduleTransition, block: int, index: int, reader: str) -> bool:
    """Does another request scheduled in this step finish the block's KV in this very step?

    (vLLM's model runner writes every layer's KV before attention reads it,
    so a hit on a block completed earlier in the same batch is sound.)
    """
    end = (index + 1) * t.post.config.block_size
    before = t.computed_before
    for rid in t.output.num_scheduled_tokens:
        holder = t.post.requests.get(rid)
        if (
            rid != reader
            and holder is not None
            and index < len(holder.block_ids)
            and holder.block_ids[index] == block
            and before.get(rid, 0) < end <= min(holder.num_computed_tokens, holder.num_tokens)
        ):
            return True
    return False


@invariant(
    "FINISH-REPORTED",
    "schedule",
    "safety",
    "finished_req_ids reports exactly the requests that finished (stopped or aborted) since "
    "the previous schedule() began, each once (one whose pending abort ends inside a "
    "schedule() is reported by the next).",
)
def check_finish_reported(t: ScheduleTransition) -> list[Violation]:
    reported = t.output.finished_req_ids
    expected = t.finished_since_last_schedule
    if reported == expected:
        return []
    return [
        Violation(
            "FINISH-REPORTED",
            "wrong finished_req_ids",
            None,
            None,
            expected=sorted(expected),
            actual=sorted(reported),
        )
    ]


@invariant(
    "NO-EMPTY-STEP",
    "schedule",
    "safety",
    "A step schedules at least one token while any request is unfinished (its abort not "
    "pending) and nothing is in flight: every admissible request fits an empty cache, so "
    "there is always something that can run. (With a step in flight a request may rightly "
    "wait for its output; one whose abort is pending may leave in the step instead.)",
)
def check_no_empty_step(t: ScheduleTransition) -> list[Violation]:
    in_flight = any(r.num_in_flight_tokens for r in t.pre.requests.values())
    unfinished = [r for r in t.pre.requests.values() if not r.abort_pending]
    if connector_in_play(t.pre, t.post):
        return []  # loads wait for their worker: PROGRESS judges the head
    if unfinished and not in_flight and not t.output.num_scheduled_tokens:
        return [
            Violation(
                "NO-EMPTY-STEP",
                f"nothing scheduled with {len(unfinished)} unfinished requests",
                expected="> 0 tokens scheduled",
                actual=0,
            )
        ]
    return []
