"""Monolithic checks: one Z3 query per invariant over a step of exactly N slots.

They do not scale (the feasibility probe: seconds at N = 16, no answer at 24),
so they serve as cross-checks of the parametric proofs for small N, and as
the search for concrete counterexamples of the broken variants.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import z3

from schedspec.spec.formal.counterexample import with_schedule
from schedspec.spec.formal.encoding import (
    BoolTerm,
    ConfigTerms,
    symbolic_choices,
    symbolic_config,
    symbolic_state,
)
from schedspec.spec.formal.properties import obligation, state_invariant
from schedspec.spec.formal.solving import Outcome, discharge
from schedspec.spec.formal.step import StepResult, step
from schedspec.spec.formal.variants import FAITHFUL, Variant


@dataclass(frozen=True)
class StepQuery:
    """The symbolic step of N slots and the hypotheses every obligation assumes."""

    cfg: ConfigTerms
    result: StepResult
    hypotheses: tuple[BoolTerm, ...]


def step_query(n: int, block_size: int, variant: Variant = FAITHFUL) -> StepQuery:
    """Inv(pre), a valid config with the given block size, valid harness choices, one step.

    block_size is fixed per query: with it symbolic, every block count is a
    product of two unknowns and Z3's nonlinear arithmetic gives up (see
    docs/FORMAL.md); the per-slot lemmas prove the block arithmetic for a
    symbolic block size.
    """
    cfg = replace(symbolic_config(), block_size=z3.IntVal(block_size))
    pre = symbolic_state(n)
    choices = [symbolic_choices(f"c[{i}]") for i in range(n)]
    result = step(cfg, pre, choices, variant)
    hypotheses = (*cfg.constraints(), state_invariant(cfg, pre), result.choices_valid)
    return StepQuery(cfg, result, hypotheses)


def check_step(
    invariant_id: str,
    n: int,
    block_size: int,
    timeout_s: float,
    variant: Variant = FAITHFUL,
) -> tuple[Outcome, StepQuery]:
    """Inv(s) and T(s, s') imply invariant_id's step property and its part of Inv(s')."""
    query = step_query(n, block_size, variant)
    goal = obligation(query.cfg, query.result, invariant_id)
    claim = f"{invariant_id} N={n} block_size={block_size} {variant.name}"
    outcome = discharge(claim, query.hypotheses, goal, timeout_s)
    slots = [(f"s[{i}]", query.result.slot(i)) for i in range(n)]
    return with_schedule(outcome, slots), query
