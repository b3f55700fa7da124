"""Proofs for every N: per-slot lemmas, then an explicit induction over the loop iterations.

One bare ForAll over sequences does not come back (the feasibility probe:
unknown after 60 s). What scales is to split the argument, each piece its
own quantifier-free Z3 query:

- per-slot lemmas: one generic slot, in a generic context (budget left,
  free blocks, requests running, whether it is a victim), lives through one
  step built from the same rules as the unrolled step; its per-slot
  properties hold. Every slot of every N is such a slot.
- the step's loops as iterations over a generic slot: each iteration touches
  one slot (schedule it, preempt it, admit it, update it) and moves the
  step's counters by what that slot gained or gave back. Induction over the
  iteration count: base (the counters at the start of the step), step (an
  iteration keeps the loop invariant, for every kind of iteration), and
  conclusion (the loop invariant implies the property).
- the counters are sums over the slots (blocks held, tokens scheduled,
  requests running): that an iteration touching one slot moves the sum by
  that slot's change is itself proved by induction over the prefix length,
  with the sequences as Z3 arrays and their prefix sums.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import z3

from schedspec.spec.formal.counterexample import with_schedule
from schedspec.spec.formal.encoding import (
    BoolTerm,
    Choices,
    ConfigTerms,
    IntTerm,
    Slot,
    symbolic_choices,
    symbolic_config,
    symbolic_slot,
)
from schedspec.spec.formal.properties import SLOT_STEP_IDS, slot_parts, slot_step_properties
from schedspec.spec.formal.rules import (
    Landing,
    StepSoFar,
    admission,
    admitted_waiting,
    blocks_to_allocate,
    charge_budget,
    freed_by_preemption,
    landing,
    num_drafts_to_schedule,
    preempt,
    put_in_flight,
    running_num_new,
    running_slots_needed,
    seats_full,
    skipped_as_finishing,
    update_slot,
)
from schedspec.spec.formal.solving import Outcome, discharge
from schedspec.spec.formal.step import SlotStep
from schedspec.spec.formal.variants import FAITHFUL, Bug, Variant

# ------------------------------------------------------------ per-slot lemmas


@dataclass(frozen=True)
class Context:
    """What the rest of the step looks like to one slot when the loops reach it."""

    budget: IntTerm  # token budget left
    free: IntTerm  # free blocks at its allocation attempt (victims already freed)
    num_running: IntTerm  # requests in the running list
    cap: IntTerm  # the long-prefill cap of this step
    victim: BoolTerm  # picked as a victim by a request ahead of it
    preempted_any: BoolTerm  # the step preempted before the waiting loop
    so_far: StepSoFar  # the running loop's requests, for the padding rule

    def constraints(self, cfg: ConfigTerms) -> list[BoolTerm]:
        # free >= 0 and num_running >= 0 are the glue's loop invariants (below).
        return [
            self.free >= 0,
            self.num_running >= 0,
            z3.Or(self.cap == 0, self.cap == cfg.threshold),
            z3.Implies(self.so_far.served_chunk, self.so_far.served_running),
        ]


def generic_step_so_far(name: str) -> StepSoFar:
    return StepSoFar(z3.Bool(f"{name}.served_running"), z3.Bool(f"{name}.served_chunk"))


def generic_context() -> Context:
    return Context(
        z3.Int("ctx.budget"),
        z3.Int("ctx.free"),
        z3.Int("ctx.num_running"),
        z3.Int("ctx.cap"),
        z3.Bool("ctx.victim"),
        z3.Bool("ctx.preempted_any"),
        generic_step_so_far("ctx"),
    )


@dataclass(frozen=True)
class SlotLife:
    """One slot through one engine step, and whether the harness's choices are possible."""

    step: SlotStep
    valid: BoolTerm


def slot_life(
    cfg: ConfigTerms, s: Slot, ctx: Context, choice: Choices, variant: Variant
) -> SlotLife:
    preempted = z3.And(ctx.victim, s.running)
    num_new = running_num_new(cfg, ctx.cap, s, ctx.budget)
    need = blocks_to_allocate(cfg, s.blocks, running_slots_needed(cfg, s, num_new), variant)
    allocated = z3.And(
        z3.Not(preempted),
        s.running,
        ctx.budget > 0,
        z3.Not(skipped_as_finishing(s, variant)),
        num_new > 0,
        need <= ctx.free,
    )
    hit = z3.If(cfg.prefix_caching, choice.hit, 0)
    plan = admission(
        cfg, ctx.cap, s, hit, ctx.budget, ctx.free, ctx.num_running, ctx.so_far, variant
    )
    may_admit = (
        z3.BoolVal(True) if variant.has(Bug.ADMIT_AFTER_PREEMPT) else z3.Not(ctx.preempted_any)
    )
    admitted = z3.And(
        s.live,
        z3.Not(s.running),
        may_admit,
        ctx.budget > 0,
        z3.Not(seats_full(cfg, ctx.num_running, variant)),
        z3.Not(plan.skipped),
        z3.Not(plan.blocked_by_budget),
        plan.fits,
    )
    scheduled = z3.If(allocated, num_new, z3.If(admitted, plan.num_new, 0))
    computed_before = z3.If(admitted, hit, s.computed)
    num_drafts = z3.If(
        allocated, num_drafts_to_schedule(s, num_new), z3.If(admitted, plan.num_drafts, 0)
    )
    placed = s.replace(blocks=s.blocks + need).select(
        allocated, admitted_waiting(s, hit, plan).select(admitted, s)
    )
    mid = preempt(s, variant).select(
        preempted,
        put_in_flight(cfg, placed, computed_before, scheduled, num_drafts, variant).select(
            scheduled > 0, placed
        ),
    )
    lands = landing(cfg, s, computed_before, scheduled, num_drafts)
    update = update_slot(cfg, mid, lands, choice, variant)
    valid = z3.And(update.valid, hit >= 0, z3.Implies(s.live, hit <= s.tokens - 1))
    step = SlotStep(
        s,
        mid,
        update.slot,
        scheduled,
        num_drafts,
        computed_before,
        preempted,
        admitted,
        z3.And(admitted, plan.padded),
        lands,
        update,
    )
    return SlotLife(step, valid)


# The per-slot ids and, for the ones the glue needs, the per-slot fact it uses.
SLOT_LEMMA_IDS = SLOT_STEP_IDS


def slot_lemma(
    invariant_id: str,
    timeout_s: float,
    variant: Variant = FAITHFUL,
    block_size: int | None = None,
) -> Outcome:
    """A generic slot satisfying the per-slot invariant keeps it, and the step's per-slot
    property holds for it. block_size None: symbolic (nonlinear, small query)."""
    cfg = symbolic_config()
    if block_size is not None:
        cfg = replace(cfg, block_size=z3.IntVal(block_size))
    ctx = generic_context()
    life = slot_life(cfg, symbolic_slot("s"), ctx, symbolic_choices("c"), variant)
    t = life.step
    hypotheses = [
        *cfg.constraints(),
        *slot_parts(cfg, t.pre).values(),
        *ctx.constraints(cfg),
        life.valid,
    ]
    goal = slot_step_properties(cfg, t)[invariant_id]
    part = slot_parts(cfg, t.post).get(invariant_id)
    if part is not None:
        goal = z3.And(goal, part)
    if invariant_id == "BUDGET":
        # The glue's use: a slot takes at most the budget left.
        goal = z3.And(goal, z3.Implies(t.scheduled > 0, t.scheduled <= ctx.budget))
    outcome = discharge(
        f"{invariant_id} lemma slot-life {variant.name}", hypotheses, goal, timeout_s
    )
    return with_schedule(outcome, [("s", t)])


def need_lemma(timeout_s: float, variant: Variant = FAITHFUL) -> Outcome:
    """The block arithmetic the glue abstracts: an allocation takes >= 0 blocks, and an
    admission that fits takes no more than are free (block size symbolic)."""
    cfg = symbolic_config()
    ctx = generic_context()
    s = symbolic_slot("s")
    num_new = running_num_new(cfg, ctx.cap, s, ctx.budget)
    need = blocks_to_allocate(cfg, s.blocks, running_slots_needed(cfg, s, num_new), variant)
    hit = z3.If(cfg.prefix_caching, z3.Int("hit"), 0)
    plan = admission(
        cfg, ctx.cap, s, hit, ctx.budget, ctx.free, ctx.num_running, ctx.so_far, variant
    )
    return discharge(
        f"need lemma {variant.name}",
        [*cfg.constraints(), *slot_parts(cfg, s).values(), *ctx.constraints(cfg), hit >= 0],
        z3.And(need >= 0, z3.Implies(plan.fits, z3.And(plan.need >= 0, plan.need <= ctx.free))),
        timeout_s,
    )


# ------------------------------------------------------- prefix sums by induction


def prefix_sum_update_lemma(timeout_s: float) -> list[Outcome]:
    """Writing v at index j moves the sum of the first n entries by v - a[j] (for j < n).

    Induction over n, each part a Z3 query with the sequences as arrays and
    their prefix sums P (of a) and Q (of a with a[j] = v) as arrays too.
    """
    a = z3.Array("a", z3.IntSort(), z3.IntSort())
    p = z3.Array("P", z3.IntSort(), z3.IntSort())
    q = z3.Array("Q", z3.IntSort(), z3.IntSort())
    j, v, n = z3.Ints("j v n")
    b = z3.Store(a, j, v)

    def holds(k: IntTerm) -> BoolTerm:
        return q[k] == p[k] + z3.If(j < k, v - a[j], 0)

    def defined(k: IntTerm) -> list[BoolTerm]:  # prefix sums, one entry further
        return [p[k + 1] == p[k] + a[k], q[k + 1] == q[k] + b[k]]

    base = discharge(
        "prefix-sum base", [j >= 0, p[0] == 0, q[0] == 0], holds(z3.IntVal(0)), timeout_s
    )
    step = discharge("prefix-sum step", [n >= 0, holds(n), *defined(n)], holds(n + 1), timeout_s)
    conclusion = discharge(
        "prefix-sum conclusion",
        [j >= 0, j < n, holds(n)],
        q[n] == p[n] + v - a[j],
        timeout_s,
    )
    return [base, step, conclusion]


# ----------------------------------------------------------- the glue induction


@dataclass(frozen=True)
class Counters:
    """The step's loop state beyond the slots: counters and flags, sums as ghosts."""

    budget: IntTerm  # token budget left
    scheduled: IntTerm  # ghost: sum of tokens scheduled
    free: IntTerm
    held: IntTerm  # ghost: sum of blocks held
    running: IntTerm  # ghost: requests in the running list
    phase: IntTerm  # 0 running loop, 1 waiting loop, 2 update
    preempted_any: BoolTerm
    admitted_any: BoolTerm


def counters(name: str) -> Counters:
    return Counters(
        z3.Int(f"{name}.budget"),
        z3.Int(f"{name}.scheduled"),
        z3.Int(f"{name}.free"),
        z3.Int(f"{name}.held"),
        z3.Int(f"{name}.running"),
        z3.Int(f"{name}.phase"),
        z3.Bool(f"{name}.preempted_any"),
        z3.Bool(f"{name}.admitted_any"),
    )


def _after(k: Counters, **changes: object) -> Counters:
    return replace(k, **changes)


Iteration = Callable[[ConfigTerms, Counters, Slot, Choices, Variant], tuple[BoolTerm, Counters]]


def _ones(flag: BoolTerm) -> IntTerm:
    return z3.If(flag, 1, 0)


def visit_running(
    cfg: ConfigTerms, k: Counters, s: Slot, c: Choices, variant: Variant
) -> tuple[BoolTerm, Counters]:
    """The running loop reaches running slot s: it is scheduled if its blocks fit."""
    cap = z3.Int("iter.cap")
    num_new = running_num_new(cfg, cap, s, k.budget)
    # The block count as the "need" lemma leaves it: some number >= 0 (the
    # glue never multiplies by the block size, so it stays linear).
    need = z3.Int("iter.need")
    ok = z3.And(
        s.running,
        k.budget > 0,
        z3.Not(skipped_as_finishing(s, variant)),
        num_new > 0,
        need >= 0,
        need <= k.free,
    )
    guard = z3.And(k.phase == 0, z3.Or(cap == 0, cap == cfg.threshold), ok)
    return guard, _after(
        k,
        budget=charge_budget(k.budget, num_new, variant),
        scheduled=k.scheduled + num_new,
        free=k.free - need,
        held=k.held + need,
    )


def preempt_victim(
    cfg: ConfigTerms, k: Counters, s: Slot, c: Choices, variant: Variant
) -> tuple[BoolTerm, Counters]:
    """Allocation failed: the last running request (maybe the one asking) is preempted."""
    after = preempt(s, variant)
    return z3.And(k.phase == 0, s.running), _after(
        k,
        free=k.free + freed_by_preemption(s, variant),
        held=k.held - s.blocks + after.blocks,
        running=k.running - 1,
        preempted_any=z3.BoolVal(True),
    )


def start_waiting(
    cfg: ConfigTerms, k: Counters, s: Slot, c: Choices, variant: Variant
) -> tuple[BoolTerm, Counters]:
    return k.phase == 0, _after(k, phase=z3.IntVal(1))


def visit_waiting(
    cfg: ConfigTerms, k: Counters, s: Slot, c: Choices, variant: Variant
) -> tuple[BoolTerm, Counters]:
    """The waiting loop reaches waiting slot s: admitted if seats, budget and blocks allow."""
    cap = z3.Int("iter.cap")
    hit = z3.If(cfg.prefix_caching, c.hit, 0)
    plan = admission(
        cfg, cap, s, hit, k.budget, k.free, k.running, generic_step_so_far("iter"), variant
    )
    # The block count and the fit test as the "need" lemma leaves them (linear glue).
    need = z3.Int("iter.need")
    plan = replace(plan, need=need, fits=z3.And(need >= 0, need <= k.free))
    may_admit = (
        z3.BoolVal(True) if variant.has(Bug.ADMIT_AFTER_PREEMPT) else z3.Not(k.preempted_any)
    )
    guard = z3.And(
        k.phase == 1,
        z3.Or(cap == 0, cap == cfg.threshold),
        hit >= 0,
        hit <= s.tokens - 1,
        s.live,
        z3.Not(s.running),
        may_admit,
        k.budget > 0,
        z3.Not(seats_full(cfg, k.running, variant)),
        z3.Not(plan.skipped),
        z3.Not(plan.blocked_by_budget),
        plan.fits,
    )
    after = admitted_waiting(s, hit, plan)
    return guard, _after(
        k,
        budget=charge_budget(k.budget, plan.num_new, variant),
        scheduled=k.scheduled + plan.num_new,
        free=k.free - plan.need,
        held=k.held - s.blocks + after.blocks,
        running=k.running + 1,
        admitted_any=z3.BoolVal(True),
    )


def start_update(
    cfg: ConfigTerms, k: Counters, s: Slot, c: Choices, variant: Variant
) -> tuple[BoolTerm, Counters]:
    return k.phase == 1, _after(k, phase=z3.IntVal(2))


def visit_update(
    cfg: ConfigTerms, k: Counters, s: Slot, c: Choices, variant: Variant
) -> tuple[BoolTerm, Counters]:
    """update_from_output on slot s, for a landing step of a generic size."""
    tokens, num_drafts = z3.Ints("iter.tokens iter.drafts")
    lands = Landing(tokens, z3.Bool("iter.samples"), num_drafts)
    upd = update_slot(cfg, s, lands, c, variant)
    return z3.And(k.phase == 2, upd.valid), _after(
        k,
        free=k.free + upd.freed,
        held=k.held - s.blocks + upd.slot.blocks,
        running=k.running - _ones(s.running) + _ones(upd.slot.running),
    )


ITERATIONS: dict[str, Iteration] = {
    "schedule-running": visit_running,
    "preempt": preempt_victim,
    "start-waiting": start_waiting,
    "admit": visit_waiting,
    "start-update": start_update,
    "update": visit_update,
}


@dataclass(frozen=True)
class Glue:
    """An invariant of the loops, where it starts, and what it implies at the end."""

    invariant: Callable[[ConfigTerms, Counters], BoolTerm]
    conclusion: Callable[[ConfigTerms, Counters], BoolTerm]


def _start(cfg: ConfigTerms, k: Counters) -> list[BoolTerm]:
    """The counters when schedule() starts, given Inv(pre): conservation and seats."""
    return [
        k.budget == cfg.budget,
        k.scheduled == 0,
        k.free >= 0,
        k.free + k.held == cfg.num_blocks,
        k.running >= 0,
        k.running <= cfg.max_num_seqs,
        k.phase == 0,
        z3.Not(k.preempted_any),
        z3.Not(k.admitted_any),
    ]


GLUES: dict[str, Glue] = {
    "BUDGET": Glue(
        lambda cfg, k: z3.And(k.budget >= 0, k.budget + k.scheduled == cfg.budget),
        lambda cfg, k: k.scheduled <= cfg.budget,
    ),
    "CONSERVATION": Glue(
        lambda cfg, k: z3.And(k.free >= 0, k.free + k.held == cfg.num_blocks),
        lambda cfg, k: z3.And(k.free >= 0, k.free + k.held == cfg.num_blocks),
    ),
    "SEQS": Glue(
        lambda cfg, k: z3.And(k.running <= cfg.max_num_seqs),
        lambda cfg, k: k.running <= cfg.max_num_seqs,
    ),
    "NO-ADMIT-AFTER-PREEMPT": Glue(
        lambda cfg, k: z3.And(
            z3.Implies(k.admitted_any, k.phase >= 1),
            z3.Implies(k.preempted_any, z3.Not(k.admitted_any)),
        ),
        lambda cfg, k: z3.Implies(k.preempted_any, z3.Not(k.admitted_any)),
    ),
}


def glue_induction(
    invariant_id: str, timeout_s: float, variant: Variant = FAITHFUL
) -> list[Outcome]:
    """Base, one step query per kind of iteration, and the conclusion, for any number of
    slots and iterations. Block size is symbolic: the counters never multiply by it."""
    glue = GLUES[invariant_id]
    cfg = symbolic_config()
    k, slot, choice = counters("k"), symbolic_slot("s"), symbolic_choices("c")
    shape = list(slot_parts(cfg, slot).values())
    name = f"{invariant_id} glue {variant.name}"
    outcomes = [
        discharge(
            f"{name} base", [*cfg.constraints(), *_start(cfg, k)], glue.invariant(cfg, k), timeout_s
        )
    ]
    for kind, iteration in ITERATIONS.items():
        guard, after = iteration(cfg, k, slot, choice, variant)
        hypotheses = [*cfg.constraints(), *shape, glue.invariant(cfg, k), guard]
        outcomes.append(
            discharge(f"{name} step {kind}", hypotheses, glue.invariant(cfg, after), timeout_s)
        )
    outcomes.append(
        discharge(
            f"{name} conclusion",
            [*cfg.constraints(), glue.invariant(cfg, k)],
            glue.conclusion(cfg, k),
            timeout_s,
        )
    )
    return outcomes
