"""CACHE-COMPUTED's oracle (properties/kv_oracle.py) on a hit of KV still in flight.

With async scheduling a decoding request's next step is scheduled before its sampled
token lands, so the oracle records that step's KV only once the step before it has
landed. A later step may hit a block the in-flight step completes: the block was
registered when the sampled token landed, and the KV is written by the time the later
step runs (steps run in order). A 20,000-example campaign found the oracle calling such
a hit "never computed" on the reference; vLLM 0.33.0 makes the same hit, block for block.
"""

from __future__ import annotations

import pytest

from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError, replay
from schedspec.properties.kv_oracle import KVContentOracle
from schedspec.properties.reference_adapter import reference_engine
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
