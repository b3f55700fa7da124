"""Printing `schedspec prove`: the table rows, a counterexample's state, the summary;
with --contracts, CrossHair's summary."""

from __future__ import annotations

from collections.abc import Sequence

import z3

from schedspec.reference.contracts import ContractCheck
from schedspec.spec.formal.prover import ALL_N, ProofRow
from schedspec.spec.formal.schedule_rows import SHOWN_SLOT_FIELDS, SlotRow
from schedspec.spec.formal.solving import Outcome
from schedspec.spec.invariants import CATALOGUE, rule_link

HEADER = f"{'invariant':<24} {'N':>4}  {'result':<15} {'seconds':>8}"


def row_line(row: ProofRow) -> str:
    return f"{row.invariant:<24} {row.n:>4}  {row.verdict:<15} {row.seconds:>8.3f}"


def state_lines(outcome: Outcome, invariant: str) -> list[str]:
    """A counterexample as the step it describes: the schedule table (per request its
    state before, the tokens scheduled, the decision and its state after, where the query
    unrolled a step), the invariant it breaks with its rule, then the config, the
    harness's choices and the remaining values of the model, one group per line."""
    lines = [f"  {line}" for line in schedule_table(outcome.schedule)]
    if invariant in CATALOGUE:
        lines.append(f"  breaks {invariant} (rule: {rule_link(invariant)})")
    if outcome.model is None:
        return lines
    values = model_values(outcome.model)
    shown = {f"{r.name}.{name}" for r in outcome.schedule for name in SHOWN_SLOT_FIELDS}
    groups: dict[str, list[str]] = {"config": [], "harness choices": [], "other values": []}
    for name, text in values:
        if name in shown:
            continue
        group = "config" if "." not in name and "[" not in name else "other values"
        if name.startswith(("c.", "c[")):
            group = "harness choices"
        groups[group].append(f"{name}={text}")
    lines += [f"  {group}: {' '.join(items)}" for group, items in groups.items() if items]
    return lines


def model_values(model: z3.ModelRef) -> list[tuple[str, str]]:
    """The model's constants by name (Z3's own div/mod helpers left out)."""
    return sorted(
        (d.name(), str(model[d]).replace("\n", " "))
        for d in model.decls()
        if d.arity() == 0 and not d.name().startswith(("div", "mod"))
    )


# The schedule table's columns, in groups parted by a bar: (heading, whether it is text,
# read left-aligned, else a number).
SCHEDULE_GROUPS: tuple[tuple[tuple[str, bool], ...], ...] = (
    (("request", True),),
    (
        ("before", True),
        ("computed", False),
        ("tokens", False),
        ("blocks", False),
        ("in flight", False),
    ),
    (("scheduled", False), ("drafts", False), ("decision", True)),
    (("after schedule()", True), ("computed", False), ("blocks", False)),
    (("after the output", True), ("computed", False), ("tokens", False), ("blocks", False)),
)


def schedule_table(rows: Sequence[SlotRow]) -> list[str]:
    """The counterexample step as a table, a row per request (slot); none without rows."""
    if not rows:
        return []
    lines = [[[heading for heading, _ in group] for group in SCHEDULE_GROUPS]]
    for r in rows:
        mid, post = r.scheduled_state, r.after
        lines.append(
            [
                [r.name],
                [
                    r.before.status,
                    *_numbers(
                        r.before.computed, r.before.tokens, r.before.blocks, r.before.in_flight
                    ),
                ],
                [*_numbers(r.scheduled, r.drafts), r.decision],
                [mid.status, *_numbers(mid.computed, mid.blocks)],
                [post.status, *_numbers(post.computed, post.tokens, post.blocks)],
            ]
        )
    widths = [
        [max(len(line[g][i]) for line in lines) for i in range(len(group))]
        for g, group in enumerate(SCHEDULE_GROUPS)
    ]
    rendered = [
        " | ".join(
            "  ".join(
                cell.ljust(width) if text else cell.rjust(width)
                for cell, width, (_, text) in zip(cells, widths[g], SCHEDULE_GROUPS[g], strict=True)
            )
            for g, cells in enumerate(line)
        ).rstrip()
        for line in lines
    ]
    return ["the step, request by request:", *rendered]


def _numbers(*values: int) -> list[str]:
    return [str(v) for v in values]


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
