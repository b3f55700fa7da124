"""Deliberately broken variants of the step: each one a bug a proof must catch.

A variant names the reference mutant (tests/mutants/catalogue.py) that makes
the same mistake in the code, so a Z3 counterexample of the variant can be
replayed against that mutant.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Bug(Enum):
    BUDGET_NOT_CHARGED = "budget-not-decremented"
    SEQS_OFF_BY_ONE = "max-num-seqs-off-by-one"
    PREEMPT_KEEPS_BLOCKS = "preempt-keeps-blocks"
    BLOCKS_FLOOR_DIV = "blocks-needed-floor-div"
    TABLE_KEPT_AFTER_FREE = "table-kept-after-free"
    PREEMPT_KEEPS_COMPUTED = "preempt-keeps-computed"
    REJECTED_DRAFTS_KEPT = "rejected-drafts-kept"
    ADMIT_AFTER_PREEMPT = "admit-after-preempt"
    # Async scheduling.
    MAX_TOKENS_NOT_SKIPPED = "async-max-tokens-overrun"
    PLACEHOLDERS_NOT_ADDED = "placeholders-not-added"
    PREEMPT_KEEPS_PLACEHOLDERS = "preempt-keeps-placeholders"
    STALE_OUTPUT_ROLLS_BACK = "stale-output-rolls-back"
    PREEMPT_OUTPUT_NOT_STALE = "preempt-output-not-stale"
    IN_FLIGHT_NEVER_LANDS = "in-flight-never-lands"
    PLACEHOLDERS_NOT_RESOLVED = "placeholders-not-resolved"

    @property
    def mutant(self) -> str:
        """The id of the reference mutant that makes this mistake."""
        return self.value


@dataclass(frozen=True)
class Variant:
    """The step as the reference does it, or with one bug."""

    bug: Bug | None = None

    def has(self, bug: Bug) -> bool:
        return self.bug is bug

    @property
    def name(self) -> str:
        return "faithful" if self.bug is None else self.bug.value


FAITHFUL = Variant()

# The broken variant each proof is shown to catch, by invariant id.
BREAKS: dict[str, Bug] = {
    "BUDGET": Bug.BUDGET_NOT_CHARGED,
    "SEQS": Bug.SEQS_OFF_BY_ONE,
    "CONSERVATION": Bug.TABLE_KEPT_AFTER_FREE,
    "KV-COVER": Bug.BLOCKS_FLOOR_DIV,
    "NO-OVERSHOOT": Bug.REJECTED_DRAFTS_KEPT,
    "PREEMPT-RESET": Bug.PREEMPT_KEEPS_BLOCKS,
    "MONOTONE": Bug.PREEMPT_KEEPS_COMPUTED,
    "NO-ADMIT-AFTER-PREEMPT": Bug.ADMIT_AFTER_PREEMPT,
    "PIPELINE": Bug.PREEMPT_KEEPS_PLACEHOLDERS,
    "MAX-TOKENS": Bug.MAX_TOKENS_NOT_SKIPPED,
    "SCHEDULE-PIPELINE": Bug.PLACEHOLDERS_NOT_ADDED,
    "UPDATE-PIPELINE": Bug.STALE_OUTPUT_ROLLS_BACK,
}

# More of the catalogue's async mutants, and the invariant whose proof each one breaks.
ALSO_CAUGHT: dict[Bug, str] = {
    Bug.PREEMPT_OUTPUT_NOT_STALE: "PREEMPT-RESET",
    Bug.IN_FLIGHT_NEVER_LANDS: "UPDATE-PIPELINE",
    Bug.PLACEHOLDERS_NOT_RESOLVED: "UPDATE-PIPELINE",
}
