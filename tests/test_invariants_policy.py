"""The vllm-v1 profile's invariants are not vacuous: each holds on a real reference step
and fires when the step is corrupted to make another decision than vLLM V1 would.
"""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.spec import NewRequestData
from schedspec.spec.invariants import CATALOGUE, CHECKS, ScheduleTransition, in_profile
from tests.invariant_builders import (
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    fcfs_preemption,
    preemption_step,
    reordered,
    tokens,
    two_running_and_an_admission,
    with_config,
    with_kv,
    with_output,
    with_scheduled,
)

cases = CaseRegistry()


# ----------------------------------------------------------- SCHEDULE-ORDER


@cases("SCHEDULE-ORDER")
def case_admission_served_before_running() -> Case:
    good = two_running_and_an_admission()
    bad = with_scheduled(good, {"C": 10, "A": 1, "B": 1})
    return Case(
        "SCHEDULE-ORDER",
        good,
        bad,
        "scheduling order",
        expected=["A", "B", "C"],
        actual=["C", "A", "B"],
    )


def admission_with_a_second_waiting() -> ScheduleTransition:
    """A and B decoding; C admitted (max_num_seqs 3), D left waiting behind it."""
    driver = Driver(max_num_batched_tokens=16, max_num_seqs=3)
    driver.add("A", 6)
    driver.add("B", 6)
    driver.step()
    driver.add("C", 10)
    driver.add("D", 4)
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"A": 1, "B": 1, "C": 10}
    assert t.post.waiting == ("D",)
    return t


@cases("SCHEDULE-ORDER")
def case_admission_skips_the_queue_head() -> Case:
    good = admission_with_a_second_waiting()
    d = good.pre.requests["D"]
    admit_d = NewRequestData("D", d.prompt_token_ids, (9,), 0)
    bad = with_output(with_scheduled(good, {"A": 1, "B": 1, "D": 4}), scheduled_new_reqs=(admit_d,))
    return Case(
        "SCHEDULE-ORDER",
        good,
        bad,
        "admissions skipped a waiting request",
        expected=["C"],
        actual=["D"],
    )


@cases("SCHEDULE-ORDER")
def case_admitted_request_not_at_the_end_of_running() -> Case:
    good = two_running_and_an_admission()
    post = dataclasses.replace(good.post, running=reordered(good.post.running, "C"))
    bad = dataclasses.replace(good, post=post)
    return Case(
        "SCHEDULE-ORDER",
        good,
        bad,
        "running order after the step",
        expected=["A", "B", "C"],
        actual=["C", "A", "B"],
    )


# ------------------------------------------------------------ GREEDY-BUDGET


@cases("GREEDY-BUDGET")
def case_admission_given_less_than_its_prompt() -> Case:
    good = two_running_and_an_admission()
    bad = with_scheduled(good, {"A": 1, "B": 1, "C": 9})
    return Case("GREEDY-BUDGET", good, bad, "tokens scheduled", "C", expected=10, actual=9)


@cases("GREEDY-BUDGET")
def case_chunk_smaller_than_the_budget_left() -> Case:
    driver = Driver(max_num_batched_tokens=6, max_num_seqs=2)
    driver.add("A", 10)
    driver.step()  # first chunk: 6
    good = driver.schedule()  # second chunk: the last 4
    assert dict(good.output.num_scheduled_tokens) == {"A": 4}
    bad = with_scheduled(good, {"A": 3})
    return Case("GREEDY-BUDGET", good, bad, "tokens scheduled", "A", expected=4, actual=3)


@cases("GREEDY-BUDGET")
def case_long_prefill_cap_ignored() -> Case:
    driver = Driver(long_prefill_token_threshold=4)
    driver.add("A", 10)
    driver.add("B", 10)
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"A": 4, "B": 4}
    bad = with_scheduled(good, {"A": 10, "B": 4})
    return Case("GREEDY-BUDGET", good, bad, "tokens scheduled", "A", expected=4, actual=10)


@cases("GREEDY-BUDGET")
def case_lone_request_capped() -> Case:
    # The long-prefill cap only applies when more than one request is present.
    driver = Driver(long_prefill_token_threshold=4)
    driver.add("A", 10)
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"A": 10}
    bad = with_scheduled(good, {"A": 4})
    return Case("GREEDY-BUDGET", good, bad, "tokens scheduled", "A", expected=10, actual=4)


@cases("GREEDY-BUDGET")
def case_chunk_with_chunked_prefill_off() -> Case:
    driver = Driver(enable_chunked_prefill=False)
    driver.add("A", 10)
    good = driver.schedule()
    bad = with_scheduled(good, {"A": 6})
    return Case("GREEDY-BUDGET", good, bad, "tokens scheduled", "A", expected=10, actual=6)


def priority_victim_after_the_chunk_was_sized() -> ScheduleTransition:
    """Priority, block_size 1, budget 4. V (priority 3) decodes first in running order;
    Y (priority 0) is prefilling a 20-token prompt 3 tokens a step. In the 7th step V
    takes 1 token and Y's chunk is sized to the 3 left, then Y's blocks do not fit and
    V, already scheduled, is the victim: its token goes back to the budget, but Y's
    chunk stays 3 (vLLM does the same: the chunk is sized before allocate_slots)."""
    driver = Driver(
        block_size=1,
        num_blocks=23,
        max_num_batched_tokens=4,
        max_num_seqs=2,
        max_model_len=23,
        policy="priority",
    )
    driver.add("V", 2, priority=3)
    driver.step()
    driver.add("Y", 20, priority=0)
    driver.steps(5)
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"Y": 3}
    assert t.output.preempted_req_ids == {"V"}
    return t


def test_greedy_budget_accepts_a_chunk_sized_before_a_priority_victim_was_unscheduled() -> None:
    assert CHECKS["GREEDY-BUDGET"](priority_victim_after_the_chunk_was_sized()) == []


def test_the_priority_victim_step_passes_every_other_schedule_invariant() -> None:
    t = priority_victim_after_the_chunk_was_sized()
    for invariant_id, info in CATALOGUE.items():
        if (
            info.kind == "schedule"
            and in_profile(info, "vllm-v1")
            and invariant_id != "GREEDY-BUDGET"
        ):
            assert CHECKS[invariant_id](t) == [], invariant_id


# ----------------------------------------------------------- RUNNING-SERVED


@cases("RUNNING-SERVED")
def case_running_request_skipped() -> Case:
    # #49097: a running request silently skipped for a whole step.
    good = two_running_and_an_admission()
    bad = with_scheduled(good, {"A": 1, "C": 10})
    return Case(
        "RUNNING-SERVED",
        good,
        bad,
        "skipped with budget left",
        request_id="B",
        expected=16,
        actual=1,
    )


@cases("RUNNING-SERVED")
def case_skipped_although_budget_was_left() -> Case:
    """Good: A's token and drafts use the whole budget of 4, so B legitimately waits a
    step. Bad: A is given 3, leaving a token B should have had."""
    driver = Driver(num_speculative_tokens=4, max_num_batched_tokens=4, max_num_seqs=2)
    driver.add("A", 4)
    driver.add("B", 4)
    driver.steps(3)  # A's prompt, then B's in a chunk of 3 and a chunk of 1
    assert driver.state.running == ("A", "B")
    driver.propose({"A": [1, 2, 3, 4]})
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"A": 4}
    bad = with_scheduled(good, {"A": 3})
    return Case(
        "RUNNING-SERVED",
        good,
        bad,
        "skipped with budget left",
        request_id="B",
        expected=4,
        actual=3,
    )


# --------------------------------------------------- NO-ADMIT-AFTER-PREEMPT


@cases("NO-ADMIT-AFTER-PREEMPT")
def case_admission_in_a_preempting_step() -> Case:
    good = fcfs_preemption()
    c = good.pre.requests["C"]
    bad = with_output(good, scheduled_new_reqs=(NewRequestData("C", c.prompt_token_ids, (), 0),))
    return Case("NO-ADMIT-AFTER-PREEMPT", good, bad, "admitted ['C'] after preempting ['B']")


# ------------------------------------------------------------------- VICTIM


@cases("VICTIM")
def case_fcfs_preempts_the_oldest() -> Case:
    good = fcfs_preemption()
    bad = with_output(good, preempted_req_ids=frozenset({"A"}))
    return Case("VICTIM", good, bad, "wrong victims", expected=["B"], actual=["A"])


def priority_preemption() -> ScheduleTransition:
    """priority: A (priority 1) is the least urgent, so A preempts itself and B runs."""
    t = preemption_step("priority", priorities=(1, 0, 0)).schedule()
    assert t.output.preempted_req_ids == {"A"}
    assert dict(t.output.num_scheduled_tokens) == {"B": 1}
    assert t.post.waiting == ("C", "A")
    return t


@cases("VICTIM")
def case_priority_preempts_the_most_urgent() -> Case:
    good = priority_preemption()
    bad = with_output(good, preempted_req_ids=frozenset({"B"}))
    return Case("VICTIM", good, bad, "wrong victims", expected=["A"], actual=["B"])


# -------------------------------------------------------------- QUEUE-ORDER


@cases("QUEUE-ORDER")
def case_fcfs_victim_behind_the_queue() -> Case:
    good = fcfs_preemption()
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("C", "B")))
    return Case(
        "QUEUE-ORDER", good, bad, "waiting queue order", expected=["B", "C"], actual=["C", "B"]
    )


@cases("QUEUE-ORDER")
def case_priority_queue_out_of_key_order() -> Case:
    good = priority_preemption()
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("A", "C")))
    return Case(
        "QUEUE-ORDER", good, bad, "waiting queue order", expected=["C", "A"], actual=["A", "C"]
    )


# ---------------------------------------------------------------- WATERMARK


def admission_beside_a_running_request(**config: object) -> ScheduleTransition:
    """A runs (2 blocks); B (prompt 8, 2 blocks) is admitted: 12 of 16 blocks left free."""
    driver = Driver(num_blocks=16, max_model_len=48, **config)
    driver.add("A", 6)
    driver.step()
    driver.add("B", 8)
    t = driver.schedule()
    assert [d.request_id for d in t.output.scheduled_new_reqs] == ["B"]
    assert len(t.post.kv.free_block_ids) == 12
    return t


@cases("WATERMARK")
def case_admission_into_the_watermark() -> Case:
    good = admission_beside_a_running_request(watermark=0.25)  # 4 blocks spare
    bad = dataclasses.replace(good, post=with_config(good.post, watermark=0.9))  # 14 spare
    return Case(
        "WATERMARK",
        good,
        bad,
        "admitted into the watermark",
        request_id="B",
        expected=14,
        actual=12,
    )


# ----------------------------------------------------------- ADMISSION-STOP


@cases("ADMISSION-STOP")
def case_head_left_waiting_with_room() -> Case:
    # max_num_seqs 1 keeps B waiting; seen under max_num_seqs 2, nothing kept it out.
    driver = Driver(max_num_seqs=1, num_blocks=16, max_model_len=48)
    driver.add("A", 6)
    driver.add("B", 4)
    good = driver.schedule()
    assert good.post.waiting == ("B",)
    bad = dataclasses.replace(good, post=with_config(good.post, max_num_seqs=2))
    return Case(
        "ADMISSION-STOP",
        good,
        bad,
        "queue head could have been admitted (1 blocks + 0 spare <= 14 free, 506 tokens left)",
        request_id="B",
    )


@cases("ADMISSION-STOP")
def case_head_of_line_without_chunking() -> Case:
    # Chunked prefill off: B's 100 tokens do not fit the 56 left, so B waits. With
    # chunking on, B should have started on a 56-token chunk.
    driver = Driver(enable_chunked_prefill=False, max_num_batched_tokens=256, num_blocks=128)
    driver.add("A", 200)
    driver.add("B", 100)
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"A": 200}
    bad = dataclasses.replace(good, post=with_config(good.post, enable_chunked_prefill=True))
    return Case(
        "ADMISSION-STOP",
        good,
        bad,
        "queue head could have been admitted (25 blocks + 0 spare <= 78 free, 56 tokens left)",
        request_id="B",
    )


@cases("ADMISSION-STOP")
def case_head_kept_out_by_phantom_blocks() -> Case:
    # Good: the KV cache cannot hold B's whole prompt. Bad: the free queue says it can.
    driver = Driver(num_blocks=8, max_model_len=32)
    driver.add("A", 20)
    driver.add("B", 16)
    good = driver.schedule()
    assert good.post.waiting == ("B",) and len(good.post.kv.free_block_ids) == 3
    bad = dataclasses.replace(
        good, post=with_kv(good.post, free_block_ids=(*good.post.kv.free_block_ids, 5, 6))
    )
    return Case(
        "ADMISSION-STOP",
        good,
        bad,
        "queue head could have been admitted (4 blocks + 0 spare <= 5 free",
        request_id="B",
    )


# --------------------------------------------------------------- FREE-ORDER

PROMPT = tokens(100, 10)  # two full blocks and two tokens


@cases("FREE-ORDER")
def case_uncached_block_freed_to_the_back() -> Case:
    # A's blocks: 0, 1 full and cached, 2 partial. Freed tail first: 2 to the front
    # (reuse first), 1 then 0 to the back (evict last).
    driver = Driver(enable_prefix_caching=True, num_blocks=8, max_model_len=32)
    driver.add("A", prompt=PROMPT, max_tokens=1)
    _, good = driver.step()
    free = good.post.kv.free_block_ids
    assert free == (2, 3, 4, 5, 6, 7, 1, 0)
    bad = dataclasses.replace(good, post=with_kv(good.post, free_block_ids=(*free[1:], 2)))
    return Case(
        "FREE-ORDER",
        good,
        bad,
        "free queue after freeing ['A']",
        expected=list(free),
        actual=[*free[1:], 2],
    )


@cases("FREE-ORDER")
def case_uncached_blocks_freed_head_first() -> Case:
    driver = Driver(num_blocks=8, max_model_len=32)
    driver.add("A", prompt=PROMPT, max_tokens=1)
    _, good = driver.step()
    free = good.post.kv.free_block_ids
    assert free == (2, 1, 0, 3, 4, 5, 6, 7)
    bad = dataclasses.replace(good, post=with_kv(good.post, free_block_ids=(0, 1, 2, *free[3:])))
    return Case(
        "FREE-ORDER",
        good,
        bad,
        "free queue after freeing ['A']",
        expected=list(free),
        actual=[0, 1, 2, *free[3:]],
    )


# --------------------------------------------------------- FREE-ORDER-ABORT


@cases(
    "FREE-ORDER-ABORT",
)
def case_aborted_blocks_in_the_wrong_order() -> Case:
    driver = Driver(enable_prefix_caching=True, num_blocks=8, max_model_len=32)
    driver.add("A", prompt=PROMPT)
    driver.add("B", 4)
    driver.step()  # A: 0, 1 (cached), 2; B: 3
    good = driver.abort("A")
    free = good.post.kv.free_block_ids
    assert free == (2, 4, 5, 6, 7, 1, 0)
    bad = dataclasses.replace(good, post=with_kv(good.post, free_block_ids=free[::-1]))
    return Case(
        "FREE-ORDER-ABORT",
        good,
        bad,
        "free queue after freeing ['A']",
        expected=list(free),
        actual=list(free[::-1]),
    )


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("build", cases.params())
def test_policy_invariant_holds_on_the_real_step(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_policy_invariant_fires_on_the_corrupted_step(build: CaseBuilder) -> None:
    assert_caught(build())


def test_policy_cases_are_vllm_v1_invariants() -> None:
    assert {CATALOGUE[i].profile for i in cases.ids()} == {"vllm-v1"}
