"""gpu_impl (B = 1) against the reference, in lockstep, block ids included.

A differential test proves something only if it can fail: each broken
variant below changes one rule of gpu_impl and the diff must name it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import schedspec.gpu_impl.admission as admission
import schedspec.gpu_impl.block_ops as block_ops
import schedspec.gpu_impl.running_phase as running_phase
from schedspec.adapters.gpu import gpu_engine
from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest, Drain, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.engines.registry import load_engine_factory
from schedspec.gpu_impl.batch_state import BIG, BatchState
from schedspec.gpu_impl.engine import BatchedScheduler
from schedspec.properties.differential import DiffOptions, diff_trace, run_diff
from schedspec.properties.strategies.configs import configs
from schedspec.properties.suite import SuiteSettings
from schedspec.spec import SchedulerConfig
from schedspec.traces.trace import Trace
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


# Async scheduling through the engine core's batch queue: A and B (7-token prompts) fill
# 4 blocks of 4; the third step preempts B while B's second step (which verifies two
# placeholder drafts) is in flight, and that stale output lands right after. b's
# max_tokens of 3 leaves it sure to reach them with a step in flight; a repeats A's
# first block, so a landed block is registered at update.
PIPELINED = Trace(
    SchedulerConfig(
        block_size=4,
        num_blocks=6,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=16,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        async_scheduling=True,
    ),
    (
        AddRequest("A", tuple(range(1000, 1007)), 8),
        AddRequest("B", tuple(range(2000, 2007)), 3),
        Step(),
        Step(),
        Step(StepDecisions(accepted={"A": 2, "B": 2})),
        Step(),
        AddRequest("a", tuple(range(1000, 1005)), 2),
        Drain(),
    ),
)

# Spec-decode padding: a decodes, then the one-token b is admitted beside it padded to
# 1 + 2 tokens; c, admitted alone after a prefix hit that leaves it one token, too.
PADDED = Trace(
    SchedulerConfig(
        block_size=4,
        num_blocks=16,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=24,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        pad_spec_decode=True,
    ),
    (
        AddRequest("a", tuple(range(1000, 1005)), 3),
        Step(),
        AddRequest("b", (2000,), 3),
        Step(),
        Drain(),
        AddRequest("c", tuple(range(1000, 1005)), 2),
        Step(),
        Drain(),
    ),
)


def test_engine_name_gpu_loads_the_adapter() -> None:
    assert load_engine_factory("gpu") is gpu_engine


@pytest.mark.parametrize(
    "trace",
    [BUSY, PREEMPTING, UNSCHEDULE, PIPELINED, PADDED],
    ids=["busy", "preempting", "unschedule", "pipelined", "padded"],
)
def test_hand_made_traces_agree_block_for_block(trace: Trace) -> None:
    result = diff_trace(trace, reference_engine, gpu_engine, "vllm-v1", EXACT)
    assert result.passed, result.divergence or result.violation or result.error
    assert result.stats.steps > 3


def _outputs(trace: Trace) -> list[dict[str, int]]:
    """The gpu engine's schedule() decisions along a trace it diffs clean on."""
    result = diff_trace(trace, reference_engine, gpu_engine, "vllm-v1", EXACT)
    assert result.passed
    return [dict(o.num_scheduled_tokens) for e in result.entries for o in e.outputs[1]]


def test_the_pipelined_trace_reaches_stale_output_and_the_max_tokens_skip() -> None:
    result = diff_trace(PIPELINED, reference_engine, gpu_engine, "vllm-v1", EXACT)
    assert result.passed
    outputs = [o for e in result.entries for o in e.outputs[1]]
    assert outputs[1].scheduled_spec_decode_tokens == {"A": (-1, -1), "B": (-1, -1)}
    preempted = next(i for i, o in enumerate(outputs) if o.preempted_req_ids == {"B"})
    # B's stale output (1 + 2 accepted placeholder drafts) brought it to max_tokens
    # while it waited: it finished without running again.
    assert all("B" not in o.num_scheduled_tokens for o in outputs[preempted:])
    assert any("B" in o.finished_req_ids for o in outputs[preempted + 1 :])
    # Steps with live requests and nothing scheduled: each running request's step in
    # flight was sure to bring it to max_tokens.
    assert {} in [dict(o.num_scheduled_tokens) for o in outputs]


def test_the_padded_trace_pads_beside_a_decode_and_after_a_lone_prefix_hit() -> None:
    decisions = _outputs(PADDED)
    assert {"a": 1, "b": 3} in decisions
    assert {"c": 3} in decisions


@pytest.mark.parametrize(
    ("async_scheduling", "pad_spec_decode"), [(True, None), (None, True)], ids=["async", "pad"]
)
def test_random_async_and_padded_workloads_agree(
    async_scheduling: bool | None, pad_spec_decode: bool | None
) -> None:
    settings = SuiteSettings(examples=25, rules_per_example=20, seed=20261201)
    strategy = configs(async_scheduling=async_scheduling, pad_spec_decode=pad_spec_decode)
    result = run_diff(reference_engine, gpu_engine, "vllm-v1", settings, strategy, EXACT)
    assert result.passed, result.divergence or result.error or result.other_error
    assert result.stats.steps > 200


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


# ---------------------------------------------------- the async and padding rules
# Each mutant below breaks one rule of gpu_impl's async scheduling or padding; the
# lockstep diff with the reference (a divergence, or an invariant the gpu side breaks
# first) must catch it on the hand-made traces.


def _caught(trace: Trace) -> str:
    """What the diff reports on a trace that a mutant breaks: the field that diverged,
    or the invariants the gpu side broke."""
    result = diff_trace(trace, reference_engine, gpu_engine, "vllm-v1", EXACT)
    if result.divergence is not None:
        return result.divergence.field
    assert result.violation is not None, result.error
    assert result.side == "right"  # the reference holds: gpu_impl broke the rule
    return ",".join(sorted({v.invariant for v in result.violation.violations}))


def test_padding_past_the_long_prefill_cap_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = admission._padding

    def ignoring_the_cap(
        config: SchedulerConfig, gate: Any, *counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_new, num_hit, budget, cap = counts
        no_cap = torch.full_like(cap, BIG)
        return original(config, gate, num_new, num_hit, budget, no_cap)

    monkeypatch.setattr(admission, "_padding", ignoring_the_cap)
    capped = Trace(
        dataclasses.replace(PADDED.config, long_prefill_token_threshold=2), PADDED.events
    )
    assert _caught(capped) == "GREEDY-BUDGET"  # b took 3 tokens past the cap of 2


def test_scheduling_a_request_sure_to_reach_max_tokens_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = running_phase._Reads.at

    def never_done(*args: Any) -> Any:
        return dataclasses.replace(original(*args), done=None)

    monkeypatch.setattr(running_phase._Reads, "at", staticmethod(never_done))
    assert _caught(PIPELINED) == "MAX-TOKENS"


def test_stale_output_taken_as_fresh_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = BatchedScheduler._land_stale

    def nothing_stale(self: BatchedScheduler, scheduled: torch.Tensor) -> torch.Tensor | None:
        stale = original(self, scheduled)  # the stale tokens still leave flight
        return None if stale is None else torch.zeros_like(stale)

    monkeypatch.setattr(BatchedScheduler, "_land_stale", nothing_stale)
    assert _caught(PIPELINED) == "ROLLBACK"  # B's stale drafts rolled back from 0


def test_registering_kv_still_in_flight_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    original = BatchedScheduler._register_landed

    def up_to_computed(self: BatchedScheduler, rows: torch.Tensor, rank: torch.Tensor) -> None:
        in_flight = self.state.num_in_flight.clone()
        self.state.num_in_flight.zero_()  # computed - 0: in-flight KV counts as landed
        original(self, rows, rank)
        self.state.num_in_flight.copy_(in_flight)

    monkeypatch.setattr(BatchedScheduler, "_register_landed", up_to_computed)
    assert _caught(PIPELINED) == "CACHE-CONFIRMED"


def test_demand_without_the_in_flight_outputs_diverges(monkeypatch: pytest.MonkeyPatch) -> None:
    original = running_phase._Reads.at

    def known_tokens_only(*args: Any) -> Any:
        reads = original(*args)
        return dataclasses.replace(reads, known=reads.num_tokens)

    monkeypatch.setattr(running_phase._Reads, "at", staticmethod(known_tokens_only))
    # A's second step asks for its placeholder drafts' positions only: they no longer
    # ride past the known tokens, and the budget it leaves goes unused.
    assert _caught(PIPELINED) == "DRAFTS,GREEDY-BUDGET"


def test_padding_beside_a_continuing_prefill_diverges(monkeypatch: pytest.MonkeyPatch) -> None:
    # p (20 tokens) prefills alone in a 16-token chunk, then its last 4 beside b.
    chunked = Trace(
        dataclasses.replace(
            PADDED.config, max_num_batched_tokens=16, long_prefill_token_threshold=8
        ),
        (AddRequest("p", tuple(range(1000, 1020)), 2), Step(), AddRequest("b", (7,), 2), Step()),
    )
    assert diff_trace(chunked, reference_engine, gpu_engine, "vllm-v1", EXACT).passed
    original = admission._may_pad

    def chunks_ignored(*args: Any) -> Any:
        gate = original(*args)
        return None if gate is None else dataclasses.replace(gate, no_chunk=gate.runs | True)

    monkeypatch.setattr(admission, "_may_pad", chunks_ignored)
    # Under vllm-v1 GREEDY-BUDGET flags b's 3 tokens on the gpu side first; the safety
    # invariants allow a padded admission, so there the diff itself names the decision.
    assert _caught(chunked) == "GREEDY-BUDGET"
    found = diff_trace(chunked, reference_engine, gpu_engine, "safety", EXACT).divergence
    assert found is not None
    assert (found.field, found.left, found.right) == (
        "num_scheduled_tokens",
        (("p", 4), ("b", 1)),
        (("p", 4), ("b", 3)),
    )
