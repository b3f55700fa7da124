"""A Z3 counterexample as the step it describes: per request (slot), its state before,
what the step scheduled, what it decided, and its state after, read from the model.

A raw model lists every free variable by name (s[1].computed = 26, c[1].hit = 18, ...)
and none of the values the step computes from them, which are the ones a reader needs:
how many tokens each request was given, who was preempted, how many blocks each ends
with. The queries that unroll a step name its per-slot terms (SlotStep); their
counterexamples carry these rows, plain values that pickle across prover processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import z3

from schedspec.spec.formal.encoding import Slot
from schedspec.spec.formal.schedule_rows import SlotRow, SlotState
from schedspec.spec.formal.solving import Outcome, value
from schedspec.spec.formal.step import SlotStep


def slot_state(model: z3.ModelRef, slot: Slot) -> SlotState:
    if not value(model, slot.live):
        status = "-"
    elif value(model, slot.running):
        status = "RUNNING"
    else:
        status = "PREEMPTED" if int(value(model, slot.preemptions)) > 0 else "WAITING"
    return SlotState(
        status,
        int(value(model, slot.computed)),
        int(value(model, slot.tokens)),
        int(value(model, slot.blocks)),
        int(value(model, slot.in_flight)),
    )


def schedule_rows(model: z3.ModelRef, slots: Sequence[tuple[str, SlotStep]]) -> tuple[SlotRow, ...]:
    """Each named slot's row, its values evaluated in the model."""
    rows = []
    for name, step in slots:
        decision = "-"
        if value(model, step.preempted):
            decision = "preempted"
        elif value(model, step.admitted):
            decision = "admitted (padded)" if value(model, step.padded) else "admitted"
        rows.append(
            SlotRow(
                name,
                slot_state(model, step.pre),
                int(value(model, step.scheduled)),
                int(value(model, step.num_drafts)),
                decision,
                slot_state(model, step.mid),
                slot_state(model, step.post),
            )
        )
    return tuple(rows)


def with_schedule(outcome: Outcome, slots: Sequence[tuple[str, SlotStep]]) -> Outcome:
    """A counterexample of a query that unrolled these slots, with their schedule rows."""
    if outcome.model is None:
        return outcome
    return replace(outcome, schedule=schedule_rows(outcome.model, slots))
