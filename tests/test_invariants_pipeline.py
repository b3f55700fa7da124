"""The pipeline invariants (async scheduling) are not vacuous: each fires on a corrupted
real state or transition of the reference driven the engine core's async way, naming
the request at fault, and holds on what it was corrupted from.
"""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.spec import RequestOutput, RequestStatus, State
from schedspec.spec.invariants import CATALOGUE, ScheduleTransition, UpdateTransition
from tests.invariant_builders import (
    DEFAULT_TOKEN,
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    with_kv,
    with_request,
)

cases = CaseRegistry()


def async_decode() -> tuple[Driver, ScheduleTransition, ScheduleTransition, UpdateTransition]:
    """A (8-token prompt, block_size 4) prefilled in step 1; step 2 (A's decode) is
    scheduled before step 1 lands. Returns the driver, both schedules and step 1's land.

    After step 1 lands A has 9 tokens, 9 computed, 1 in flight, 1 placeholder."""
    driver = Driver(async_scheduling=True, enable_prefix_caching=True, max_model_len=64)
    driver.add("A", 8, max_tokens=5)
    first = driver.schedule()
    second = driver.schedule()
    assert dict(second.output.num_scheduled_tokens) == {"A": 1}
    landed = driver.update(first)
    a = landed.post.requests["A"]
    assert (a.num_tokens, a.num_computed_tokens, a.num_in_flight_tokens) == (9, 9, 1)
    assert a.num_output_placeholders == 1
    return driver, first, second, landed


def retried_while_in_flight() -> UpdateTransition:
    """A (8-token prompt) is scheduled, then aborted while that step is in flight and sent
    again under the same id; the new A is scheduled (its whole prompt: 1 placeholder),
    then the old step lands. Its output was sampled for the old A: nothing of it reaches
    the new one, whose counters stay as its own schedule() left them."""
    driver = Driver(async_scheduling=True, max_model_len=64)
    driver.add("A", 8, max_tokens=5)
    old_step = driver.schedule()
    driver.abort("A")
    driver.add("A", 8, max_tokens=5)
    driver.schedule()
    landed = driver.update(old_step)
    assert landed.model_output.sampled_token_ids  # the model answered the old A's step
    assert not landed.scheduled_for(landed.pre.requests["A"])
    a = landed.post.requests["A"]
    assert (a.output_token_ids, a.num_computed_tokens, a.num_in_flight_tokens) == ((), 8, 8)
    assert a.num_output_placeholders == 1
    return landed


def mid_pipeline_state() -> State:
    """A with two steps in flight: 9 computed, 9 in flight, 2 placeholders, 8 tokens."""
    _, _, second, _ = async_decode()
    a = second.post.requests["A"]
    assert (a.num_computed_tokens, a.num_in_flight_tokens, a.num_output_placeholders) == (9, 9, 2)
    return second.post


# ------------------------------------------------------------------- PIPELINE


@cases("PIPELINE")
def case_placeholders_over_the_tokens_in_flight() -> Case:
    good = mid_pipeline_state()
    bad = with_request(good, "A", num_output_placeholders=10)
    return Case("PIPELINE", good, bad, "placeholders 10 or stale 0 over in flight 9", "A")


@cases("PIPELINE")
def case_running_with_stale_output() -> Case:
    good = mid_pipeline_state()
    bad = with_request(good, "A", num_stale_output_tokens=1)
    return Case("PIPELINE", good, bad, "RUNNING with 1 stale tokens in flight", "A")


@cases("PIPELINE")
def case_placeholders_without_async() -> Case:
    good = mid_pipeline_state()
    sync = dataclasses.replace(good.config, async_scheduling=False)
    bad = dataclasses.replace(good, config=sync)
    return Case("PIPELINE", good, bad, "placeholders or stale output without async", "A")


@cases("PIPELINE")
def case_confirmed_progress_past_the_known_tokens() -> Case:
    good = mid_pipeline_state()
    bad = with_request(good, "A", num_in_flight_tokens=1)  # 8 confirmed of 8 tokens
    return Case("PIPELINE", good, bad, "confirmed computed tokens 8 outside [0, 7]", "A")


@cases("PIPELINE")
def case_negative_counter() -> Case:
    good = mid_pipeline_state()
    bad = with_request(good, "A", num_stale_output_tokens=-1)
    return Case("PIPELINE", good, bad, "negative counter", "A")


# ----------------------------------------------------------------- MAX-TOKENS


@cases("MAX-TOKENS")
def case_scheduled_past_max_tokens_in_flight() -> Case:
    """A (max_tokens 5) has its prefill's token in flight: 8 computed + 2 - 1 placeholder
    = 9 sure tokens. With max_tokens 1 that one token ends it: no further step."""
    _, _, second, _ = async_decode()
    bad_pre = with_request(second.pre, "A", max_tokens=1)
    bad = dataclasses.replace(second, pre=bad_pre)
    return Case(
        "MAX-TOKENS", second, bad, "scheduled although its in-flight step reaches max_tokens", "A"
    )


# ----------------------------------------------------------------- STALE-HOLD


@cases("STALE-HOLD")
def case_resumed_with_stale_output_in_flight() -> Case:
    """fcfs: B preempted, then resumed once A finished; pretend its stale output had not
    landed yet when it was resumed."""
    driver = Driver(num_blocks=6, max_model_len=24, max_num_seqs=4)
    driver.add("A", 8, max_tokens=6)
    driver.add("B", 8)
    driver.steps(5)
    for _ in range(12):
        t, _ = driver.step()
        if any(c.resumed for c in t.output.scheduled_cached_reqs):
            break
    assert any(c.resumed and c.request_id == "B" for c in t.output.scheduled_cached_reqs)
    bad = dataclasses.replace(t, pre=with_request(t.pre, "B", num_stale_output_tokens=1))
    return Case("STALE-HOLD", t, bad, "resumed with 1 stale tokens in flight", "B")


# ----------------------------------------------------------- SCHEDULE-PIPELINE


@cases("SCHEDULE-PIPELINE")
def case_in_flight_tokens_not_counted() -> Case:
    _, _, second, _ = async_decode()
    bad = dataclasses.replace(second, post=with_request(second.post, "A", num_in_flight_tokens=8))
    return Case("SCHEDULE-PIPELINE", second, bad, "in-flight tokens", "A", None, 9, 8)


@cases("SCHEDULE-PIPELINE")
def case_no_placeholder_for_a_sampling_step() -> Case:
    _, _, second, _ = async_decode()
    bad_post = with_request(second.post, "A", num_output_placeholders=1)
    bad = dataclasses.replace(second, post=bad_post)
    return Case("SCHEDULE-PIPELINE", second, bad, "output placeholders", "A", None, 2, 1)


@cases("SCHEDULE-PIPELINE")
def case_a_sampling_step_marked_a_prefill_chunk() -> Case:
    _, _, second, _ = async_decode()
    bad = dataclasses.replace(second, post=with_request(second.post, "A", is_prefill_chunk=True))
    return Case("SCHEDULE-PIPELINE", second, bad, "prefill-chunk flag", "A", None, False, True)


# ------------------------------------------------------------- UPDATE-PIPELINE


@cases("UPDATE-PIPELINE")
def case_landed_tokens_still_in_flight() -> Case:
    _, _, _, landed = async_decode()
    bad = dataclasses.replace(landed, post=with_request(landed.post, "A", num_in_flight_tokens=9))
    return Case(
        "UPDATE-PIPELINE", landed, bad, "(in flight, stale, placeholders)", "A", None, (1, 0, 1)
    )


@cases("UPDATE-PIPELINE")
def case_placeholder_not_resolved() -> Case:
    _, _, _, landed = async_decode()
    bad_post = with_request(landed.post, "A", num_output_placeholders=2)
    bad = dataclasses.replace(landed, post=bad_post)
    return Case(
        "UPDATE-PIPELINE",
        landed,
        bad,
        "(in flight, stale, placeholders)",
        "A",
        None,
        (1, 0, 1),
        (1, 0, 2),
    )


# -------------------------------------------------------------------- DELIVERY


@cases("DELIVERY")
def case_tokens_land_at_the_wrong_position() -> Case:
    _, _, _, landed = async_decode()
    bad = dataclasses.replace(landed, sampled_at={"A": 9})
    return Case(
        "DELIVERY",
        landed,
        bad,
        "land at another position than they were sampled for",
        "A",
        None,
        9,
        8,
    )


@cases("DELIVERY")
def case_output_of_an_aborted_request_given_to_its_successor() -> Case:
    """The step was scheduled for an earlier request named A (arrival 7): its output
    must not reach this A."""
    _, _, _, landed = async_decode()
    bad = dataclasses.replace(landed, scheduled_arrivals={"A": 7})
    return Case("DELIVERY", landed, bad, "output of a step not scheduled for this request", "A")


@cases("DELIVERY")
def case_output_of_the_predecessor_applied_to_a_retried_request() -> Case:
    """The real transition holds every update invariant (none mistakes the old A's output
    for the new A's); the new A given that output breaks DELIVERY."""
    landed = retried_while_in_flight()
    bad = dataclasses.replace(
        landed, post=with_request(landed.post, "A", output_token_ids=(DEFAULT_TOKEN,))
    )
    return Case("DELIVERY", landed, bad, "output of a step not scheduled for this request", "A")


# ------------------------------------------------------- NO-OUTPUT-AFTER-ABORT


def aborted_while_its_step_ran() -> UpdateTransition:
    """Sync: A (8-token prompt) and B are scheduled; A is aborted while the step runs
    (vLLM's abort queue, drained before update_from_output); the step lands. The model
    answered A too, but only B hears of it."""
    driver = Driver(max_model_len=64)
    driver.add("A", 8, max_tokens=5)
    driver.add("B", 4, max_tokens=5)
    step = driver.schedule()
    assert set(step.output.num_scheduled_tokens) == {"A", "B"}
    driver.abort("A")
    landed = driver.update(step)
    assert "A" not in landed.pre.requests and landed.request_outputs is not None
    assert set(landed.request_outputs) == {"B"}
    return landed


@cases("NO-OUTPUT-AFTER-ABORT")
def case_output_reported_for_a_request_aborted_while_its_step_ran() -> Case:
    landed = aborted_while_its_step_ran()
    assert landed.request_outputs is not None
    told = {**landed.request_outputs, "A": RequestOutput("A", (DEFAULT_TOKEN,), None)}
    bad = dataclasses.replace(landed, request_outputs=told)
    return Case("NO-OUTPUT-AFTER-ABORT", landed, bad, "reported for a finished request", "A")


@cases("NO-OUTPUT-AFTER-ABORT")
def case_aborted_requests_output_reported_to_its_successor() -> Case:
    """The old A's step lands after the new A arrived: reporting its token names the new
    A, which never computed it."""
    landed = retried_while_in_flight()
    assert not landed.request_outputs
    told = {"A": RequestOutput("A", (DEFAULT_TOKEN,), None)}
    bad = dataclasses.replace(landed, request_outputs=told)
    return Case("NO-OUTPUT-AFTER-ABORT", landed, bad, "to the request that reuses its id", "A")


@cases("UPDATE-PIPELINE")
def case_predecessors_output_resolves_a_placeholder() -> Case:
    landed = retried_while_in_flight()
    bad = dataclasses.replace(
        landed, post=with_request(landed.post, "A", num_output_placeholders=0)
    )
    return Case(
        "UPDATE-PIPELINE",
        landed,
        bad,
        "(in flight, stale, placeholders)",
        "A",
        None,
        (8, 0, 1),
        (8, 0, 0),
    )


# ------------------------------------------------------------- CACHE-CONFIRMED


@cases("CACHE-CONFIRMED")
def case_block_registered_before_its_kv_landed() -> Case:
    """A's third block (positions 8-11) is computed by step 2, still in flight."""
    _, _, _, landed = async_decode()
    a = landed.post.requests["A"]
    block = a.block_ids[2]
    hashes = list(landed.post.kv.block_hashes)
    assert hashes[block] is None
    hashes[block] = 12345
    bad = dataclasses.replace(landed, post=with_kv(landed.post, block_hashes=tuple(hashes)))
    return Case(
        "CACHE-CONFIRMED", landed, bad, "registered before its KV landed", "A", block, 8, 12
    )


# ----------------------------------------------------------------- UPDATE-FRAME


def stale_landing() -> UpdateTransition:
    """4 blocks of 4: A and B (7-token prompts) fill the cache; A's ninth slot preempts B
    (fcfs) while B's second step is in flight, and C waits behind B. Then that step lands:
    B's stale token is delivered, and B stays PREEMPTED at the head of the queue."""
    driver = Driver(async_scheduling=True, num_blocks=4, max_model_len=16)
    driver.add("A", 7)
    driver.add("B", 7)
    first = driver.schedule()
    second = driver.schedule()
    driver.update(first)
    driver.add("C", 14)
    third = driver.schedule()
    assert third.output.preempted_req_ids == {"B"} and third.post.waiting == ("B", "C")
    landed = driver.update(second)
    assert landed.pre.requests["B"].num_stale_output_tokens == 1
    assert landed.post.waiting == ("B", "C")
    return landed


@cases("UPDATE-FRAME")
def case_stale_landing_sends_its_request_to_the_back() -> Case:
    good = stale_landing()
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("C", "B")))
    message = "waiting queue changed"
    return Case("UPDATE-FRAME", good, bad, message, None, None, ("B", "C"), ("C", "B"))


@cases("UPDATE-FRAME")
def case_stale_landing_turns_a_preempted_request_into_a_new_one() -> Case:
    # B's stale output is all in now; an engine that then forgets the preemption would
    # send B to the runner as a new request and lose its preemption count's meaning.
    good = stale_landing()
    bad = dataclasses.replace(good, post=with_request(good.post, "B", status=RequestStatus.WAITING))
    return Case(
        "UPDATE-FRAME",
        good,
        bad,
        "status changed",
        "B",
        None,
        RequestStatus.PREEMPTED,
        RequestStatus.WAITING,
    )


@cases("UPDATE-FRAME")
def case_landing_changes_a_priority() -> Case:
    _, _, _, good = async_decode()
    bad = dataclasses.replace(good, post=with_request(good.post, "A", priority=5))
    return Case("UPDATE-FRAME", good, bad, "priority changed", "A", None, 0, 5)


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("build", cases.params())
def test_pipeline_invariant_holds_on_the_real_transition(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_pipeline_invariant_fires_on_the_corruption(build: CaseBuilder) -> None:
    assert_caught(build())


def test_pipeline_cases_cover_the_pipeline_invariants() -> None:
    pipeline = {
        "PIPELINE",
        "MAX-TOKENS",
        "STALE-HOLD",
        "SCHEDULE-PIPELINE",
        "UPDATE-PIPELINE",
        "DELIVERY",
        "NO-OUTPUT-AFTER-ABORT",
        "CACHE-CONFIRMED",
        "UPDATE-FRAME",
    }
    assert cases.ids() == pipeline
    assert all(CATALOGUE[i].profile == "safety" for i in pipeline)
