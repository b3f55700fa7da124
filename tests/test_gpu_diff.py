"""gpu_impl (B = 1) against the reference, in lockstep, block ids included.

A differential test proves something only if it can fail: each broken
variant below changes one rule of gpu_impl and the diff must name it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import schedspec.gpu_impl.block_ops as block_ops
import schedspec.gpu_impl.engine as engine
import schedspec.gpu_impl.running_phase as running_phase
import schedspec.gpu_impl.step_plan as step_plan
from schedspec.gpu_impl.batch_state import BatchState
from schedspec.properties.adapter import load_engine_factory
from schedspec.properties.adapters.gpu import gpu_engine
from schedspec.properties.differential import DiffOptions, diff_trace, run_diff
from schedspec.properties.reference_adapter import reference_engine
from schedspec.properties.suite import SuiteSettings
from schedspec.properties.trace import Trace
from tests.test_differential import BUSY, PREEMPTING

EXACT = DiffOptions(compare_block_ids=True)


def test_engine_name_gpu_loads_the_adapter() -> None:
    assert load_engine_factory("gpu") is gpu_engine


@pytest.mark.parametrize("trace", [BUSY, PREEMPTING], ids=["busy", "preempting"])
def test_hand_made_traces_agree_block_for_block(trace: Trace) -> None:
    result = diff_trace(trace, reference_engine, gpu_engine, "vllm-v1", EXACT)
    assert result.passed, result.divergence or result.violation or result.error
    assert result.stats.steps > 3


def test_random_workloads_over_every_config_strategy_agree() -> None:
    # The CI profile's machinery (all config strategies), kept small: the full
    # profile runs in .ci/run through `schedspec diff --right gpu`.
    settings = SuiteSettings(examples=25, rules_per_example=20, seed=20261129)
    result = run_diff(reference_engine, gpu_engine, "vllm-v1", settings, options=EXACT)
    assert result.passed, result.divergence or result.error or result.other_error
    assert result.stats.steps > 200


def _all_to_back(
    state: BatchState, inst: torch.Tensor, mask: torch.Tensor, rank: torch.Tensor
) -> None:
    """release_tables, except every freed block goes to the back (no 'reuse unhashed first')."""
    hashes = state.block_hash.clone()
    state.block_hash.fill_(0)
    block_ops.release_tables(state, inst, mask, rank)
    state.block_hash.copy_(hashes)


def test_a_free_order_bug_diverges_on_block_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "release_tables", _all_to_back)
    monkeypatch.setattr(step_plan, "release_tables", _all_to_back)
    result = diff_trace(PREEMPTING, reference_engine, gpu_engine, "safety", EXACT)
    found = result.divergence
    assert found is not None, result.violation or result.error
    assert found.field in ("free_block_ids", "block_ids")
    # Without block ids the two still make the same decisions on this trace.
    assert diff_trace(PREEMPTING, reference_engine, gpu_engine, "safety").passed


def test_a_budget_bug_diverges_on_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    original = running_phase._demand

    def one_short(*args: Any) -> torch.Tensor:
        demand: torch.Tensor = original(*args)
        return torch.where(demand > 1, demand - 1, demand)

    monkeypatch.setattr(running_phase, "_demand", one_short)
    found = diff_trace(BUSY, reference_engine, gpu_engine, "safety").divergence
    assert found is not None
    assert (found.observed, found.field) == ("schedule() output", "num_scheduled_tokens")
