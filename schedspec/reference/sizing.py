"""The scheduler's arithmetic: token counts, block counts, draft rollback.

Pure functions of ints, kept apart from the stateful scheduler so that
CrossHair can check their contracts over every input (`crosshair check
schedspec/reference/sizing.py`, run by .ci/run). The contracts are PEP 316
docstring conditions: `pre:` what a caller guarantees, `post:` what the
function promises (`__return__` is its result). Each function's `Supports:`
line names the invariants of docs/SPEC.md whose local half its `post:`
conditions state; docs/SPEC.md's CrossHair column lists them back.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: blocks of size b that hold a tokens.

    Supports: KV-COVER.

    pre: a >= 0
    pre: b > 0
    post: __return__ * b >= a
    post: (__return__ - 1) * b < a
    """
    return -(-a // b)


def apply_long_prefill_cap(num_tokens: int, cap: int) -> int:
    """num_tokens cut to the long-prefill cap; cap 0 means no cap (a lone request).

    A capped step never passes the cap, an uncapped one is untouched.
    Supports: GREEDY-BUDGET.
    pre: num_tokens >= 0
    pre: cap >= 0
    post: __return__ <= num_tokens
    post: cap == 0 or __return__ <= cap
    post: __return__ == num_tokens or __return__ == cap
    """
    return cap if 0 < cap < num_tokens else num_tokens


def running_new_tokens(num_remaining: int, cap: int, token_budget: int, room: int) -> int:
    """Tokens a running request advances: its remaining known and draft tokens, cut
    by the long-prefill cap, the step's budget left, and the room before max_model_len.

    Never more than the budget left; never past the known tokens and drafts, nor
    past max_model_len - 1 (room).
    Supports: BUDGET, NO-OVERSHOOT, GREEDY-BUDGET.
    pre: num_remaining >= 0
    pre: cap >= 0
    pre: token_budget > 0
    pre: room >= 0
    post: 0 <= __return__ <= token_budget
    post: __return__ <= num_remaining and __return__ <= room
    post: cap == 0 or __return__ <= cap
    post: __return__ > 0 or num_remaining == 0 or room == 0
    """
    # Comparisons, not min(): this runs per running request per step, and the builtin's
    # call costs several times the tests.
    num_new = apply_long_prefill_cap(num_remaining, cap)
    if num_new > token_budget:
        num_new = token_budget
    return num_new if num_new <= room else room


def max_prefix_hit_blocks(num_tokens: int, block_size: int) -> int:
    """The most whole blocks a prefix-cache hit may cover: never the last token's,
    whose logits are what the step computes.

    Never the last token, and the longest such prefix.
    Supports: CACHE-CONTENT.
    pre: num_tokens >= 1
    pre: block_size > 0
    post: __return__ >= 0
    post: __return__ * block_size < num_tokens
    post: (__return__ + 1) * block_size >= num_tokens
    """
    return (num_tokens - 1) // block_size


def num_slots(total_computed: int, num_new: int, num_lookahead: int, max_model_len: int) -> int:
    """KV slots a request needs after a step: its computed tokens (prefix hit
    included) + new + lookahead tokens, capped at max_model_len (lookahead
    never asks past it).

    Every scheduled token has a slot.
    Supports: KV-COVER.
    pre: total_computed >= 0 and num_new >= 0 and num_lookahead >= 0
    pre: total_computed + num_new <= max_model_len
    post: total_computed + num_new <= __return__ <= max_model_len
    post: __return__ <= total_computed + num_new + num_lookahead
    """
    slots = total_computed + num_new + num_lookahead
    return slots if slots <= max_model_len else max_model_len  # not min(): per request per step


def blocks_to_allocate(held: int, tokens: int, hits: int, evictable: int, size: int) -> int:
    """Free blocks consumed to give a request holding `held` blocks, plus `hits`
    prefix-hit blocks (`evictable` of them in the free queue), slots for
    `tokens` tokens in blocks of `size`.

    After taking __return__ free blocks the table
    covers tokens with no block to spare; hits on free blocks are charged,
    hits on held ones are not. max(.., 0): rejected drafts can leave a table
    longer than it needs to be.
    Supports: CONSERVATION, KV-COVER.
    pre: held >= 0 and tokens >= 0 and size > 0
    pre: 0 <= evictable <= hits
    post: __return__ >= evictable
    post: (held + hits + __return__ - evictable) * size >= tokens
    post: __return__ == evictable or (held + hits + __return__ - evictable - 1) * size < tokens
    """
    missing = cdiv(tokens, size) - held - hits
    return max(missing, 0) + evictable


def num_drafts_to_schedule(num_new: int, num_computed: int, num_tokens: int) -> int:
    """Drafts that ride in a step advancing num_new tokens from num_computed:
    those past the known tokens. A step cut short of them (budget, cap) carries none.

    Drafts only on a step that reaches past every known token.
    Supports: DRAFTS.
    pre: num_new >= 0 and 0 <= num_computed <= num_tokens
    post: 0 <= __return__ <= num_new
    post: __return__ == 0 or num_computed + num_new - __return__ == num_tokens
    """
    return max(num_new + num_computed - num_tokens, 0)


def sure_to_reach_max_tokens(
    computed: int, placeholders: int, prompt: int, max_tokens: int
) -> bool:
    """Async scheduling: is a request whose sampling step is in flight sure to reach
    max_tokens once that step's output arrives, even if all its drafts are rejected?

    `computed` counts the in-flight step's tokens and `placeholders` its 1 +
    drafts output positions, so computed + 1 - (placeholders - 1) is the token
    count (prompt included) the request is sure to have then. Scheduling it again
    would only compute a position past max_tokens (vLLM PR #27922).
    Supports: MAX-TOKENS.
    pre: computed >= 0 and placeholders >= 0 and prompt >= 1 and max_tokens >= 1
    post: not __return__ or placeholders > 0
    post: not __return__ or computed + 1 - (placeholders - 1) >= prompt + max_tokens
    post: __return__ or placeholders == 0 or computed + 2 < prompt + max_tokens + placeholders
    """
    return placeholders > 0 and computed + 2 - placeholders >= prompt + max_tokens


def padded_admission_tokens(
    num_new: int, num_computed: int, num_spec: int, max_model_len: int
) -> int:
    """Spec-decode padding: a waiting request with exactly one token to compute
    is scheduled as 1 + num_spec tokens (num_spec placeholder drafts) when the
    padded step still leaves room for the token it samples below max_model_len.
    Returns the padded count, or 0 when the request is not padded.

    Padding only ever turns exactly one token into 1 + num_spec, within max_model_len.
    Supports: DRAFTS.
    pre: num_new >= 1 and num_computed >= 0 and num_spec >= 0 and max_model_len >= 2
    post: __return__ == 0 or (num_new == 1 and __return__ == 1 + num_spec)
    post: __return__ == 0 or num_computed + __return__ + 1 <= max_model_len
    """
    if num_spec == 0 or num_new != 1 or num_computed + 1 + num_spec + 1 > max_model_len:
        return 0
    return 1 + num_spec


def rolled_back_computed(num_computed: int, num_drafts: int, num_sampled: int) -> int:
    """num_computed_tokens after the model answered a step that verified
    num_drafts drafts with num_sampled tokens (1 + the accepted drafts).

    Rejected drafts' KV is not computed; accepted ones' is.
    Supports: ROLLBACK.
    pre: num_drafts >= 0 and num_computed >= num_drafts
    pre: 1 <= num_sampled <= num_drafts + 1
    post: num_computed - num_drafts <= __return__ <= num_computed
    post: (__return__ == num_computed) == (num_sampled == num_drafts + 1)
    """
    return num_computed - (num_drafts - (num_sampled - 1))
