"""DETERMINED: the vllm-v1 profile pins schedule()'s decisions; each strengthening it
needed is shown needed (for every N, and on a worked example), and the reference passes."""

from __future__ import annotations

import pytest
import z3

from schedspec.spec.config import SchedulerConfig
from schedspec.spec.formal.determined import (
    LEMMAS,
    check_determined,
    determined_for_all_n,
    reference_passes,
    slot_lemma,
    two_decisions_agree,
)
from schedspec.spec.formal.encoding import ModelState, Slot, concrete_config
from schedspec.spec.formal.profile import STRENGTHENINGS, Decision, profile_clauses

TIMEOUT = 60.0


def test_every_lemma_for_all_n_is_proved() -> None:
    outcomes = determined_for_all_n(TIMEOUT)
    assert [o.claim for o in outcomes if not o.proved] == []
    assert len(outcomes) == len(LEMMAS) + 2  # the subset-sum induction's base and step


def test_one_and_two_slots_agree_and_the_reference_passes() -> None:
    assert all(o.proved for o in check_determined(1, 2, TIMEOUT))
    assert reference_passes(2, 2, TIMEOUT).proved


# The lemma each strengthening is needed by: without it the proof for all N fails there.
NEEDED_BY = {
    "preempt-needed": "victims",
    "alloc-exact": "running",
    "admission-fits": "head",
    "padding-waits": "head",
}


@pytest.mark.parametrize("strengthening", list(STRENGTHENINGS))
def test_each_strengthening_is_needed_for_all_n(strengthening: str) -> None:
    assert slot_lemma(NEEDED_BY[strengthening], TIMEOUT).proved
    without = slot_lemma(NEEDED_BY[strengthening], TIMEOUT, dropped=[strengthening])
    assert without.verdict == "counterexample", without


@pytest.mark.parametrize("strengthening", ["preempt-needed", "padding-waits"])
def test_one_request_is_enough_to_leave_the_decision_open(strengthening: str) -> None:
    outcome = two_decisions_agree(1, 2, TIMEOUT, dropped=[strengthening])
    assert outcome.verdict == "counterexample"
    assert outcome.claim.endswith(f"without {strengthening}")


# ---------------------------------------------------------------- worked examples


def _slot(**values: int | bool) -> Slot:
    fields = {
        "live": True,
        "running": False,
        "computed": 0,
        "tokens": 4,
        "drafts": 0,
        "blocks": 0,
        "preemptions": 0,
        "in_flight": 0,
        "placeholders": 0,
        "stale": 0,
        "chunk": False,
        "token_limit": 100,
        **values,
    }
    return Slot(
        **{k: z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v) for k, v in fields.items()}
    )


def _decision(
    scheduled: int, blocks: int, *, preempted: bool = False, admitted: bool = False
) -> Decision:
    return Decision(
        z3.IntVal(scheduled), z3.BoolVal(preempted), z3.BoolVal(admitted), z3.IntVal(blocks)
    )


def _failing(
    config: SchedulerConfig, state: ModelState, ds: list[Decision], hits: list[int]
) -> list[str]:
    """The clauses these concrete decisions fail."""
    clauses = profile_clauses(concrete_config(config), state, [z3.IntVal(h) for h in hits], ds)
    return [name for name, c in clauses.items() if not z3.is_true(z3.simplify(c))]


CONFIG = SchedulerConfig(
    block_size=4, num_blocks=8, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=32
)


def test_preempting_a_request_that_fits_fails_only_preempt_needed() -> None:
    """One running request, 10 tokens known, 8 computed in 2 blocks, 6 blocks free: it
    needs no new block. Serving it (2 tokens) passes; preempting it passed every predicate
    of the catalogue before PREEMPT-NEEDED (RUNNING-SERVED excuses a victim)."""
    state = ModelState((_slot(running=True, computed=8, tokens=10, blocks=2),), z3.IntVal(6))
    assert _failing(CONFIG, state, [_decision(2, 3)], [0]) == []
    victim = _decision(0, 0, preempted=True)
    assert _failing(CONFIG, state, [victim], [0]) == ["preempt-needed"]


def test_a_table_grown_past_its_need_fails_alloc_exact() -> None:
    """The same request served with one block more than its 10 tokens need."""
    state = ModelState((_slot(running=True, computed=8, tokens=10, blocks=2),), z3.IntVal(6))
    assert _failing(CONFIG, state, [_decision(2, 4)], [0]) == ["alloc-exact"]


def test_admitting_a_chunk_whose_whole_prompt_does_not_fit_fails_admission_fits() -> None:
    """A decode holds 4 of the 8 blocks, 4 are free, and a 30-token prompt waits: it
    needs 8 blocks in all. After the decode's token a first chunk of 15 takes 4 blocks
    and fits, the whole prompt does not: vLLM leaves it waiting (ADMISSION-STOP excuses
    that); admitting the chunk passed every predicate before ADMISSION-FIT."""
    decode = _slot(running=True, computed=8, tokens=9, blocks=4)
    state = ModelState((decode, _slot(tokens=30)), z3.IntVal(4))
    served = _decision(1, 4)
    assert _failing(CONFIG, state, [served, _decision(0, 0)], [0, 0]) == []
    admitted = _decision(15, 4, admitted=True)
    assert _failing(CONFIG, state, [served, admitted], [0, 0]) == ["admission-fits"]
