"""vLLM 0.34.0's rules in the vllm-v1 profile are not vacuous: cache-aware admission's two
invariants, and the restated ones (SCHEDULE-ORDER, QUEUE-ORDER, GREEDY-BUDGET), each hold
on a real reference step and fire on a step corrupted the way a wrong engine would make it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schedspec.spec import RequestStatus
from schedspec.spec.invariants import CATALOGUE, ScheduleTransition, in_profile, waiting_phase
from tests.invariant_builders import (
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    with_config,
    with_request,
    with_scheduled,
)

cases = CaseRegistry()

# Block size 4. SEED leaves three full blocks cached (and free) when it ends.
SEED = tuple(range(1, 13))
COLD = tuple(range(100, 112))
WARM = (*range(1, 12), 99)  # SEED's first two blocks hit: 8 cached tokens
CACHE_AWARE: dict[str, Any] = {
    "enable_prefix_caching": True,
    "cache_aware_admission_window": 4,
    "cache_aware_admission_threshold": 0.0,
}


def seeded(**config: Any) -> Driver:
    driver = Driver(**{**CACHE_AWARE, **config})
    driver.add("S", prompt=SEED, max_tokens=1)
    while driver.state.requests:
        driver.step()
    return driver


def warm_admitted_first(**config: Any) -> ScheduleTransition:
    """One seat: C (cold) arrived first, W (warm) second; the reorder admits W."""
    driver = seeded(max_num_seqs=1, **config)
    driver.add("C", prompt=COLD)
    driver.add("W", prompt=WARM)
    return driver.schedule()


def reordered_step() -> ScheduleTransition:
    t = warm_admitted_first()
    assert t.admitted == ("W",) and t.post.waiting == ("C",)
    assert waiting_phase(t).moved and waiting_phase(t).cached_tokens == {"C": 0, "W": 8}
    return t


def fcfs_step_under(t: ScheduleTransition) -> ScheduleTransition:
    """What an engine without cache-aware admission does from the same queue (C admitted,
    W left), seen under t's config."""
    fcfs = warm_admitted_first(cache_aware_admission_window=0)
    assert fcfs.admitted == ("C",)
    config = {f: getattr(t.pre.config, f) for f in CACHE_AWARE}
    return dataclasses.replace(
        fcfs, pre=with_config(fcfs.pre, **config), post=with_config(fcfs.post, **config)
    )


def seen_under(t: ScheduleTransition, **config: Any) -> ScheduleTransition:
    return dataclasses.replace(
        t, pre=with_config(t.pre, **config), post=with_config(t.post, **config)
    )


# ------------------------------------------------------------ CACHE-AWARE-ORDER


@cases("CACHE-AWARE-ORDER")
def case_cold_request_admitted_ahead_of_a_warm_one() -> Case:
    good = reordered_step()
    return Case(
        "CACHE-AWARE-ORDER",
        good,
        fcfs_step_under(good),
        "'C' (0 cached tokens) went ahead of 'W' (8 cached tokens)",
        "C",
        expected=["W", "C"],
        actual=["C", "W"],
    )


def deeper_by_the_running_chunk() -> ScheduleTransition:
    """The order is the waiting phase's, not the pre-step state's. R hits SEED's first
    two blocks and prefills the rest 8 tokens a step (budget 8). W1 and W2 share R's
    first four blocks, cached before the step: tied at 16 tokens. W2 also shares R's
    fifth, which R's chunk in this step registers before admission: W2 is then 20 deep
    and goes first. The running chunk takes the whole budget, so nothing is admitted,
    and the reordered queue stays."""
    driver = seeded(max_num_seqs=3, max_num_batched_tokens=8)
    driver.add("R", prompt=(*SEED[:8], *range(300, 316)))
    driver.step()  # R: 8 hit, 8 computed; blocks 3 and 4 registered
    driver.add("W1", prompt=(*SEED[:8], *range(300, 308), 77, 78, 79, 80, 81))
    driver.add("W2", prompt=(*SEED[:8], *range(300, 312), 5))
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"R": 8}
    assert waiting_phase(t).cached_tokens == {"W1": 16, "W2": 20}
    assert t.post.waiting == ("W2", "W1")
    return t


@cases("CACHE-AWARE-ORDER")
def case_depth_read_before_the_running_chunk() -> Case:
    good = deeper_by_the_running_chunk()
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("W1", "W2")))
    return Case(
        "CACHE-AWARE-ORDER",
        good,
        bad,
        "'W1' (16 cached tokens) went ahead of 'W2' (20 cached tokens)",
        "W1",
        expected=["W2", "W1"],
        actual=["W1", "W2"],
    )


# ------------------------------------------------------------- CACHE-AWARE-KEEP


@cases("CACHE-AWARE-KEEP")
def case_reordered_below_the_threshold() -> Case:
    good = fcfs_step_under(reordered_step())
    good = seen_under(good, cache_aware_admission_threshold=0.9)
    assert waiting_phase(good).skipped == "usage below the threshold"
    bad = seen_under(reordered_step(), cache_aware_admission_threshold=0.9)
    return Case(
        "CACHE-AWARE-KEEP",
        good,
        bad,
        "place 0 of the queue went to 'W', but 'C' may not leave it: the reorder does not "
        "run (usage below the threshold)",
        "C",
        expected=["C", "W"],
        actual=["W", "C"],
    )


@cases("CACHE-AWARE-KEEP")
def case_reordered_without_prefix_caching_in_effect() -> Case:
    """vLLM ignores the window under priority: the same step seen so moves a request."""
    bad = seen_under(reordered_step(), policy="priority")
    good = seen_under(fcfs_step_under(reordered_step()), policy="priority")
    return Case("CACHE-AWARE-KEEP", good, bad, "the reorder does not run (off: window 0", "C")


@cases("CACHE-AWARE-KEEP")
def case_preempted_request_moved() -> Case:
    """The same step with C, at the head, a preempted request: it keeps its place, and
    W may not take it."""
    good = reordered_step()
    preempted = with_request(good.pre, "C", status=RequestStatus.PREEMPTED, num_preemptions=1)
    return Case(
        "CACHE-AWARE-KEEP",
        good,
        dataclasses.replace(good, pre=preempted),
        "'C' may not leave it: it is not a plain waiting request with nothing computed",
        "C",
    )


@cases("CACHE-AWARE-KEEP")
def case_moved_from_past_the_window() -> Case:
    """Window 2: W at place 2 is past it; the reorder may trade C and X only."""
    driver = seeded(max_num_seqs=1, cache_aware_admission_window=2)
    driver.add("C", prompt=COLD)
    driver.add("X", prompt=tuple(range(400, 412)))
    driver.add("W", prompt=WARM)
    good = driver.schedule()
    assert good.admitted == ("C",) and good.post.waiting == ("X", "W")
    bad = with_scheduled(good, {"W": 4})
    bad = dataclasses.replace(
        bad,
        output=dataclasses.replace(
            bad.output,
            scheduled_new_reqs=(good.output.scheduled_new_reqs[0]._replace(request_id="W"),),
        ),
        post=dataclasses.replace(good.post, waiting=("C", "X")),
    )
    return Case("CACHE-AWARE-KEEP", good, bad, "it is past the window of 2", "W")


# ------------------------------------------- the restated order, and the rule knob


@cases("QUEUE-ORDER")
def case_reorder_not_kept() -> Case:
    """With the only seat taken nothing is admitted, and the reordered queue stays: an
    engine that reorders only for this step's admissions leaves the old order."""
    driver = seeded(max_num_seqs=1)
    driver.add("B", prompt=tuple(range(700, 712)))
    driver.schedule()  # B takes the seat
    driver.add("C", prompt=COLD)
    driver.add("W", prompt=WARM)
    good = driver.schedule()
    assert not good.admitted and good.post.waiting == ("W", "C")
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("C", "W")))
    return Case(
        "QUEUE-ORDER", good, bad, "waiting queue order", expected=["W", "C"], actual=["C", "W"]
    )


@cases("SCHEDULE-ORDER")
def case_admitted_in_arrival_order_when_a_reorder_was_due() -> Case:
    good = reordered_step()
    return Case(
        "SCHEDULE-ORDER",
        good,
        fcfs_step_under(good),
        "admissions skipped a waiting request",
        expected=["W"],
        actual=["C"],
    )


@cases("GREEDY-BUDGET")
def case_capped_with_chunked_prefill_off_under_the_034_rule() -> Case:
    driver = Driver(
        enable_chunked_prefill=False, long_prefill_token_threshold=4, max_num_batched_tokens=256
    )
    driver.add("A", 10)
    driver.add("B", 10)
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"A": 10, "B": 10}
    bad = with_scheduled(good, {"A": 4, "B": 4})
    return Case("GREEDY-BUDGET", good, bad, "tokens scheduled", "A", expected=10, actual=4)


@cases("GREEDY-BUDGET")
def case_uncapped_with_chunked_prefill_off_under_the_033_rule() -> Case:
    driver = Driver(
        enable_chunked_prefill=False,
        long_prefill_token_threshold=4,
        long_prefill_needs_chunked_prefill=False,
        max_num_batched_tokens=256,
    )
    driver.add("A", 10)
    driver.add("B", 10)
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"A": 4, "B": 4}
    bad = with_scheduled(good, {"A": 10, "B": 4})
    return Case("GREEDY-BUDGET", good, bad, "tokens scheduled", "A", expected=4, actual=10)


# ------------------------------------------------------------------ the tests


def test_the_usage_is_read_after_the_running_requests_took_their_blocks() -> None:
    """Eight blocks, threshold 0.5: B holds three before the step (3/8) and takes a
    fourth for its next token before admission (1/2), so the reorder runs. A predicate
    reading the pre-step usage would call the real step a violation."""
    driver = seeded(
        num_blocks=8, max_model_len=32, max_num_seqs=2, cache_aware_admission_threshold=0.5
    )
    driver.add("B", prompt=tuple(range(700, 712)))
    driver.step()
    driver.add("C", prompt=tuple(range(300, 308)))
    driver.add("W", prompt=(*SEED[:8], 98))
    t = driver.schedule()
    phase = waiting_phase(t)
    assert 1 - len(t.pre.kv.free_block_ids) / 8 == 3 / 8
    assert (phase.skipped, phase.usage, t.admitted) == ("", 0.5, ("W",))
    for case_id in ("CACHE-AWARE-KEEP", "CACHE-AWARE-ORDER", "QUEUE-ORDER", "SCHEDULE-ORDER"):
        assert_holds(Case(case_id, t, t, ""))


@pytest.mark.parametrize("build", cases.params())
def test_invariant_holds_on_the_real_step(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_invariant_fires_on_the_corrupted_step(build: CaseBuilder) -> None:
    assert_caught(build())


def test_cases_are_vllm_v1_invariants() -> None:
    assert all(in_profile(CATALOGUE[i], "vllm-v1") for i in cases.ids())
