"""One engine step of the counts model, unrolled over N slots: schedule, then a landing.

The loops mirror Scheduler.schedule: the running loop in running order
(allocation failure preempts the last running request, fcfs, possibly the
request itself, then breaks; a request whose step in flight is sure to reach
max_tokens is passed over), the waiting loop in queue order (skipped in a
step that preempted; a request with stale output in flight is set aside),
then update_from_output of the step that lands: synchronous, the one just
scheduled; async (vLLM's batch queue of two), the one in flight before it.
The result is a set of terms over the pre-state, the config and the
harness's choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import z3

from schedspec.spec.formal.encoding import (
    BoolTerm,
    Choices,
    ConfigTerms,
    IntTerm,
    ModelState,
    Slot,
)
from schedspec.spec.formal.rules import (
    Landing,
    SlotUpdate,
    StepSoFar,
    admission,
    admitted_waiting,
    blocks_to_allocate,
    freed_by_preemption,
    landing,
    long_prefill_cap,
    num_drafts_to_schedule,
    preempt,
    put_in_flight,
    running_num_new,
    running_slots_needed,
    seats_full,
    skipped_as_finishing,
    update_slot,
)
from schedspec.spec.formal.variants import FAITHFUL, Bug, Variant


def count(flags: Sequence[BoolTerm]) -> IntTerm:
    return z3.Sum([z3.If(f, 1, 0) for f in flags]) if flags else z3.IntVal(0)


@dataclass(frozen=True)
class SlotStep:
    """One slot through one engine step: what the properties of one request read."""

    pre: Slot
    mid: Slot  # after schedule()
    post: Slot  # after the landing
    scheduled: IntTerm
    num_drafts: IntTerm  # drafts scheduled (a padded admission's placeholders included)
    computed_before: IntTerm  # what SchedulerOutput reports (the hit if admitted)
    preempted: BoolTerm
    admitted: BoolTerm
    padded: BoolTerm
    landing: Landing
    update: SlotUpdate


@dataclass(frozen=True)
class StepResult:
    pre: ModelState
    mid: ModelState  # after schedule()
    post: ModelState  # after update_from_output() (and, synchronous, the drafter)
    scheduled: tuple[IntTerm, ...]  # num_scheduled_tokens per slot (0 = not scheduled)
    drafts_scheduled: tuple[IntTerm, ...]
    preempted: tuple[BoolTerm, ...]
    admitted: tuple[BoolTerm, ...]
    padded: tuple[BoolTerm, ...]  # admitted with spec-decode padding
    computed_before: tuple[IntTerm, ...]  # what SchedulerOutput reports (the hit if admitted)
    landings: tuple[Landing, ...]  # the step whose output lands, per slot
    updates: tuple[SlotUpdate, ...]  # what its landing did, per slot
    budget_left: IntTerm
    choices_valid: BoolTerm  # the harness's choices are possible ones

    def slot(self, i: int) -> SlotStep:
        return SlotStep(
            self.pre.slots[i],
            self.mid.slots[i],
            self.post.slots[i],
            self.scheduled[i],
            self.drafts_scheduled[i],
            self.computed_before[i],
            self.preempted[i],
            self.admitted[i],
            self.padded[i],
            self.landings[i],
            self.updates[i],
        )

    @property
    def sampled(self) -> tuple[BoolTerm, ...]:
        return tuple(u.sampled for u in self.updates)

    @property
    def finished(self) -> tuple[BoolTerm, ...]:
        return tuple(u.finished for u in self.updates)

    @property
    def any_preempted(self) -> BoolTerm:
        return z3.Or(*self.preempted) if self.preempted else z3.BoolVal(False)

    @property
    def any_admitted(self) -> BoolTerm:
        return z3.Or(*self.admitted) if self.admitted else z3.BoolVal(False)


def step(
    cfg: ConfigTerms, pre: ModelState, choices: Sequence[Choices], variant: Variant = FAITHFUL
) -> StepResult:
    """One engine step: schedule(), then the landing of a step's output (synchronous:
    this one; async: the one in flight before it)."""
    n = len(pre.slots)
    slots = list(pre.slots)
    cap = long_prefill_cap(cfg, count([s.live for s in slots]))
    budget: IntTerm = cfg.budget
    free: IntTerm = pre.free
    scheduled: list[IntTerm] = [z3.IntVal(0)] * n
    drafts_scheduled: list[IntTerm] = [z3.IntVal(0)] * n
    preempted: list[BoolTerm] = [z3.BoolVal(False)] * n
    computed_before = [s.computed for s in slots]
    served_running: BoolTerm = z3.BoolVal(False)
    served_chunk: BoolTerm = z3.BoolVal(False)

    # ---- _schedule_running: slots with index >= cut have been preempted away.
    cut: IntTerm = z3.IntVal(n)
    halted: BoolTerm = z3.BoolVal(False)
    for i in range(n):
        slot = slots[i]
        considered = z3.And(slot.running, cut > i, z3.Not(halted), budget > 0)
        num_new = running_num_new(cfg, cap, slot, budget)
        wants = z3.And(considered, z3.Not(skipped_as_finishing(slot, variant)), num_new > 0)
        need = blocks_to_allocate(
            cfg, slot.blocks, running_slots_needed(cfg, slot, num_new), variant
        )
        # The running loop with _preempt_for: victims from the end until it fits or it went
        # itself.
        failing = z3.And(wants, need > free)
        for j in range(n - 1, i - 1, -1):
            victim = z3.And(failing, slots[j].running, cut > j)
            free = z3.If(victim, free + freed_by_preemption(slots[j], variant), free)
            cut = z3.If(victim, j, cut)
            preempted[j] = z3.Or(preempted[j], victim)
            slots[j] = preempt(slots[j], variant).select(victim, slots[j])
            if j == i:
                halted = z3.Or(halted, victim)  # fcfs: it preempted itself, break
            else:
                failing = z3.And(failing, need > free)
        allocated = z3.And(wants, z3.Not(preempted[i]))
        scheduled[i] = z3.If(allocated, num_new, 0)
        drafts_scheduled[i] = z3.If(allocated, num_drafts_to_schedule(slot, num_new), 0)
        free = z3.If(allocated, free - need, free)
        if not variant.has(Bug.BUDGET_NOT_CHARGED):
            budget = budget - scheduled[i]
        served_running = z3.Or(served_running, allocated)
        served_chunk = z3.Or(served_chunk, z3.And(allocated, slot.chunk))
        slots[i] = slots[i].replace(blocks=z3.If(allocated, slot.blocks + need, slots[i].blocks))

    # ---- _schedule_waiting, in a step that did not preempt.
    any_preempted = z3.Or(*preempted) if n else z3.BoolVal(False)
    num_running = count([z3.And(s.running, cut > i) for i, s in enumerate(slots)])
    stopped: BoolTerm = z3.BoolVal(False) if variant.has(Bug.ADMIT_AFTER_PREEMPT) else any_preempted
    so_far = StepSoFar(served_running, served_chunk)
    admitted: list[BoolTerm] = [z3.BoolVal(False)] * n
    padded: list[BoolTerm] = [z3.BoolVal(False)] * n
    valid_hits: list[BoolTerm] = []
    for i in range(n):
        slot = slots[i]
        hit = z3.If(cfg.prefix_caching, choices[i].hit, 0)
        # A hit never covers the last token (get_computed_blocks).
        valid_hits.append(z3.And(hit >= 0, z3.Implies(slot.live, hit <= slot.tokens - 1)))
        considered = z3.And(slot.live, z3.Not(slot.running), z3.Not(stopped), budget > 0)
        full = seats_full(cfg, num_running, variant)
        plan = admission(cfg, cap, slot, hit, budget, free, num_running, so_far, variant)
        # Seats first (a break), then the stale-output skip (the loop goes on).
        skipped = z3.And(considered, z3.Not(full), plan.skipped)
        admit = z3.And(
            considered,
            z3.Not(full),
            z3.Not(plan.skipped),
            z3.Not(plan.blocked_by_budget),
            plan.fits,
        )
        stopped = z3.Or(stopped, z3.And(considered, z3.Not(skipped), z3.Not(admit)))
        admitted[i] = admit
        padded[i] = z3.And(admit, plan.padded)
        computed_before[i] = z3.If(admit, hit, computed_before[i])
        scheduled[i] = z3.If(admit, plan.num_new, scheduled[i])
        drafts_scheduled[i] = z3.If(admit, plan.num_drafts, drafts_scheduled[i])
        free = z3.If(admit, free - plan.need, free)
        if not variant.has(Bug.BUDGET_NOT_CHARGED):
            budget = z3.If(admit, budget - plan.num_new, budget)
        num_running = z3.If(admit, num_running + 1, num_running)
        slots[i] = admitted_waiting(slot, hit, plan).select(admit, slot)

    # ---- _update_after_schedule: the scheduled tokens go in flight.
    mid_slots = tuple(
        put_in_flight(
            cfg, s, computed_before[i], scheduled[i], drafts_scheduled[i], variant
        ).select(scheduled[i] > 0, s)
        for i, s in enumerate(slots)
    )
    mid = ModelState(mid_slots, free)

    # ---- update_from_output
    post_slots: list[Slot] = []
    landings: list[Landing] = []
    updates: list[SlotUpdate] = []
    valid: list[BoolTerm] = list(valid_hits)
    for i, slot in enumerate(mid_slots):
        lands = landing(cfg, pre.slots[i], computed_before[i], scheduled[i], drafts_scheduled[i])
        upd = update_slot(cfg, slot, lands, choices[i], variant)
        landings.append(lands)
        updates.append(upd)
        post_slots.append(upd.slot)
        valid.append(upd.valid)
        free = free + upd.freed
    return StepResult(
        pre=pre,
        mid=mid,
        post=ModelState(tuple(post_slots), free),
        scheduled=tuple(scheduled),
        drafts_scheduled=tuple(drafts_scheduled),
        preempted=tuple(preempted),
        admitted=tuple(admitted),
        padded=tuple(padded),
        computed_before=tuple(computed_before),
        landings=tuple(landings),
        updates=tuple(updates),
        budget_left=budget,
        choices_valid=z3.And(*valid) if valid else z3.BoolVal(True),
    )
