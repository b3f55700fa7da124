"""Monolithic cross-checks for small N, the strengthening findings, ORDER's bad state, and
the async rules: each one reached, each pipeline bug visible only under async."""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3

from schedspec.spec.formal.encoding import (
    ConfigTerms,
    ModelState,
    Slot,
    symbolic_choices,
    symbolic_config,
    symbolic_slot,
    symbolic_state,
)
from schedspec.spec.formal.monolithic import check_step
from schedspec.spec.formal.parametric import generic_context, slot_life
from schedspec.spec.formal.progress import check_progress
from schedspec.spec.formal.properties import (
    ORDER_ID,
    PROVED_IDS,
    between_steps_clauses,
    list_order,
    obligation,
    pipeline_bounds,
    slot_parts,
    state_invariant,
    state_parts,
)
from schedspec.spec.formal.rules import sure_to_reach_max_tokens
from schedspec.spec.formal.solving import discharge
from schedspec.spec.formal.step import StepResult, step
from schedspec.spec.formal.variants import BREAKS, FAITHFUL, Variant

TIMEOUT = 60.0


@pytest.mark.parametrize("invariant_id", [*PROVED_IDS, ORDER_ID])
def test_one_slot_step_keeps_the_invariant(invariant_id: str) -> None:
    outcome, _ = check_step(invariant_id, 1, 2, TIMEOUT)
    assert outcome.proved, outcome


def test_progress_with_two_slots() -> None:
    assert check_progress(2, 2, TIMEOUT).proved


@pytest.mark.parametrize("invariant_id", ["SEQS", "NO-ADMIT-AFTER-PREEMPT"])
def test_broken_variant_needs_two_slots_and_fails_with_them(invariant_id: str) -> None:
    """Both bugs need a second request: N = 1 proves them, N = 2 finds the counterexample."""
    variant = Variant(BREAKS[invariant_id])
    assert check_step(invariant_id, 1, 2, TIMEOUT, variant)[0].proved
    outcome, _ = check_step(invariant_id, 2, 2, TIMEOUT, variant)
    assert outcome.verdict == "counterexample"


def _slot(live: bool, running: bool) -> Slot:
    n = z3.IntVal
    return Slot(
        live=z3.BoolVal(live),
        running=z3.BoolVal(running),
        computed=n(0),
        tokens=n(1),
        drafts=n(0),
        blocks=n(0),
        preemptions=n(0),
        in_flight=n(0),
        placeholders=n(0),
        stale=n(0),
        chunk=z3.BoolVal(False),
        token_limit=n(2),
    )


def test_order_fails_on_a_waiting_request_before_a_running_one() -> None:
    good = ModelState((_slot(True, True), _slot(True, False)), z3.IntVal(0))
    bad = ModelState((_slot(True, False), _slot(True, True)), z3.IntVal(0))
    assert z3.is_true(z3.simplify(list_order(good)))
    assert z3.is_false(z3.simplify(list_order(bad)))


def test_unguarded_reset_is_not_inductive() -> None:
    """The finding behind PREEMPT-RESET's live guard: a finished request keeps its counts,
    so 'not running => computed == 0' without 'live' breaks as soon as one finishes."""
    cfg = replace(symbolic_config(), block_size=z3.IntVal(2))
    pre = symbolic_state(1)
    r = step(cfg, pre, [symbolic_choices("c[0]")])
    slot = r.post.slots[0]
    unguarded = z3.Implies(z3.Not(slot.running), slot.computed == 0)
    hypotheses = [*cfg.constraints(), state_invariant(cfg, pre), r.choices_valid]
    outcome = discharge("unguarded reset", hypotheses, unguarded, TIMEOUT)
    assert outcome.verdict == "counterexample"
    assert outcome.model is not None
    assert not outcome.model.eval(slot.live, model_completion=True)  # it finished


def test_without_computed_short_of_the_last_token_monotone_breaks() -> None:
    """The finding behind NO-OVERSHOOT's strengthening (and PIPELINE's "confirmed computed
    tokens stop short of the last known token"): drop 'computed <= tokens - 1' from the
    invariant and a step can pull computed back (a sampling step leaves it at tokens - 1).
    Synchronous, so that PIPELINE's part is only its counters at 0, stated here."""
    cfg = replace(symbolic_config(), block_size=z3.IntVal(2), async_scheduling=z3.BoolVal(False))
    pre = symbolic_state(1)
    r = step(cfg, pre, [symbolic_choices("c[0]")])
    parts = state_parts(cfg, pre)
    s = pre.slots[0]
    weakened = z3.Implies(
        s.live,
        z3.And(
            s.tokens >= 1,
            s.tokens <= cfg.max_model_len - 1,
            s.tokens < s.token_limit,
            s.computed >= 0,
            s.in_flight == 0,
            s.placeholders == 0,
            s.stale == 0,
        ),
    )
    hypotheses = [
        *cfg.constraints(),
        *(v for k, v in parts.items() if k not in ("NO-OVERSHOOT", "PIPELINE")),
        weakened,
        r.choices_valid,
    ]
    outcome = discharge("weakened", hypotheses, obligation(cfg, r, "MONOTONE"), TIMEOUT)
    assert outcome.verdict == "counterexample"


ASYNC_IDS = ("PIPELINE", "MAX-TOKENS", "SCHEDULE-PIPELINE", "UPDATE-PIPELINE")


def _two_slot_step(
    async_scheduling: bool, variant: Variant = FAITHFUL
) -> tuple[list[z3.BoolRef], ConfigTerms, StepResult]:
    cfg = replace(
        symbolic_config(), block_size=z3.IntVal(2), async_scheduling=z3.BoolVal(async_scheduling)
    )
    pre = symbolic_state(2)
    r = step(cfg, pre, [symbolic_choices(f"c[{i}]") for i in range(2)], variant)
    return [*cfg.constraints(), state_invariant(cfg, pre), r.choices_valid], cfg, r


@pytest.mark.parametrize("invariant_id", ASYNC_IDS)
def test_async_variant_breaks_only_async_steps(invariant_id: str) -> None:
    """The pipeline bugs are invisible to a synchronous engine (nothing is in flight
    between its steps): the variant keeps the invariant there and breaks it under async."""
    variant = Variant(BREAKS[invariant_id])
    for async_scheduling, verdict in ((False, "proved"), (True, "counterexample")):
        hypotheses, cfg, r = _two_slot_step(async_scheduling, variant)
        goal = obligation(cfg, r, invariant_id)
        outcome = discharge(f"{invariant_id} async={async_scheduling}", hypotheses, goal, TIMEOUT)
        assert outcome.verdict == verdict, outcome


@pytest.mark.parametrize(
    "behaviour",
    ["padded admission", "stale landing", "passed over as finishing", "two steps in flight"],
)
def test_every_async_rule_is_reached_from_the_invariant(behaviour: str) -> None:
    """The async proofs are not vacuous: each rule fires in some step from a state that
    satisfies the invariant (Z3 refutes "it never happens" with a concrete step)."""
    hypotheses, _, r = _two_slot_step(True)
    n = len(r.pre.slots)
    happens = {
        "padded admission": z3.Or(*r.padded),
        "stale landing": z3.Or(*(u.stale for u in r.updates)),
        "passed over as finishing": z3.Or(
            *(
                z3.And(r.pre.slots[i].running, sure_to_reach_max_tokens(r.pre.slots[i]))
                for i in range(n)
            )
        ),
        "two steps in flight": z3.Or(
            *(z3.And(r.pre.slots[i].in_flight > 0, r.scheduled[i] > 0) for i in range(n))
        ),
    }[behaviour]
    outcome = discharge(f"never a {behaviour}", hypotheses, z3.Not(happens), TIMEOUT)
    assert outcome.verdict == "counterexample", outcome


@pytest.mark.parametrize("clause", ["synchronous-idle", "outputs-counted"])
def test_pipeline_needs_its_between_steps_clause(clause: str) -> None:
    """The findings behind PIPELINE's strengthening, for every N (a generic slot): drop
    one clause of the state between engine steps and the catalogue's PIPELINE bounds fail
    right after schedule(). Synchronous-idle: a step in flight before a synchronous
    schedule() would stay in flight. Outputs-counted: a request whose sampling step is in
    flight is never scheduled a prefill chunk (which must have no placeholders) because
    computed already counts that step's output positions."""
    cfg = symbolic_config()
    ctx = generic_context()
    life = slot_life(cfg, symbolic_slot("s"), ctx, symbolic_choices("c"), FAITHFUL)
    pre = life.step.pre
    kept = [v for k, v in between_steps_clauses(cfg, pre).items() if k != clause]
    weakened = z3.And(pipeline_bounds(cfg, pre), z3.Implies(pre.live, z3.And(*kept)))
    hypotheses = [
        *cfg.constraints(),
        *(v for k, v in slot_parts(cfg, pre).items() if k != "PIPELINE"),
        weakened,
        *ctx.constraints(cfg),
        life.valid,
    ]
    goal = pipeline_bounds(cfg, life.step.mid)
    assert discharge("full", [*hypotheses, slot_parts(cfg, pre)["PIPELINE"]], goal, TIMEOUT).proved
    assert discharge(f"without {clause}", hypotheses, goal, TIMEOUT).verdict == "counterexample"
