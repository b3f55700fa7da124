"""The scheduler's rules for one slot, as Z3 terms: one function per rule of the reference.

Both the unrolled step (step.py) and the per-slot lemmas (parametric.py) are
built from these, so the monolithic and the parametric proofs are about the
same rules. Names follow schedspec/reference/vllm/scheduler.py, reference/sizing.py and
reference/vllm/kv_cache_manager.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from schedspec.spec.formal.encoding import (
    BoolTerm,
    Choices,
    ConfigTerms,
    IntTerm,
    Slot,
    cdiv,
    zmax,
    zmin,
)
from schedspec.spec.formal.variants import Bug, Variant


def long_prefill_cap(cfg: ConfigTerms, num_requests: IntTerm) -> IntTerm:
    """Scheduler._long_prefill_cap: the threshold only when more than one request exists,
    and under long_prefill_needs_chunked_prefill (vLLM 0.34.0) only with chunking on."""
    ignored = z3.And(cfg.cap_needs_chunked, z3.Not(cfg.chunked))
    return z3.If(z3.And(num_requests > 1, z3.Not(ignored)), cfg.threshold, 0)


def apply_cap(num_tokens: IntTerm, cap: IntTerm) -> IntTerm:
    """Scheduler._apply_cap: 0 means no cap."""
    return z3.If(z3.And(cap > 0, cap < num_tokens), cap, num_tokens)


def blocks_to_allocate(
    cfg: ConfigTerms, held: IntTerm, num_slots: IntTerm, variant: Variant
) -> IntTerm:
    """KVCacheManager._num_blocks_to_allocate with every prefix hit charged as evictable.

    A hit block taken from the free queue costs one free block, as a fresh
    one does, so the count is ceil(slots / block_size) minus what is held.
    """
    if variant.has(Bug.BLOCKS_FLOOR_DIV):
        return zmax(num_slots / cfg.block_size - held, 0)
    return zmax(cdiv(num_slots, cfg.block_size) - held, 0)


def sure_to_reach_max_tokens(slot: Slot) -> BoolTerm:
    """sizing.sure_to_reach_max_tokens: the in-flight sampling step brings the request to
    max_tokens even with all its drafts rejected (computed counts that step's tokens,
    placeholders its 1 + drafts output positions)."""
    return z3.And(slot.placeholders > 0, slot.computed + 2 - slot.placeholders >= slot.token_limit)


def skipped_as_finishing(slot: Slot, variant: Variant) -> BoolTerm:
    """_schedule_running passes over a request whose step in flight is its last (async)."""
    if variant.has(Bug.MAX_TOKENS_NOT_SKIPPED):
        return z3.BoolVal(False)
    return sure_to_reach_max_tokens(slot)


def running_num_new(cfg: ConfigTerms, cap: IntTerm, slot: Slot, budget: IntTerm) -> IntTerm:
    """_schedule_running: tokens a running request asks for this step; the output
    positions of its step in flight count as known tokens."""
    remaining = slot.tokens + slot.drafts + slot.placeholders - slot.computed
    num_new = zmin(apply_cap(remaining, cap), budget)
    # Leave room for the sampled token: positions stay below max_model_len.
    return zmin(num_new, cfg.max_model_len - 1 - slot.computed)


def running_slots_needed(cfg: ConfigTerms, slot: Slot, num_new: IntTerm) -> IntTerm:
    """allocate_slots for a running request: computed + new + lookahead, capped."""
    return zmin(slot.computed + num_new + cfg.lookahead, cfg.max_model_len)


def num_drafts_to_schedule(slot: Slot, num_new: IntTerm) -> IntTerm:
    """_schedule_drafts: the tokens past the known ones and the in-flight outputs are drafts."""
    return zmax(num_new + slot.computed - (slot.tokens + slot.placeholders), 0)


def put_in_flight(
    cfg: ConfigTerms,
    slot: Slot,
    computed_before: IntTerm,
    num_new: IntTerm,
    num_drafts: IntTerm,
    variant: Variant,
) -> Slot:
    """_update_after_schedule and _add_output_placeholders for a scheduled slot: its
    tokens go in flight; a step that samples adds 1 + its drafts as output placeholders
    and leaves num_spec placeholder drafts (async), else its drafts are consumed."""
    computed = computed_before + num_new
    chunk = computed < slot.tokens + slot.placeholders
    samples_async = z3.And(cfg.async_scheduling, z3.Not(chunk))
    if variant.has(Bug.PLACEHOLDERS_NOT_ADDED):
        samples_async = z3.BoolVal(False)
    return slot.replace(
        computed=computed,
        in_flight=slot.in_flight + num_new,
        chunk=chunk,
        placeholders=slot.placeholders + z3.If(samples_async, 1 + num_drafts, 0),
        drafts=z3.If(samples_async, cfg.num_spec, 0),
    )


def admitted_waiting(slot: Slot, hit: IntTerm, plan: Admission) -> Slot:
    """A waiting request after admission, before its tokens go in flight: running,
    from its prefix hit, with a new table."""
    return slot.replace(running=z3.BoolVal(True), computed=hit, blocks=plan.need)


def charge_budget(budget: IntTerm, num_tokens: IntTerm, variant: Variant) -> IntTerm:
    """StepPlan.schedule: the tokens come out of the step's budget."""
    return budget if variant.has(Bug.BUDGET_NOT_CHARGED) else budget - num_tokens


def preempt(slot: Slot, variant: Variant) -> Slot:
    """Scheduler._preempt: drop the KV, keep the tokens, back to the waiting queue;
    output in flight becomes stale and the placeholders go."""
    return slot.replace(
        running=z3.BoolVal(False),
        computed=slot.computed if variant.has(Bug.PREEMPT_KEEPS_COMPUTED) else z3.IntVal(0),
        drafts=z3.IntVal(0),
        blocks=slot.blocks if keeps_table(variant) else z3.IntVal(0),
        stale=slot.stale if variant.has(Bug.PREEMPT_OUTPUT_NOT_STALE) else slot.in_flight,
        placeholders=(
            slot.placeholders if variant.has(Bug.PREEMPT_KEEPS_PLACEHOLDERS) else z3.IntVal(0)
        ),
        preemptions=slot.preemptions + 1,
    )


def keeps_table(variant: Variant) -> bool:
    """Bugs that leave a freed request's block table in place."""
    return variant.has(Bug.PREEMPT_KEEPS_BLOCKS) or variant.has(Bug.TABLE_KEPT_AFTER_FREE)


def freed_by_preemption(slot: Slot, variant: Variant) -> IntTerm:
    """Blocks returned to the free count (table-kept-after-free returns them and keeps them)."""
    return z3.IntVal(0) if variant.has(Bug.PREEMPT_KEEPS_BLOCKS) else slot.blocks


def seats_full(cfg: ConfigTerms, num_running: IntTerm, variant: Variant) -> BoolTerm:
    """_schedule_waiting stops admitting at max_num_seqs running requests."""
    if variant.has(Bug.SEQS_OFF_BY_ONE):
        return num_running > cfg.max_num_seqs
    return num_running >= cfg.max_num_seqs


@dataclass(frozen=True)
class Admission:
    """What _schedule_waiting decides for the request at the head of the queue."""

    skipped: BoolTerm  # stale output in flight: set aside, the loop goes on
    num_new: IntTerm  # tokens it would run
    blocked_by_budget: BoolTerm  # a padding or (chunking off) a prompt over the budget: stop
    fits: BoolTerm  # allocate_slots(full_sequence_must_fit=True) succeeds
    need: IntTerm  # free blocks it takes when admitted
    padded: BoolTerm  # spec-decode padding: 1 + num_spec tokens, num_spec placeholder drafts
    num_drafts: IntTerm  # drafts it carries (the padding's placeholders)


@dataclass(frozen=True)
class StepSoFar:
    """What the running loop leaves for the padding rule of the waiting loop."""

    served_running: BoolTerm  # some running request is scheduled in this step
    served_chunk: BoolTerm  # one of them was a prefill chunk in its previous step


def padded_tokens(cfg: ConfigTerms, num_new: IntTerm, hit: IntTerm) -> IntTerm:
    """sizing.padded_admission_tokens: 1 + num_spec for exactly one token to compute,
    if the padded positions and the token they sample fit below max_model_len; else 0."""
    pads = z3.And(cfg.num_spec > 0, num_new == 1, hit + 1 + cfg.num_spec + 1 <= cfg.max_model_len)
    return z3.If(pads, 1 + cfg.num_spec, 0)


def admission(
    cfg: ConfigTerms,
    cap: IntTerm,
    slot: Slot,
    hit: IntTerm,
    budget: IntTerm,
    free: IntTerm,
    num_running: IntTerm,
    so_far: StepSoFar,
    variant: Variant,
) -> Admission:
    # _awaits_stale_output (drop_stale_output is never set on the modelled paths).
    skipped = slot.stale > 0
    # _padded_admission: padding waits (stops the loop) rather than run unpadded,
    # and is dropped where the long-prefill cap would cut it.
    padding = padded_tokens(cfg, slot.tokens - hit, hit)
    pads = z3.And(
        cfg.pad_spec_decode,
        z3.Not(so_far.served_chunk),
        z3.Or(so_far.served_running, hit > 0),
        padding > 0,
    )
    padding_waits = z3.And(pads, padding > budget)
    padded = z3.And(pads, padding <= budget, z3.Not(z3.And(cap > 0, cap < padding)))
    uncapped = z3.If(padded, padding, apply_cap(slot.tokens - hit, cap))
    blocked = z3.Or(padding_waits, z3.And(z3.Not(cfg.chunked), uncapped > budget))
    num_new = zmin(uncapped, budget)
    # The watermark is charged only while something runs.
    watermark = z3.If(num_running > 0, cfg.watermark_blocks, 0)
    whole = blocks_to_allocate(cfg, 0, zmin(slot.tokens, cfg.max_model_len), variant)
    need = blocks_to_allocate(
        cfg, 0, zmin(hit + num_new + cfg.lookahead, cfg.max_model_len), variant
    )
    fits = z3.And(whole + watermark <= free, need + watermark <= free)
    num_drafts = z3.If(padded, cfg.num_spec, 0)
    return Admission(skipped, num_new, blocked, fits, need, padded, num_drafts)


@dataclass(frozen=True)
class Landing:
    """The step whose output lands on a slot in this engine step: its tokens for the
    slot, whether it samples for it, and the drafts it verifies."""

    num_tokens: IntTerm
    samples: BoolTerm
    num_drafts: IntTerm


def landing(
    cfg: ConfigTerms,
    pre: Slot,
    computed_before: IntTerm,
    num_scheduled: IntTerm,
    num_drafts: IntTerm,
) -> Landing:
    """Which step lands on the slot. Synchronous: the one just scheduled, which samples
    when it reaches the known tokens (sampling_requests). Async (a batch queue of two):
    the one in flight before this schedule(); its tokens are the slot's in-flight count,
    and its output positions its placeholders, 1 + drafts for a sampling step and 0
    for a prefill chunk (the drift test holds this against the reference)."""
    reaches_known = computed_before + num_scheduled - num_drafts >= pre.tokens
    return Landing(
        num_tokens=z3.If(cfg.async_scheduling, pre.in_flight, num_scheduled),
        samples=z3.If(
            cfg.async_scheduling, pre.placeholders > 0, z3.And(num_scheduled > 0, reaches_known)
        ),
        num_drafts=z3.If(cfg.async_scheduling, pre.placeholders - 1, num_drafts),
    )


@dataclass(frozen=True)
class SlotUpdate:
    """update_from_output (and, synchronous, the drafter after it) for one slot."""

    slot: Slot
    lands: BoolTerm  # the landing step was scheduled for this live request
    stale: BoolTerm  # its output predates the request's preemption
    sampled: BoolTerm  # emitted tokens this step
    finished: BoolTerm
    freed: IntTerm  # blocks returned to the free pool
    valid: BoolTerm  # the harness's choices are ones a model can make


def update_slot(
    cfg: ConfigTerms, slot: Slot, step: Landing, choices: Choices, variant: Variant
) -> SlotUpdate:
    """_land_in_flight_tokens and _apply_sampled: take the step's tokens out of flight,
    roll back rejected drafts, append the kept tokens up to a stop, free a finished
    request; stale output is delivered but moves no reset counter."""
    lands = z3.And(slot.live, step.num_tokens > 0)
    stale = z3.And(lands, slot.stale > 0)
    landed = slot.replace(
        in_flight=(
            slot.in_flight
            if variant.has(Bug.IN_FLIGHT_NEVER_LANDS)
            else slot.in_flight - step.num_tokens
        ),
        stale=z3.If(stale, slot.stale - step.num_tokens, slot.stale),
    ).select(lands, slot)
    sampled = z3.And(lands, step.samples)
    emitted = 1 + choices.accepted
    rejected = step.num_drafts + 1 - emitted
    rolls_back = z3.And(
        z3.Or(z3.Not(stale), variant.has(Bug.STALE_OUTPUT_ROLLS_BACK)), step.num_drafts > 0
    )
    computed_rejected = 0 if variant.has(Bug.REJECTED_DRAFTS_KEPT) else rejected
    computed = z3.If(rolls_back, landed.computed - computed_rejected, landed.computed)
    placeholders = z3.If(
        z3.And(rolls_back, landed.placeholders > 0),
        landed.placeholders - rejected,
        landed.placeholders,
    )
    had_placeholders = placeholders > 0
    tokens = landed.tokens + choices.kept
    length_cap = zmin(slot.token_limit, cfg.max_model_len)
    finished = z3.And(sampled, z3.Or(choices.stop, tokens >= length_cap))
    valid = z3.Implies(
        sampled,
        z3.And(
            choices.accepted >= 0,
            choices.accepted <= step.num_drafts,
            choices.kept >= 1,
            choices.kept <= emitted,
            tokens <= length_cap,
            z3.Implies(z3.Not(finished), choices.kept == emitted),
            choices.new_drafts >= 0,
            choices.new_drafts <= cfg.num_spec,
        ),
    )
    # The stop checker drops the tokens past a stop and, unless stale, their computed.
    trimmed = z3.If(z3.And(finished, z3.Not(stale)), emitted - choices.kept, 0)
    after_sample = landed.replace(
        computed=computed - trimmed,
        tokens=tokens,
        placeholders=z3.If(
            z3.And(
                z3.Not(stale),
                had_placeholders,
                z3.BoolVal(not variant.has(Bug.PLACEHOLDERS_NOT_RESOLVED)),
            ),
            placeholders - emitted,
            placeholders,
        ),
        # Synchronous: the drafter proposes after the step. Async: the placeholder drafts
        # set at schedule time stay (the engine core never proposes).
        drafts=z3.If(cfg.async_scheduling, landed.drafts, choices.new_drafts),
    )
    updated = after_sample.select(sampled, landed)
    # The bugs that keep a table live in _preempt: a finished request is freed as usual,
    # and the state forgets it (its later output is dropped).
    gone = updated.replace(
        live=z3.BoolVal(False),
        running=z3.BoolVal(False),
        blocks=z3.IntVal(0),
        drafts=z3.IntVal(0),
        in_flight=z3.IntVal(0),
        placeholders=z3.IntVal(0),
        stale=z3.IntVal(0),
    )
    return SlotUpdate(
        slot=gone.select(finished, updated),
        lands=lands,
        stale=stale,
        sampled=sampled,
        finished=finished,
        freed=z3.If(finished, slot.blocks, 0),
        valid=valid,
    )
