"""The vllm-v1 predicates DETERMINED needed (ALLOC-EXACT, ADMISSION-FIT, PREEMPT-NEEDED,
GREEDY-BUDGET's padding that waits): each holds on a real reference step and fires when
the step is corrupted into the other decision the profile used to allow."""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.spec import NewRequestData
from schedspec.spec.invariants import CATALOGUE, CHECKS, ScheduleTransition
from tests.invariant_builders import (
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    fcfs_preemption,
    tokens,
    two_running_and_an_admission,
    with_kv,
    with_output,
    with_request,
    with_scheduled,
)
from tests.test_invariants_policy import (
    admission_beside_a_running_request,
    admission_with_a_second_waiting,
)

cases = CaseRegistry()


# --------------------------------------------------------------- ALLOC-EXACT


@cases("ALLOC-EXACT")
def case_admission_given_a_block_more_than_it_needs() -> Case:
    good = two_running_and_an_admission()
    c = good.post.requests["C"]
    assert len(c.block_ids) == 3  # 10 tokens in blocks of 4
    spare = good.post.kv.free_block_ids[0]
    post = with_request(good.post, "C", block_ids=(*c.block_ids, spare))
    bad = dataclasses.replace(good, post=post)
    return Case(
        "ALLOC-EXACT",
        good,
        bad,
        "table after 10 tokens from 0 computed (held 0 blocks)",
        "C",
        expected=3,
        actual=4,
    )


@cases("ALLOC-EXACT")
def case_waiting_request_given_a_block() -> Case:
    good = admission_with_a_second_waiting()
    spare = good.post.kv.free_block_ids[0]
    bad = dataclasses.replace(good, post=with_request(good.post, "D", block_ids=(spare,)))
    return Case(
        "ALLOC-EXACT",
        good,
        bad,
        "table changed without a step",
        "D",
        expected=[],
        actual=[spare],
    )


# -------------------------------------------------------------- ADMISSION-FIT


@cases("ADMISSION-FIT")
def case_admission_whose_whole_prompt_does_not_fit() -> Case:
    """B's 8 tokens took 2 blocks beside A with 4 spare (watermark 0.25 of 16). Seen with
    a 44-token prompt (11 blocks), the same first chunk fits but the whole prompt and the
    spare do not fit the 14 free: vLLM would have left B waiting."""
    good = admission_beside_a_running_request(watermark=0.25)
    b = good.pre.requests["B"]
    pre = with_request(good.pre, "B", prompt_token_ids=tokens(b.prompt_token_ids[0], 44))
    bad = dataclasses.replace(good, pre=pre)
    return Case(
        "ADMISSION-FIT",
        good,
        bad,
        "admitted needing 11 blocks + 4 spare with 14 free",
        "B",
        expected=15,
        actual=14,
    )


# -------------------------------------------------------------- PREEMPT-NEEDED


@cases("PREEMPT-NEEDED")
def case_victim_preempted_with_blocks_to_spare() -> Case:
    """A's 13th token takes a block, and so would B's: with nothing free, B goes. Seen
    with two blocks free, both fit and B was preempted for nothing."""
    good = fcfs_preemption()
    bad = dataclasses.replace(good, pre=with_kv(good.pre, free_block_ids=(0, 1)))
    return Case(
        "PREEMPT-NEEDED",
        good,
        bad,
        "preempted although the requests ahead took 1 blocks and it asked for 1, "
        "with 2 free without it",
        "B",
        expected="> 2 blocks wanted (else no preemption)",
        actual=2,
    )


# ------------------------------------------------- GREEDY-BUDGET: padding waits


def padding_over_the_budget_left() -> ScheduleTransition:
    """A decodes; B's one token would be padded to 1 + 2 but only 2 tokens are left of
    the budget of 3: vLLM leaves B waiting rather than run it unpadded."""
    driver = Driver(
        num_speculative_tokens=2, pad_spec_decode=True, max_num_batched_tokens=3, max_num_seqs=2
    )
    driver.add("A", 2)
    driver.step()
    driver.add("B", prompt=(2000,))
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"A": 1}
    assert t.post.waiting == ("B",)
    return t


@cases("GREEDY-BUDGET")
def case_admission_unpadded_where_vllm_waits() -> Case:
    good = padding_over_the_budget_left()
    block = good.post.kv.free_block_ids[0]
    admit_b = NewRequestData("B", (2000,), (block,), 0)
    bad = with_output(with_scheduled(good, {"A": 1, "B": 1}), scheduled_new_reqs=(admit_b,))
    return Case(
        "GREEDY-BUDGET",
        good,
        bad,
        "admitted although its padded 3 tokens do not fit the budget left (vLLM holds it)",
        "B",
        expected=0,
        actual=1,
    )


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("build", cases.params())
def test_allocation_invariant_holds_on_the_real_step(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_allocation_invariant_fires_on_the_corrupted_step(build: CaseBuilder) -> None:
    assert_caught(build())


def test_allocation_cases_are_vllm_v1_invariants() -> None:
    assert {CATALOGUE[i].profile for i in cases.ids()} == {"vllm-v1"}


def test_preempt_needed_holds_where_the_victim_itself_did_not_fit() -> None:
    """Worked example: one block free is not enough, since B's own next token needs a
    block too; B would preempt itself, so preempting it was needed."""
    good = fcfs_preemption()
    seen = dataclasses.replace(good, pre=with_kv(good.pre, free_block_ids=(0,)))
    assert CHECKS["PREEMPT-NEEDED"](seen) == []
