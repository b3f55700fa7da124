"""CACHE-COMPUTED's oracle (properties/kv_oracle.py) on a hit of KV still in flight.

With async scheduling a decoding request's next step is scheduled before its sampled
token lands, so the oracle records that step's KV only once the step before it has
landed. A later step may hit a block the in-flight step completes: the block was
registered when the sampled token landed, and the KV is written by the time the later
step runs (steps run in order). A 20,000-example campaign found the oracle calling such
a hit "never computed" on the reference; vLLM 0.33.0 makes the same hit, block for block.
"""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest
from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError, replay
from schedspec.properties.kv_oracle import KVContentOracle, ScheduledStep
from schedspec.spec.block_hash import extend_block_hashes
from tests.regression_trace import assert_vllm_agrees, regression_trace

TRACE = regression_trace("hit-on-kv-in-flight")


def test_the_trace_reaches_a_hit_on_a_block_completed_by_a_step_in_flight() -> None:
    # r38 (15-token prompt) is prefilled at event 43; at 44 it decodes position 15 with
    # two placeholder drafts (its first block's last position, in flight); at 45 its
    # sampled token has landed, its first block is registered, and r30 (the same first
    # 16 tokens, 91 in all) is admitted on that 16-token hit: 75 tokens scheduled beside
    # r38's 3 (a budget of 92 could not hold r30's 91 without the hit).
    checked = CheckedEngine.from_factory(reference_engine, TRACE.config, "vllm-v1", TRACE.model)
    *before, last = TRACE.events
    for event in before:
        checked.apply(event)
    r38_first_block = checked.state.requests["r38"].block_ids[0]
    assert checked.state.requests["r30"].num_computed_tokens == 0
    checked.apply(last)
    r30 = checked.state.requests["r30"]
    assert r30.num_computed_tokens == 91
    assert r30.block_ids[0] == r38_first_block
    assert checked.state.kv.block_hashes[r38_first_block] is not None


def test_without_the_record_at_the_earlier_landing_the_hit_is_a_false_alarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the oracle said before it recorded an in-flight step's known tokens once the
    # step before it landed: the check is not vacuous on this trace.
    monkeypatch.setattr(KVContentOracle, "on_start_certain", lambda *_: None)
    with pytest.raises(InvariantViolationError, match=r"\[CACHE-COMPUTED\] request 'r30'"):
        replay(TRACE, reference_engine, "vllm-v1")


def test_vllm_makes_the_same_hit_block_for_block() -> None:
    assert_vllm_agrees(TRACE, "the in-flight hit on vLLM")


# ------------------------------------------- a request that ended with its step in flight

ENDED = regression_trace("hit-on-kv-of-an-ended-request-in-flight")


def test_a_finished_requests_in_flight_decode_writes_the_kv_sglang_caches() -> None:
    # SGLang family, overlap (async scheduling), one-token pages. r5 ([1], stop token 3)
    # is prefilled at #1 and sampled 3 there; #2 schedules its decode of position 1 (in
    # flight, fed the 3), then #1 lands: r5 stops. Its committed KV, [1, 3], goes into
    # the radix tree, and r6 ([1, 3, 5]) hits both pages at #4, before #2 has landed.
    checked = CheckedEngine.from_factory(reference_engine, ENDED.config, "sglang", ENDED.model)
    *before, last = ENDED.events
    for event in before:
        checked.apply(event)
    assert "r5" not in checked.state.requests
    assert checked.model.token_at("r5", 1) == 3
    checked.apply(last)
    assert scheduled_in_flight(checked, "r6") == 1  # [5]: a hit of two pages


def test_the_oracle_records_the_content_the_step_in_flight_was_fed() -> None:
    checked = CheckedEngine.from_factory(reference_engine, ENDED.config, "sglang", ENDED.model)
    for event in ENDED.events[:3]:  # at #2, #2 is scheduled, then #1 lands: r5 stops on its 3
        checked.apply(event)
    page_of_position_1 = step_in_flight(checked).tables["r5"][1]
    _, second = extend_block_hashes([], [1, 3], 1)
    assert checked._kv_content.written[page_of_position_1] == second
    assert second != extend_block_hashes([], [1, 4], 1)[1]


def test_without_the_ended_requests_record_the_hit_is_a_false_alarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the oracle said before (a CI run's flaky failure on a random seed): the
    # check is not vacuous on this trace.
    monkeypatch.setattr(KVContentOracle, "_remember_ended", lambda *_: None)
    with pytest.raises(InvariantViolationError, match=r"\[CACHE-COMPUTED\] request 'r6'"):
        replay(ENDED, reference_engine, "sglang")


def test_a_request_with_other_content_at_that_position_misses_there() -> None:
    # The same run with r6 asking for [1, 4, 5]: had the reference cached r5's page under
    # that content, the oracle would not vouch for it; it does not (it misses at 1).
    events = list(ENDED.events)
    arrival = events[3]
    assert isinstance(arrival, AddRequest)
    events[3] = dataclasses.replace(arrival, prompt_token_ids=(1, 4, 5))
    checked = replay(dataclasses.replace(ENDED, events=tuple(events)), reference_engine, "sglang")
    assert scheduled_in_flight(checked, "r6") == 2  # [4, 5]: a hit of one page


def scheduled_in_flight(checked: CheckedEngine, request_id: str) -> int:
    """Tokens the step still in flight scheduled for the request."""
    return step_in_flight(checked).output.num_scheduled_tokens[request_id]


def step_in_flight(checked: CheckedEngine) -> ScheduledStep:
    """The harness's one step in flight, read back."""
    (in_flight,) = checked._in_flight
    return in_flight


# ------------------------------- a stale landing after the blocks' new holder was aborted

OVERWRITTEN = regression_trace("stale-landing-after-the-new-holder-was-aborted")


def test_a_later_steps_kv_outlives_an_aborted_holder() -> None:
    # Async, priority, one-token blocks. At #22 r3 preempts r2 (scheduled, then
    # unscheduled) and takes blocks r2's step #21, in flight, computes; r3 is aborted
    # while #22 runs, and #21 lands stale for r2. #22 ran after #21: the blocks hold r3's
    # KV, and the new r3 with the same prompt hits them at #24.
    checked = replay(OVERWRITTEN, reference_engine, "vllm-v1")
    assert scheduled_in_flight(checked, "r3") == 1  # its 56-token prompt hit 55


def test_without_the_hand_out_order_the_hit_is_a_false_alarm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the oracle said before (a run of the priority-victim strategies under async):
    # the stale landing's record replaced the later step's once the holder was gone.
    monkeypatch.setattr(KVContentOracle, "_handed_out_since", lambda *_: False)
    with pytest.raises(InvariantViolationError, match=r"\[CACHE-COMPUTED\] request 'r3'"):
        replay(OVERWRITTEN, reference_engine, "vllm-v1")
