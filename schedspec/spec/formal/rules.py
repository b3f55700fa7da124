"""The scheduler's rules for one slot, as Z3 terms: one function per rule of the reference.

Both the unrolled step (step.py) and the per-slot lemmas (parametric.py) are
built from these, so the monolithic and the parametric proofs are about the
same rules. Names follow schedspec/reference/scheduler.py and
kv_cache_manager.py.
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
    """Scheduler._long_prefill_cap: the threshold only when more than one request exists."""
    return z3.If(num_requests > 1, cfg.threshold, 0)


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


def running_num_new(cfg: ConfigTerms, cap: IntTerm, slot: Slot, budget: IntTerm) -> IntTerm:
    """_schedule_running: tokens a running request asks for this step."""
    num_new = zmin(apply_cap(slot.tokens + slot.drafts - slot.computed, cap), budget)
    # Leave room for the sampled token: positions stay below max_model_len.
    return zmin(num_new, cfg.max_model_len - 1 - slot.computed)


def running_slots_needed(cfg: ConfigTerms, slot: Slot, num_new: IntTerm) -> IntTerm:
    """allocate_slots for a running request: computed + new + lookahead, capped."""
    return zmin(slot.computed + num_new + cfg.lookahead, cfg.max_model_len)


def allocated_running(slot: Slot, num_new: IntTerm, need: IntTerm) -> Slot:
    """A running request after allocate_slots succeeded and its tokens were scheduled
    (computed already moved: schedule() adds the scheduled tokens at its end).
    Its drafts are consumed either way (_schedule_drafts)."""
    return slot.replace(
        computed=slot.computed + num_new, blocks=slot.blocks + need, drafts=z3.IntVal(0)
    )


def drafts_scheduled(slot: Slot, num_new: IntTerm) -> IntTerm:
    """_schedule_drafts: the tokens past the known ones are drafts."""
    return zmax(num_new + slot.computed - slot.tokens, 0)


def admitted_waiting(slot: Slot, hit: IntTerm, plan: Admission) -> Slot:
    """A waiting request after admission: running, from its prefix hit, with a new table."""
    return slot.replace(running=z3.BoolVal(True), computed=hit + plan.num_new, blocks=plan.need)


def charge_budget(budget: IntTerm, num_tokens: IntTerm, variant: Variant) -> IntTerm:
    """StepPlan.schedule: the tokens come out of the step's budget."""
    return budget if variant.has(Bug.BUDGET_NOT_CHARGED) else budget - num_tokens


def preempt(slot: Slot, variant: Variant) -> Slot:
    """Scheduler._preempt: drop the KV, keep the tokens, back to the waiting queue."""
    return slot.replace(
        running=z3.BoolVal(False),
        computed=slot.computed if variant.has(Bug.PREEMPT_KEEPS_COMPUTED) else z3.IntVal(0),
        drafts=z3.IntVal(0),
        blocks=slot.blocks if keeps_table(variant) else z3.IntVal(0),
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

    num_new: IntTerm  # tokens it would run
    blocked_by_budget: BoolTerm  # chunked prefill off and the prompt does not fit: stop
    fits: BoolTerm  # allocate_slots(full_sequence_must_fit=True) succeeds
    need: IntTerm  # free blocks it takes when admitted


def admission(
    cfg: ConfigTerms,
    cap: IntTerm,
    slot: Slot,
    hit: IntTerm,
    budget: IntTerm,
    free: IntTerm,
    num_running: IntTerm,
    variant: Variant,
) -> Admission:
    uncapped = apply_cap(slot.tokens - hit, cap)
    blocked = z3.And(z3.Not(cfg.chunked), uncapped > budget)
    num_new = zmin(uncapped, budget)
    # The watermark is charged only while something runs.
    watermark = z3.If(num_running > 0, cfg.watermark_blocks, 0)
    whole = blocks_to_allocate(cfg, 0, zmin(slot.tokens, cfg.max_model_len), variant)
    need = blocks_to_allocate(
        cfg, 0, zmin(hit + num_new + cfg.lookahead, cfg.max_model_len), variant
    )
    fits = z3.And(whole + watermark <= free, need + watermark <= free)
    return Admission(num_new, blocked, fits, need)


@dataclass(frozen=True)
class SlotUpdate:
    """update_from_output (and the drafter after it) for one slot."""

    slot: Slot
    sampled: BoolTerm  # emitted tokens this step
    finished: BoolTerm
    freed: IntTerm  # blocks returned to the free pool
    valid: BoolTerm  # the harness's choices are ones a model can make


def update_slot(
    cfg: ConfigTerms,
    slot: Slot,
    computed_before: IntTerm,
    num_scheduled: IntTerm,
    drafts_scheduled: IntTerm,
    choices: Choices,
    variant: Variant,
) -> SlotUpdate:
    """Roll back rejected drafts, append the kept tokens, stop, free, take new drafts."""
    scheduled = num_scheduled > 0
    sampled = z3.And(scheduled, computed_before + num_scheduled - drafts_scheduled >= slot.tokens)
    rejected = (
        z3.IntVal(0)
        if variant.has(Bug.REJECTED_DRAFTS_KEPT)
        else drafts_scheduled - choices.accepted
    )
    emitted = 1 + choices.accepted
    tokens = slot.tokens + choices.kept
    finished = z3.And(sampled, z3.Or(choices.stop, tokens >= cfg.max_model_len))
    valid = z3.Implies(
        sampled,
        z3.And(
            choices.accepted >= 0,
            choices.accepted <= drafts_scheduled,
            choices.kept >= 1,
            choices.kept <= emitted,
            tokens <= cfg.max_model_len,
            z3.Implies(z3.Not(finished), choices.kept == emitted),
            choices.new_drafts >= 0,
            choices.new_drafts <= cfg.num_spec,
        ),
    )
    after_sample = slot.replace(
        computed=slot.computed - rejected - (emitted - choices.kept),
        tokens=tokens,
        drafts=choices.new_drafts,
    )
    updated = after_sample.select(sampled, slot)
    # The bugs that keep a table live in _preempt: a finished request is freed as usual.
    gone = updated.replace(
        live=z3.BoolVal(False), running=z3.BoolVal(False), blocks=z3.IntVal(0), drafts=z3.IntVal(0)
    )
    return SlotUpdate(
        slot=gone.select(finished, updated),
        sampled=sampled,
        finished=finished,
        freed=z3.If(finished, slot.blocks, 0),
        valid=valid,
    )
