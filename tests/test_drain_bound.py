"""DRAIN's bound (drain_step_bound) under async scheduling with drafts.

Near max_model_len (or max_tokens) a decoding request with a draft cannot be scheduled
while its output is in flight: its placeholders would take it past the cap. It sits out
a step, that step lands the output, and the next one schedules it again, so each of its
tokens may take two steps. A 20,000-example campaign found the old bound (one step per
token) failing the reference; vLLM 0.33.0 takes the same steps on that trace.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.properties import checked_engine
from schedspec.properties.checked_engine import InvariantViolationError, replay
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import drain_step_bound
from tests.regression_trace import assert_vllm_agrees, regression_trace

TRACE = regression_trace("drain-async-drafts-at-the-cap")


def test_the_bound_per_mode() -> None:
    # max_model_len 4, 3 unfinished: 3 * 4 + 1 steps synchronously; one more to land the
    # last output under async scheduling; each token may take two with drafts too.
    sync = SchedulerConfig(
        block_size=1, num_blocks=8, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=4
    )
    pipelined = replace(sync, async_scheduling=True)
    drafting = replace(pipelined, num_speculative_tokens=1, pad_spec_decode=True)
    synchronous_drafts = replace(sync, num_speculative_tokens=1, pad_spec_decode=True)
    assert drain_step_bound(sync, 3) == 13
    assert drain_step_bound(synchronous_drafts, 3) == 13
    assert drain_step_bound(pipelined, 3) == 14
    assert drain_step_bound(drafting, 3) == 26


def test_a_drafting_request_at_the_cap_drains_within_the_bound() -> None:
    # r29 (1-token prompt, max_tokens 3, max_model_len 4, one draft): scheduled 1, then
    # 2 (a placeholder draft), sits out a step, scheduled 1, sits out, finishes; one
    # more step lands the last (empty) step in flight: 7 steps for one request.
    replay(TRACE, reference_engine, "vllm-v1")


def test_one_step_per_token_is_too_tight_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def one_step_per_token(config: SchedulerConfig, num_unfinished: int, *_: int) -> int:
        return num_unfinished * config.max_model_len + 1 + int(config.async_scheduling)

    monkeypatch.setattr(checked_engine, "drain_step_bound", one_step_per_token)
    with pytest.raises(InvariantViolationError, match=r"\[DRAIN\] 0 requests unfinished after 7"):
        replay(TRACE, reference_engine, "vllm-v1")


def test_vllm_takes_the_same_steps() -> None:
    assert_vllm_agrees(TRACE, "the drain at the cap on vLLM")
