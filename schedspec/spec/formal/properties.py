"""The invariants as predicates of the counts model, under the catalogue's ids.

A state invariant is split into parts, each filed under the id whose proof
needs it: the proof of id X shows X's step property and X's parts of the
state invariant after the step, assuming the whole state invariant before.
Together the parts are the inductive invariant; the parts beyond the
catalogue's own statements are the strengthenings docs/FORMAL.md lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import z3

from schedspec.spec.formal.encoding import BoolTerm, ConfigTerms, IntTerm, ModelState, Slot, zmin
from schedspec.spec.formal.step import StepResult, count

# The catalogue ids proved inductive (NO-EMPTY-STEP, the progress claim, is in progress.py).
PROVED_IDS: tuple[str, ...] = (
    "BUDGET",
    "SEQS",
    "CONSERVATION",
    "KV-COVER",
    "NO-OVERSHOOT",
    "PREEMPT-RESET",
    "MONOTONE",
    "NO-ADMIT-AFTER-PREEMPT",
)
# The model's own well-formedness (slot order is list order), checked for N <= max_n only:
# it relates two slots, which the per-slot lemmas cannot say.
ORDER_ID = "ORDER"
SLOT_STEP_IDS = ("BUDGET", "KV-COVER", "NO-OVERSHOOT", "PREEMPT-RESET", "MONOTONE")
SLOT_PART_IDS = ("NO-OVERSHOOT", "PREEMPT-RESET", "KV-COVER")


def slot_shape(cfg: ConfigTerms, s: Slot) -> BoolTerm:
    """NO-OVERSHOOT's strengthening: computed stops short of the last known token
    between steps, and drafts ride only on a running request that is fully computed."""
    return z3.Implies(
        s.live,
        z3.And(
            s.tokens >= 1,
            s.tokens <= cfg.max_model_len - 1,
            s.computed >= 0,
            s.computed <= s.tokens - 1,
            s.drafts >= 0,
            s.drafts <= cfg.num_spec,
            z3.Implies(s.drafts > 0, z3.And(s.running, s.computed == s.tokens - 1)),
        ),
    )


def holds_nothing_unless_running(s: Slot) -> BoolTerm:
    """PREEMPT-RESET's state form: a waiting or preempted request has no KV, no
    computed tokens and no drafts. Only live ones: a finished request keeps its
    counts (the state forgets it), so the unguarded form is not inductive."""
    return z3.And(
        s.blocks >= 0,
        s.preemptions >= 0,
        z3.Implies(s.running, s.live),
        z3.Implies(
            z3.And(s.live, z3.Not(s.running)),
            z3.And(s.computed == 0, s.blocks == 0, s.drafts == 0),
        ),
    )


def conserved(cfg: ConfigTerms, state: ModelState) -> BoolTerm:
    """CONSERVATION in counts: free + held == num_blocks, and nothing negative."""
    held = z3.Sum([s.blocks for s in state.slots]) if state.slots else z3.IntVal(0)
    return z3.And(
        state.free >= 0,
        state.free + held == cfg.num_blocks,
        *(slot_parts(cfg, s)["CONSERVATION"] for s in state.slots),
    )


def seqs_bounded(cfg: ConfigTerms, state: ModelState) -> BoolTerm:
    return count([s.running for s in state.slots]) <= cfg.max_num_seqs


def list_order(state: ModelState) -> BoolTerm:
    """ORDER: no waiting request sits before a running one in slot order."""
    slots = state.slots
    return z3.And(
        True,
        *(
            z3.Implies(slots[j].running, z3.Not(z3.And(slots[i].live, z3.Not(slots[i].running))))
            for j in range(len(slots))
            for i in range(j)
        ),
    )


def covered(cfg: ConfigTerms, s: Slot) -> BoolTerm:
    """KV-COVER's state form: a running request's table covers its computed tokens."""
    return z3.Implies(s.running, s.blocks * cfg.block_size >= s.computed)


def state_parts(cfg: ConfigTerms, state: ModelState) -> dict[str, BoolTerm]:
    """The inductive invariant, by the id whose proof establishes each part."""
    per_slot = [slot_parts(cfg, s) for s in state.slots]
    parts = {pid: z3.And(True, *(p[pid] for p in per_slot)) for pid in SLOT_PART_IDS}
    parts["CONSERVATION"] = conserved(cfg, state)
    parts["SEQS"] = seqs_bounded(cfg, state)
    parts[ORDER_ID] = list_order(state)
    return parts


def state_invariant(cfg: ConfigTerms, state: ModelState) -> BoolTerm:
    return z3.And(*state_parts(cfg, state).values())


def _each(items: Sequence[BoolTerm]) -> BoolTerm:
    return z3.And(True, *items)


def slot_step_properties(
    cfg: ConfigTerms,
    pre: Slot,
    mid: Slot,
    post: Slot,
    scheduled: IntTerm,
    computed_before: IntTerm,
    preempted: BoolTerm,
) -> dict[str, BoolTerm]:
    """What one step must do to one slot, by id (shared by every N and the per-slot lemmas)."""
    return {
        "BUDGET": z3.And(scheduled >= 0, z3.Implies(scheduled > 0, mid.running)),
        "KV-COVER": z3.Implies(
            scheduled > 0,
            mid.blocks * cfg.block_size >= zmin(mid.computed + cfg.lookahead, cfg.max_model_len),
        ),
        "NO-OVERSHOOT": z3.Implies(
            scheduled > 0,
            z3.And(
                computed_before + scheduled <= pre.tokens + pre.drafts,
                computed_before + scheduled <= cfg.max_model_len - 1,
            ),
        ),
        "PREEMPT-RESET": z3.Implies(
            preempted,
            z3.And(
                pre.running,
                scheduled == 0,
                mid.live,
                z3.Not(mid.running),
                mid.computed == 0,
                mid.blocks == 0,
                mid.drafts == 0,
                mid.preemptions == pre.preemptions + 1,
            ),
        ),
        "MONOTONE": z3.And(
            z3.Implies(preempted, mid.computed == 0),
            z3.Implies(z3.Not(preempted), mid.computed >= pre.computed),
            # Across the update too: rollback never undoes more than this step did.
            z3.Implies(z3.And(z3.Not(preempted), post.live), post.computed >= pre.computed),
        ),
    }


def slot_parts(cfg: ConfigTerms, s: Slot) -> dict[str, BoolTerm]:
    """The per-slot parts of the inductive invariant, by id."""
    return {
        "NO-OVERSHOOT": slot_shape(cfg, s),
        "PREEMPT-RESET": holds_nothing_unless_running(s),
        "KV-COVER": covered(cfg, s),
        "CONSERVATION": z3.Implies(z3.Not(s.live), z3.And(s.blocks == 0, s.drafts == 0)),
    }


def step_properties(cfg: ConfigTerms, r: StepResult) -> dict[str, BoolTerm]:
    """What one step must do, by id (the state parts of the post-state come on top)."""
    n = len(r.pre.slots)
    per_slot = [
        slot_step_properties(
            cfg,
            r.pre.slots[i],
            r.mid.slots[i],
            r.post.slots[i],
            r.scheduled[i],
            r.computed_before[i],
            r.preempted[i],
        )
        for i in range(n)
    ]
    total = z3.Sum(list(r.scheduled)) if n else z3.IntVal(0)
    props = {pid: _each([p[pid] for p in per_slot]) for pid in SLOT_STEP_IDS}
    props["BUDGET"] = z3.And(total <= cfg.budget, props["BUDGET"])
    props["SEQS"] = seqs_bounded(cfg, r.mid)
    props["CONSERVATION"] = conserved(cfg, r.mid)
    props["NO-ADMIT-AFTER-PREEMPT"] = z3.Implies(r.any_preempted, z3.Not(r.any_admitted))
    props[ORDER_ID] = z3.BoolVal(True)
    return props


def obligation(cfg: ConfigTerms, r: StepResult, invariant_id: str) -> BoolTerm:
    """What the proof of invariant_id shows about one step."""
    goal = step_properties(cfg, r)[invariant_id]
    part = state_parts(cfg, r.post).get(invariant_id)
    return goal if part is None else z3.And(goal, part)
