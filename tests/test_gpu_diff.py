"""gpu_impl (B = 1) against the reference, in lockstep, block ids included.

A differential test proves something only if it can fail: each broken
variant below changes one rule of gpu_impl and the diff must name it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import schedspec.gpu_impl.block_ops as block_ops
import schedspec.gpu_impl.running_phase as running_phase
from schedspec.gpu_impl.batch_state import BatchState
from schedspec.properties.adapters.gpu import gpu_engine
from schedspec.properties.differential import DiffOptions, diff_trace, run_diff
from schedspec.properties.engines import load_engine_factory
from schedspec.properties.events import AddRequest, Drain, Step
from schedspec.properties.reference_adapter import reference_engine
from schedspec.properties.suite import SuiteSettings
from schedspec.properties.trace import Trace
from schedspec.spec import SchedulerConfig
from tests.test_differential import BUSY, PREEMPTING

EXACT = DiffOptions(compare_block_ids=True)

# A priority victim scheduled earlier in its step: a (priority 1) decodes first and
# registers its third block, then b needs a block and a is preempted after all, so
# its budget comes back and the registration of KV it never computes is taken back.
UNSCHEDULE = Trace(
    SchedulerConfig(
        block_size=4,
        num_blocks=5,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=20,
        enable_prefix_caching=True,
        policy="priority",
    ),
    (
        AddRequest("a", tuple(range(1000, 1010)), 8, priority=1),
        Step(),
        AddRequest("b", tuple(range(2000, 2008)), 8, priority=0),
        Step(),
        Step(),
        Drain(),
    ),
)


def test_engine_name_gpu_loads_the_adapter() -> None:
    assert load_engine_factory("gpu") is gpu_engine


@pytest.mark.parametrize(
    "trace", [BUSY, PREEMPTING, UNSCHEDULE], ids=["busy", "preempting", "unschedule"]
)
def test_hand_made_traces_agree_block_for_block(trace: Trace) -> None:
    result = diff_trace(trace, reference_engine, gpu_engine, "vllm-v1", EXACT)
    assert result.passed, result.divergence or result.violation or result.error
    assert result.stats.steps > 3


def test_the_unschedule_trace_reaches_the_priority_corner(monkeypatch: pytest.MonkeyPatch) -> None:
    taken_back: list[int] = []
    original = block_ops.uncache_uncomputed

    def counted(state: BatchState, inst: torch.Tensor, slot: torch.Tensor, size: int) -> None:
        taken_back.append(int(state.num_cached_block[inst, slot].sum()))
        original(state, inst, slot, size)

    monkeypatch.setattr(running_phase, "uncache_uncomputed", counted)
    result = diff_trace(UNSCHEDULE, reference_engine, gpu_engine, "vllm-v1", EXACT)
    assert result.passed
    third_step = result.entries[4].outputs[1][0]
    assert dict(third_step.num_scheduled_tokens) == {"b": 1}
    assert third_step.preempted_req_ids == frozenset({"a"})
    assert taken_back == [3]  # a had registered three blocks; the third goes back


def test_random_workloads_over_every_config_strategy_agree() -> None:
    # The CI profile's machinery (all config strategies), kept small: the full
    # profile runs in .ci/run through `schedspec diff --right gpu`.
    settings = SuiteSettings(examples=25, rules_per_example=20, seed=20261129)
    result = run_diff(reference_engine, gpu_engine, "vllm-v1", settings, options=EXACT)
    assert result.passed, result.divergence or result.error or result.other_error
    assert result.stats.steps > 200


_release_ordered = block_ops._release_ordered


def _all_to_back(
    state: BatchState, inst: torch.Tensor, pos: torch.Tensor, row: torch.Tensor
) -> None:
    """The release that release_tables and release_rows share, except every freed block
    goes to the back (no 'reuse unhashed first')."""
    hashes = state.block_hash.clone()
    state.block_hash.fill_(0)
    _release_ordered(state, inst, pos, row)
    state.block_hash.copy_(hashes)


def test_a_free_order_bug_diverges_on_block_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_ops, "_release_ordered", _all_to_back)
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
