"""The counts model and cache-aware admission: the inductive invariant is closed under
the reorder's permutation of waiting slots, so the proofs cover a step that reorders
(schedspec/spec/formal/reorder.py, docs/FORMAL.md)."""

from __future__ import annotations

import z3

from schedspec.spec.formal.encoding import symbolic_config, symbolic_state
from schedspec.spec.formal.properties import state_invariant
from schedspec.spec.formal.reorder import check_reorder_closed, swapped
from schedspec.spec.formal.solving import discharge


def test_every_swap_of_two_waiting_slots_keeps_the_invariant() -> None:
    outcomes = check_reorder_closed(max_n=4)
    assert len(outcomes) == 1 + 3 + 6
    assert all(o.proved for o in outcomes), [o.claim for o in outcomes if not o.proved]


def test_the_query_has_teeth_a_running_slot_may_not_trade_places() -> None:
    """Swapping a running slot behind a waiting one breaks ORDER: Z3 finds such a state,
    so the closure above is not vacuous."""
    cfg = symbolic_config()
    state = symbolic_state(2)
    first, second = state.slots
    hypotheses = [
        *cfg.constraints(),
        state_invariant(cfg, state),
        first.live,
        first.running,
        second.live,
        z3.Not(second.running),
    ]
    outcome = discharge("swap running", hypotheses, state_invariant(cfg, swapped(state, 0, 1)), 60)
    assert outcome.verdict == "counterexample"
