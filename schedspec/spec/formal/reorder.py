"""Cache-aware admission and the counts model: why the proofs cover a step that reorders.

vLLM 0.34.0's cache-aware admission (Scheduler._reorder_waiting_by_cached_prefix) ranks
waiting requests by their cached prefix, which the counts model has no content for, so
the model does not decide the reorder. It does not need to: the reorder only permutes
waiting slots (plain waiting requests trade places; nothing else about any request
changes), and only in a step that preempted nothing, after the running loop, which
reads no waiting slot's place. So a step that reorders is the modelled step taken from
the pre-state with its waiting slots permuted, and every proof about every state
covers it as long as the inductive invariant is closed under that permutation. That
closure is what this module asks Z3, one transposition of two waiting slots at a time
(transpositions generate every permutation). docs/FORMAL.md says what is left out.
"""

from __future__ import annotations

import z3

from schedspec.spec.formal.encoding import ModelState, symbolic_config, symbolic_state
from schedspec.spec.formal.properties import state_invariant
from schedspec.spec.formal.solving import Outcome, discharge


def swapped(state: ModelState, i: int, j: int) -> ModelState:
    """The state with slots i and j trading places."""
    slots = list(state.slots)
    slots[i], slots[j] = slots[j], slots[i]
    return ModelState(tuple(slots), state.free)


def reorder_closed(n: int, i: int, j: int, timeout_s: float = 60.0) -> Outcome:
    """Over n slots: a state satisfying the inductive invariant still does with waiting
    slots i and j (live, not running) swapped."""
    cfg = symbolic_config()
    state = symbolic_state(n)
    a, b = state.slots[i], state.slots[j]
    waiting = z3.And(a.live, z3.Not(a.running), b.live, z3.Not(b.running))
    hypotheses = [*cfg.constraints(), state_invariant(cfg, state), waiting]
    goal = state_invariant(cfg, swapped(state, i, j))
    return discharge(f"reorder closed N={n} swap {i},{j}", hypotheses, goal, timeout_s)


def check_reorder_closed(max_n: int, timeout_s: float = 60.0) -> list[Outcome]:
    """Every transposition of two slots for N = 2..max_n."""
    return [
        reorder_closed(n, i, j, timeout_s)
        for n in range(2, max_n + 1)
        for i in range(n)
        for j in range(i + 1, n)
    ]
