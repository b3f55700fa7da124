"""The proofs for every N: each listed invariant proves, and each broken variant of the
step makes its proof fail with a Z3 counterexample."""

from __future__ import annotations

import pytest
import z3

from schedspec.spec.formal.parametric import (
    SLOT_LEMMA_IDS,
    glue_induction,
    prefix_sum_update_lemma,
    slot_lemma,
)
from schedspec.spec.formal.properties import ORDER_ID
from schedspec.spec.formal.prover import ALL_IDS, ProveSettings, prove_for_all_n
from schedspec.spec.formal.solving import discharge
from schedspec.spec.formal.variants import ALSO_CAUGHT, BREAKS, Bug, Variant

TIMEOUT = 60.0
SETTINGS = ProveSettings(max_n=0, timeout_s=TIMEOUT)


@pytest.mark.parametrize("invariant_id", [i for i in ALL_IDS if i != ORDER_ID])
def test_invariant_is_proved_for_all_n(invariant_id: str) -> None:
    row = prove_for_all_n(invariant_id, SETTINGS)
    assert row.outcomes, f"{invariant_id}: no query behind the claim"
    assert row.verdict == "proved", row.failure


@pytest.mark.parametrize("invariant_id", sorted(BREAKS))
def test_broken_variant_breaks_the_proof(invariant_id: str) -> None:
    variant = Variant(BREAKS[invariant_id])
    row = prove_for_all_n(invariant_id, ProveSettings(max_n=0, timeout_s=TIMEOUT, variant=variant))
    assert row.verdict == "counterexample"
    failure = row.failure
    assert failure is not None and failure.model is not None
    assert failure.claim.startswith(invariant_id) and variant.name in failure.claim


def test_the_prefix_sum_induction_has_base_step_and_conclusion() -> None:
    outcomes = prefix_sum_update_lemma(TIMEOUT)
    assert [o.claim for o in outcomes] == [
        "prefix-sum base",
        "prefix-sum step",
        "prefix-sum conclusion",
    ]
    assert all(o.proved for o in outcomes)


def test_a_false_claim_gets_a_counterexample() -> None:
    """discharge is not vacuous: x + 1 > x is proved, x > 0 is refuted with x <= 0."""
    x = z3.Int("x")
    assert discharge("true", [], x + 1 > x, TIMEOUT).proved
    refuted = discharge("false", [], x > 0, TIMEOUT)
    assert refuted.verdict == "counterexample" and refuted.model is not None
    assert refuted.model.eval(x, model_completion=True).as_long() <= 0


def test_glue_has_base_a_step_per_iteration_kind_and_conclusion() -> None:
    claims = [o.claim.split(" glue faithful ")[1] for o in glue_induction("BUDGET", TIMEOUT)]
    assert claims == [
        "base",
        "step schedule-running",
        "step preempt",
        "step start-waiting",
        "step admit",
        "step start-update",
        "step update",
        "conclusion",
    ]


def test_the_per_slot_lemmas_keep_the_block_size_symbolic() -> None:
    """KV-COVER's lemma fails for floor division at block size 1 never, at 2 it does:
    the symbolic lemma has to cover every block size."""
    broken = Variant(BREAKS["KV-COVER"])
    assert slot_lemma("KV-COVER", TIMEOUT, broken, block_size=1).proved
    assert slot_lemma("KV-COVER", TIMEOUT, broken, block_size=2).verdict == "counterexample"
    assert slot_lemma("KV-COVER", TIMEOUT, broken).verdict == "counterexample"
    assert "KV-COVER" in SLOT_LEMMA_IDS


@pytest.mark.parametrize("name", sorted(bug.value for bug in ALSO_CAUGHT))
def test_more_async_mutants_break_a_proof(name: str) -> None:
    """The catalogue's other counter mutants of async scheduling: each one's variant of
    the step fails the proof of the invariant it breaks, for all N."""
    bug = Bug(name)
    invariant_id = ALSO_CAUGHT[bug]
    settings = ProveSettings(max_n=0, timeout_s=TIMEOUT, variant=Variant(bug))
    row = prove_for_all_n(invariant_id, settings)
    assert row.verdict == "counterexample"
    assert row.failure is not None and bug.value in row.failure.claim
