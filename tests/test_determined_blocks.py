"""What DETERMINED cannot say, tested: two engines that pass vllm-v1 on the same trace
agree block for block.

`schedspec prove --only DETERMINED` shows the vllm-v1 profile pins down the decisions of
schedule() in the counts model: tokens per request, the preempted set, the admitted set.
That model has no block ids, no hashes, no shared blocks and no free queue, so it cannot
say which block a request gets, what a prefix hit returns, or which cached block is
evicted (docs/FORMAL.md, "DETERMINED"). These tests drive independent implementations in
lockstep, each checked against every vllm-v1 invariant at every call, with block ids and
the free-queue order compared too: the reference against gpu_impl always, and against
vLLM's own scheduler where vLLM is installed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import strategies as st

from schedspec.adapters.gpu import gpu_engine
from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest, Drain, Step
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.registry import load_engine_factory
from schedspec.properties.differential import DiffOptions, diff_trace, run_diff
from schedspec.properties.strategies.configs import configs
from schedspec.properties.suite import SuiteSettings
from schedspec.spec import SchedulerConfig
from schedspec.traces.trace import Trace
from tests.vllm_required import require_vllm

EXACT = DiffOptions(compare_block_ids=True)

SHARED = tuple(range(500, 508))  # two full blocks of 4 every request starts with

# What the counts model abstracts, on one trace: A fills three blocks and caches them. B
# is admitted on a hit of A's first two (a block held twice, ref count 2) in the step A
# finishes in: A's third block, cached, goes to the back of the free queue. C hits the
# same two blocks while B runs; C finishes and its partial block, uncached, goes to the
# front. D (22 tokens, no hit) takes six blocks from the front and so evicts A's cached
# third block; B and D finish and free tail first.
CACHED = Trace(
    SchedulerConfig(
        block_size=4,
        num_blocks=10,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=24,
        enable_prefix_caching=True,
    ),
    (
        AddRequest("A", (*SHARED, 1, 2, 3), 2),
        Step(),
        AddRequest("B", (*SHARED, 4, 5), 6),
        Step(),
        Step(),
        AddRequest("C", (*SHARED, 6), 3),
        Step(),
        Step(),
        Step(),
        AddRequest("D", tuple(range(900, 922)), 1),
        Step(),
        Step(),
        Drain(),
    ),
)


def prefix_cached() -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs with prefix caching on: shared blocks, hits and evictions
    (cache-aware admission's reorder included, which reads the cache)."""
    return configs().map(lambda c: replace(c, enable_prefix_caching=True))


def _factory(name: str) -> EngineFactory:
    """The engine `schedspec diff --right NAME` runs."""
    if name == "vllm":
        require_vllm("the reference against vLLM, block for block")
    return load_engine_factory(name)


@pytest.mark.parametrize("engine", ["gpu", "vllm"])
def test_shared_prefix_blocks_agree_block_for_block(engine: str) -> None:
    result = diff_trace(CACHED, reference_engine, _factory(engine), "vllm-v1", EXACT)
    assert result.passed, result.divergence or result.error
    new = {
        n.request_id: n
        for entry in result.entries
        for output in entry.outputs[0]
        for n in output.scheduled_new_reqs
    }
    # B and C hit the shared prefix: the same two blocks A filled.
    assert new["B"].num_computed_tokens == new["C"].num_computed_tokens == 8
    assert new["B"].block_ids[:2] == new["C"].block_ids[:2] == new["A"].block_ids[:2]


def test_random_prefix_cached_workloads_agree_block_for_block_with_gpu_impl() -> None:
    settings = SuiteSettings(examples=20, rules_per_example=20, seed=20261201)
    result = run_diff(reference_engine, gpu_engine, "vllm-v1", settings, prefix_cached(), EXACT)
    assert result.passed, result.divergence or result.error or result.other_error
    assert result.stats.steps > 150


def test_random_workloads_agree_block_for_block_with_vllm() -> None:
    factory = _factory("vllm")
    from schedspec.adapters.vllm.config import avoid_known_corners
    from schedspec.properties.strategies.engine_configs import vllm_configs

    settings = SuiteSettings(examples=10, rules_per_example=20, seed=20261201)
    # Caching on, then out of the corners where vLLM and the spec are known to part
    # (under priority that turns caching off again: docs/FINDINGS.md F2).
    strategy = vllm_configs().map(lambda c: replace(c, enable_prefix_caching=True))
    strategy = strategy.map(avoid_known_corners)
    result = run_diff(reference_engine, factory, "vllm-v1", settings, strategy, EXACT)
    assert result.passed, result.divergence or result.error or result.other_error
    assert result.stats.steps > 50
