"""Every slot-safety predicate and the output-invariance check can fail.

Runner mutants are small subclasses overriding the runner's injection point
(write_slots / context_slots); the scheduler mutant is the reference with a
prefix-cache hash that ignores token content. Each is run twice on the same
workload: with the slot checks, which must name the predicate that catches
it, and without them, where the outputs must differ from the dense run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from schedspec.adapters.reference import ReferenceEngine, reference_engine
from schedspec.gpu_impl.execution import (
    PagedModelRunner,
    SlotSafetyChecker,
    SlotSafetyError,
    TinyModel,
    check_output_invariance,
    execute_run,
)
from schedspec.gpu_impl.execution.executed_run import Arrival, ExecEngine
from schedspec.gpu_impl.execution.input_batch import InputBatch, table_slots
from schedspec.gpu_impl.execution.paged_attention import context_slots
from schedspec.gpu_impl.execution.request_states import RunnerRequestState
from schedspec.gpu_impl.execution.slot_safety import StepView, batch_layout
from schedspec.reference.vllm.free_block_queue import KVCacheBlock
from schedspec.reference.vllm.kv_cache_manager import KVCacheManager
from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    extend_block_hashes,
)
from schedspec.spec.block_hash import BlockHash
from tests.test_execution_invariance import (  # noqa: F401 (one_thread is an autouse fixture)
    TIGHT,
    one_thread,
    shared_prefix_workload,
    tiny_model,
)


class WrongSlotOffset(PagedModelRunner):
    """Writes each token one slot further along its block (wrapping)."""

    def write_slots(
        self, state: RunnerRequestState, positions: range, block_size: int
    ) -> list[int]:
        slots = table_slots(state, positions, block_size)
        return [s - s % block_size + (s + 1) % block_size for s in slots]


class HalvedOffset(PagedModelRunner):
    """offset // 2: two positions of a block land in one slot."""

    def write_slots(
        self, state: RunnerRequestState, positions: range, block_size: int
    ) -> list[int]:
        slots = table_slots(state, positions, block_size)
        return [s - s % block_size + (s % block_size) // 2 for s in slots]


class DecodeWritesFirstBlock(PagedModelRunner):
    """A decode writes into the first block of its table, a shared prefix block."""

    def write_slots(
        self, state: RunnerRequestState, positions: range, block_size: int
    ) -> list[int]:
        if positions.start != len(state.token_ids) - 1:
            return table_slots(state, positions, block_size)
        return [state.block_ids[0] * block_size + p % block_size for p in positions]


class SkipsARecomputedBlock(PagedModelRunner):
    """After a preemption, the first block it recomputes is never written."""

    def __init__(self, model: TinyModel, config: SchedulerConfig) -> None:
        super().__init__(model, config)
        self.resumed_at: dict[str, int] = {}  # request -> tokens with KV when it resumed

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for cached in scheduler_output.scheduled_cached_reqs:
            if cached.resumed:
                self.resumed_at[cached.request_id] = cached.num_computed_tokens
        return super().execute_model(scheduler_output)

    def write_slots(
        self, state: RunnerRequestState, positions: range, block_size: int
    ) -> list[int]:
        slots = table_slots(state, positions, block_size)
        if state.request_id not in self.resumed_at:
            return slots
        skipped = self.resumed_at[state.request_id] // block_size
        return [
            -1 if p // block_size == skipped else s for p, s in zip(positions, slots, strict=True)
        ]


class ReadsTheNextTable(PagedModelRunner):
    """Attention reads through the next scheduled request's block table."""

    def context_slots(self, batch: InputBatch, index: int) -> torch.Tensor:
        entry = batch.requests[index]
        other = (index + 1) % len(batch.requests)
        seq_len = entry.num_computed_before + entry.num_tokens
        return context_slots(batch.block_table[other], seq_len, self.block_size)


class ContentBlindKV(KVCacheManager):
    """Hashes a block by its position only: any two prompts 'share' their prefix."""

    def block_hashes(self, request: Request) -> list[BlockHash]:
        hashes = self._block_hashes.setdefault(request.request_id, [])
        return extend_block_hashes(hashes, [0] * request.num_tokens, self.block_size)


class ResumeSkipsABlock(KVCacheManager):
    """A resumed request 'hits' one block past its real cache hit: a free block
    with stale content, so the block's tokens are never recomputed."""

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        hits, num_hit = super().get_computed_blocks(request)
        if request.status is not RequestStatus.PREEMPTED:
            return hits, num_hit
        if num_hit + self.block_size > request.num_tokens - 1:
            return hits, num_hit  # the last token is always recomputed
        free = (b for b in self.block_pool.blocks if b.ref_cnt == 0 and b not in hits)
        stale = next(free, None)
        if stale is None:
            return hits, num_hit
        return [*hits, stale], num_hit + self.block_size


def resume_skipping_engine(config: SchedulerConfig) -> ReferenceEngine:
    engine = ReferenceEngine(config)
    engine.kv_cache_manager = ResumeSkipsABlock(config)
    return engine


def content_blind_engine(config: SchedulerConfig) -> ReferenceEngine:
    engine = ReferenceEngine(config)
    engine.kv_cache_manager = ContentBlindKV(config)
    return engine


def distinct_prompts() -> list[Arrival]:
    """Six requests with different prompts: only a content-blind cache can hit."""
    return [
        Arrival(1 + i, Request(f"r{i}", [(13 * i + 5 * j + 1) % 90 for j in range(14)], 12))
        for i in range(6)
    ]


EngineFactory = Callable[[SchedulerConfig], ExecEngine]
RunnerFactory = Callable[..., PagedModelRunner]

# mutant name -> (engine, runner, workload, the predicate that must catch it)
# Runner mutants first, then the scheduler mutants (the last two).
MUTANTS: dict[str, tuple[EngineFactory, RunnerFactory, Callable[[], list[Arrival]], str]] = {
    "wrong slot offset": (
        reference_engine,
        WrongSlotOffset,
        distinct_prompts,  # with shared blocks WRITE-NO-CLOBBER would catch it first
        "READ-FRESH",
    ),
    "two tokens, one slot": (
        reference_engine,
        HalvedOffset,
        lambda: shared_prefix_workload(6, 9, 20),
        "SLOT-UNIQUE",
    ),
    "decode writes a shared block": (
        reference_engine,
        DecodeWritesFirstBlock,
        lambda: shared_prefix_workload(6, 9, 20),
        "WRITE-NO-CLOBBER",
    ),
    "recompute after preemption skips a block": (
        reference_engine,
        SkipsARecomputedBlock,
        lambda: shared_prefix_workload(6, 9, 20),
        "READ-FRESH",
    ),
    "scheduler resumes past a block it never recomputes": (
        resume_skipping_engine,
        PagedModelRunner,
        lambda: shared_prefix_workload(6, 9, 20),
        "CACHED-KV-FRESH",
    ),
    "reads another request's table": (
        reference_engine,
        ReadsTheNextTable,
        lambda: shared_prefix_workload(6, 9, 20),
        "READ-OWN-TABLE",
    ),
    "scheduler hits a block whose content differs": (
        content_blind_engine,
        PagedModelRunner,
        distinct_prompts,
        "CACHED-KV-FRESH",
    ),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_slot_checks_name_the_mutant(name: str) -> None:
    engine, runner, workload, predicate = MUTANTS[name]
    with pytest.raises(SlotSafetyError) as caught:
        check_output_invariance(engine, TIGHT, tiny_model(), workload(), runner_factory=runner)
    assert caught.value.predicate == predicate, str(caught.value)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_outputs_betray_the_mutant(name: str) -> None:
    engine, runner, workload, _ = MUTANTS[name]
    report = check_output_invariance(
        engine, TIGHT, tiny_model(), workload(), runner_factory=runner, check_slots=False
    )
    assert report.mismatches


def test_the_same_workloads_pass_without_a_mutant() -> None:
    """The control: the workloads above are clean on the real runner and scheduler,
    and every predicate ran on every step."""
    for workload in (shared_prefix_workload(6, 9, 20), distinct_prompts()):
        runner = PagedModelRunner(tiny_model(), TIGHT)
        checker = SlotSafetyChecker(runner)
        run = execute_run(reference_engine(TIGHT), workload, runner, checker=checker)
        assert set(checker.counts.values()) == {run.num_steps}
        assert len(checker.counts) == 6


def test_batch_layout_fails_on_a_batch_with_a_wrong_token() -> None:
    """BATCH-LAYOUT by hand: one real step, then the batch's first token changed."""
    runner = PagedModelRunner(tiny_model(), TIGHT)
    checker = SlotSafetyChecker(runner)
    engine = reference_engine(TIGHT)
    engine.add_request(Request("r0", [1, 2, 3, 4, 5], 3))
    out = engine.schedule()
    runner.execute_model(out)
    checker.check_step(out, engine.snapshot())  # the real step passes
    step = runner.last_step
    assert step is not None
    state = engine.snapshot()
    sequences = {"r0": (1, 2, 3, 4, 5)}
    tags = {"r0": checker.tags.of("r0", sequences["r0"])}
    bad_tokens = step.batch.token_ids.clone()
    bad_tokens[0] = 9
    bad = dataclasses.replace(step, batch=dataclasses.replace(step.batch, token_ids=bad_tokens))
    good_view = StepView(out, state, step, sequences, tags)
    assert batch_layout(good_view, checker.context) is None
    message = batch_layout(StepView(out, state, bad, sequences, tags), checker.context)
    assert message == "request 'r0': batch tokens differ from its tokens at 0..4"
