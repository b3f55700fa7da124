"""Printing `schedspec prove`: the table rows, a counterexample's state, the summary;
with --contracts, CrossHair's summary."""

from __future__ import annotations

from collections.abc import Sequence

import z3

from schedspec.reference.contracts import ContractCheck
from schedspec.spec.formal.prover import ALL_N, ProofRow
from schedspec.spec.formal.solving import Outcome

HEADER = f"{'invariant':<24} {'N':>4}  {'result':<15} {'seconds':>8}"


def row_line(row: ProofRow) -> str:
    return f"{row.invariant:<24} {row.n:>4}  {row.verdict:<15} {row.seconds:>8.3f}"


def state_lines(outcome: Outcome) -> list[str]:
    """The counterexample's values, one per line, config and pre-state first."""
    if outcome.model is None:
        return []
    model = outcome.model
    names = sorted(
        (d.name(), model[d])
        for d in model.decls()
        if d.arity() == 0 and not d.name().startswith(("div", "mod"))
    )
    return [f"  {name} = {_show(value)}" for name, value in names]


def _show(value: z3.ExprRef) -> str:
    return str(value).replace("\n", " ")


def summary(rows: Sequence[ProofRow], seconds: float, disagree: Sequence[str]) -> str:
    general = [r for r in rows if r.n == ALL_N]
    checks = [r for r in rows if r.n != ALL_N]
    proved = sum(r.verdict == "proved" for r in general)
    agreed = sum(r.verdict == "proved" for r in checks)
    text = (
        f"{proved}/{len(general)} invariants proved for all N; "
        f"{agreed}/{len(checks)} monolithic cross-checks proved"
    )
    if disagree:
        text += f"; cross-checks DISAGREE for {', '.join(disagree)}"
    return text + f"; {seconds:.1f}s"


def contracts_summary(checked: ContractCheck) -> str:
    """`21 conditions confirmed over all paths, 0 counterexamples, 0 undecided`."""
    return (
        f"{checked.confirmed} conditions confirmed over all paths, "
        f"{len(checked.errors)} counterexamples, {len(checked.unconfirmed)} undecided"
    )
