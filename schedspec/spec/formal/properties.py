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

from schedspec.spec.formal.encoding import BoolTerm, ConfigTerms, ModelState, Slot, zmin
from schedspec.spec.formal.rules import sure_to_reach_max_tokens
from schedspec.spec.formal.step import SlotStep, StepResult, count

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
    "PIPELINE",
    "MAX-TOKENS",
    "SCHEDULE-PIPELINE",
    "UPDATE-PIPELINE",
)
# The model's own well-formedness (slot order is list order), checked for N <= max_n only:
# it relates two slots, which the per-slot lemmas cannot say.
ORDER_ID = "ORDER"
SLOT_STEP_IDS = (
    "BUDGET",
    "KV-COVER",
    "NO-OVERSHOOT",
    "PREEMPT-RESET",
    "MONOTONE",
    "PIPELINE",
    "MAX-TOKENS",
    "SCHEDULE-PIPELINE",
    "UPDATE-PIPELINE",
)
SLOT_PART_IDS = ("NO-OVERSHOOT", "PREEMPT-RESET", "KV-COVER", "PIPELINE")


def slot_shape(cfg: ConfigTerms, s: Slot) -> BoolTerm:
    """NO-OVERSHOOT's strengthening: computed stops short of the last known token and
    the in-flight output positions between steps, and drafts ride only on a running
    request that is computed that far; a live request is below both length caps."""
    last_known = s.tokens + s.placeholders - 1
    return z3.Implies(
        s.live,
        z3.And(
            s.tokens >= 1,
            s.tokens <= cfg.max_model_len - 1,
            s.tokens < s.token_limit,
            s.computed >= 0,
            s.computed <= last_known,
            s.drafts >= 0,
            s.drafts <= cfg.num_spec,
            z3.Implies(s.drafts > 0, z3.And(s.running, s.computed == last_known)),
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


def pipeline_bounds(cfg: ConfigTerms, s: Slot) -> BoolTerm:
    """PIPELINE as the catalogue states it, in counts: it holds in every observed state,
    between schedule() and the landing too. A waiting slot that was preempted before is
    PREEMPTED, else WAITING."""
    waiting = z3.And(z3.Not(s.running), s.preemptions == 0)
    preempted = z3.And(z3.Not(s.running), s.preemptions > 0)
    confirmed = s.computed - s.in_flight
    return z3.Implies(
        s.live,
        z3.And(
            s.in_flight >= 0,
            s.placeholders >= 0,
            s.stale >= 0,
            s.placeholders <= s.in_flight,
            s.stale <= s.in_flight,
            z3.Implies(z3.Not(cfg.async_scheduling), z3.And(s.placeholders == 0, s.stale == 0)),
            z3.Implies(waiting, s.in_flight == 0),
            z3.Implies(preempted, z3.And(s.placeholders == 0, s.stale == s.in_flight)),
            z3.Implies(
                s.running,
                z3.And(
                    s.stale == 0,
                    confirmed >= 0,
                    confirmed <= s.tokens - 1,
                    z3.Implies(s.chunk, s.placeholders == 0),
                ),
            ),
        ),
    )


def between_steps_clauses(cfg: ConfigTerms, s: Slot) -> dict[str, BoolTerm]:
    """PIPELINE's strengthening, the state of a live request between engine steps, by
    name: at most the one step the batch queue holds is in flight, none synchronously;
    its output is never stale (a preemption's stale output lands in the engine step that
    made it stale); its output positions are 1 + at most num_spec drafts, and computed
    counts them all."""
    return {
        "synchronous-idle": z3.Implies(z3.Not(cfg.async_scheduling), s.in_flight == 0),
        "outputs-counted": z3.Implies(
            s.placeholders > 0, s.computed == s.tokens + s.placeholders - 1
        ),
        "never-stale": s.stale == 0,
        "waiting-idle": z3.Implies(z3.Not(s.running), s.in_flight == 0),
        "one-step-of-outputs": s.placeholders <= 1 + cfg.num_spec,
    }


def between_steps(cfg: ConfigTerms, s: Slot) -> BoolTerm:
    return z3.Implies(s.live, z3.And(*between_steps_clauses(cfg, s).values()))


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


def slot_step_properties(cfg: ConfigTerms, t: SlotStep) -> dict[str, BoolTerm]:
    """What one engine step must do to one slot, by id (shared by every N and the
    per-slot lemmas)."""
    pre, mid, post, n = t.pre, t.mid, t.post, t.scheduled
    end = t.computed_before + n
    # NO-OVERSHOOT's limit: known tokens, in-flight outputs and drafts; a padded
    # admission counts its placeholder drafts instead.
    known = z3.If(t.padded, pre.tokens + t.num_drafts, pre.tokens + pre.drafts + pre.placeholders)
    land, upd = t.landing, t.update
    return {
        "BUDGET": z3.And(n >= 0, z3.Implies(n > 0, mid.running)),
        "KV-COVER": z3.Implies(
            n > 0,
            mid.blocks * cfg.block_size >= zmin(mid.computed + cfg.lookahead, cfg.max_model_len),
        ),
        "NO-OVERSHOOT": z3.Implies(n > 0, z3.And(end <= known, end <= cfg.max_model_len - 1)),
        "PREEMPT-RESET": z3.Implies(
            t.preempted,
            z3.And(
                pre.running,
                n == 0,
                mid.live,
                z3.Not(mid.running),
                mid.computed == 0,
                mid.blocks == 0,
                mid.drafts == 0,
                mid.placeholders == 0,
                mid.stale == pre.in_flight,
                mid.preemptions == pre.preemptions + 1,
            ),
        ),
        "MONOTONE": z3.And(
            # Preemption is the only way to 0, and stale output does not move it.
            z3.Implies(
                t.preempted,
                z3.And(mid.computed == 0, z3.Implies(post.live, post.computed == 0)),
            ),
            z3.Implies(
                z3.Not(t.preempted),
                z3.And(mid.computed == end, mid.computed >= pre.computed),
            ),
            z3.Implies(z3.And(pre.running, n > 0), t.computed_before == pre.computed),
            # Across the landing: rollback never undoes confirmed tokens.
            z3.Implies(
                z3.And(z3.Not(t.preempted), post.live),
                post.computed >= pre.computed - pre.in_flight,
            ),
        ),
        "PIPELINE": pipeline_bounds(cfg, mid),
        "MAX-TOKENS": z3.Implies(z3.And(n > 0, pre.running), z3.Not(sure_to_reach_max_tokens(pre))),
        "SCHEDULE-PIPELINE": z3.Implies(
            z3.Not(t.preempted),
            z3.And(
                mid.in_flight == pre.in_flight + n,
                z3.Implies(
                    n == 0,
                    z3.And(mid.placeholders == pre.placeholders, mid.stale == pre.stale),
                ),
                z3.Implies(
                    n > 0,
                    z3.And(
                        mid.chunk == (mid.computed < pre.tokens + pre.placeholders),
                        mid.placeholders
                        == pre.placeholders
                        + z3.If(
                            z3.And(cfg.async_scheduling, z3.Not(mid.chunk)), 1 + t.num_drafts, 0
                        ),
                    ),
                ),
            ),
        ),
        "UPDATE-PIPELINE": z3.Implies(
            z3.And(mid.live, post.live),
            z3.And(
                post.in_flight == mid.in_flight - z3.If(upd.lands, land.num_tokens, 0),
                post.stale == z3.If(upd.stale, mid.stale - land.num_tokens, mid.stale),
                post.placeholders
                == mid.placeholders
                - z3.If(
                    z3.And(upd.sampled, z3.Not(upd.stale), mid.placeholders > 0),
                    1 + land.num_drafts,
                    0,
                ),
                # Stale output moves no reset counter (#41190).
                z3.Implies(upd.stale, post.computed == mid.computed),
            ),
        ),
    }


def slot_parts(cfg: ConfigTerms, s: Slot) -> dict[str, BoolTerm]:
    """The per-slot parts of the inductive invariant, by id."""
    return {
        "NO-OVERSHOOT": slot_shape(cfg, s),
        "PREEMPT-RESET": holds_nothing_unless_running(s),
        "KV-COVER": covered(cfg, s),
        "PIPELINE": z3.And(pipeline_bounds(cfg, s), between_steps(cfg, s)),
        "CONSERVATION": z3.Implies(z3.Not(s.live), z3.And(s.blocks == 0, s.drafts == 0)),
    }


def step_properties(cfg: ConfigTerms, r: StepResult) -> dict[str, BoolTerm]:
    """What one step must do, by id (the state parts of the post-state come on top)."""
    n = len(r.pre.slots)
    per_slot = [slot_step_properties(cfg, r.slot(i)) for i in range(n)]
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
