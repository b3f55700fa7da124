"""Monolithic cross-checks for small N, the strengthening findings, and ORDER's bad state."""

from __future__ import annotations

from dataclasses import replace

import pytest
import z3

from schedspec.spec.formal.encoding import (
    ModelState,
    Slot,
    symbolic_choices,
    symbolic_config,
    symbolic_state,
)
from schedspec.spec.formal.monolithic import check_step
from schedspec.spec.formal.progress import check_progress
from schedspec.spec.formal.properties import (
    ORDER_ID,
    PROVED_IDS,
    list_order,
    obligation,
    state_invariant,
    state_parts,
)
from schedspec.spec.formal.solving import discharge
from schedspec.spec.formal.step import step
from schedspec.spec.formal.variants import BREAKS, Variant

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
