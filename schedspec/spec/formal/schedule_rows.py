"""A counterexample step as plain values: per request its state before, what the step
scheduled and decided, and its state after (counterexample.py reads them from a Z3
model). Plain ints and strings, so they pickle from a prover's worker process."""

from __future__ import annotations

from dataclasses import dataclass

# The slot fields a row shows (SlotState, and the status they make); the other fields of
# a slot stay in the dump of the model's remaining values.
SHOWN_SLOT_FIELDS = ("live", "running", "preemptions", "computed", "tokens", "blocks", "in_flight")


@dataclass(frozen=True)
class SlotState:
    """A request's counts at one point of the step."""

    status: str  # RUNNING, WAITING, PREEMPTED (waiting, preempted before), or "-" (no request)
    computed: int  # num_computed_tokens
    tokens: int  # num_tokens (prompt + output)
    blocks: int  # len(block table)
    in_flight: int  # tokens of steps still in flight (async scheduling)


@dataclass(frozen=True)
class SlotRow:
    """One request through the counterexample's step."""

    name: str  # the slot's name in the model: s, s[0], s[1], ...
    before: SlotState
    scheduled: int  # num_scheduled_tokens
    drafts: int  # drafts scheduled
    decision: str  # admitted, preempted, or "-"
    scheduled_state: SlotState  # after schedule(): what schedule-kind invariants judge
    after: SlotState  # after the step's output landed (update_from_output)
