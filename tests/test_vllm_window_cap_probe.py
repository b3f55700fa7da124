"""A probe of vLLM's window admission cap against lookahead slots (docs/HYBRID.md,
"Design decisions", the pool bound). vLLM sizes a sliding-window group's share of the
pool by `max_admission_blocks_per_request` and says a request never holds more. A step
allocates its lookahead slots too, which the cap leaves out, so under async scheduling
with EAGLE-style lookahead a window can hold a block more than its cap. The spec's pool
bound counts every block of the sequence and refuses such a pool, so this runs vLLM
alone, in a pool of vLLM's own sizing (`VllmEngine(config, num_blocks=...)`).

Needs vLLM (either supported release); skipped without it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed")

from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.engines.fake_model import FakeModel
from schedspec.engines.pipeline import EngineLoop
from schedspec.spec import Request, SchedulerConfig
from schedspec.spec.kv_groups import (
    FullAttentionGroup,
    SlidingWindowGroup,
    admission_cap_blocks,
    blocks_for_one_request,
    max_in_flight_tokens,
)

WINDOW = SlidingWindowGroup(block_size=4, sliding_window=5)
MAX_MODEL_LEN = 64
FULL_BLOCKS = MAX_MODEL_LEN // 4


def _config(lookahead: int) -> SchedulerConfig:
    return SchedulerConfig(
        block_size=4,
        num_blocks=32,
        max_num_batched_tokens=5,
        max_num_seqs=1,
        max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True,
        async_scheduling=True,
        num_speculative_tokens=4,
        num_lookahead_tokens=lookahead,
        pad_spec_decode=True,
        kv_cache_groups=(FullAttentionGroup(block_size=4), WINDOW),
    )


def _run(config: SchedulerConfig, num_blocks: int) -> tuple[int, int]:
    """A lone 40-token prompt with 20 tokens to generate, a step in flight as vLLM's
    async engine core keeps one: the most window blocks it held and its preemptions."""
    engine = VllmEngine(config, num_blocks=num_blocks)
    engine.add_request(Request("r", [1] * 40, 20))
    model = FakeModel(seed=0, vocab_size=64, num_speculative_tokens=4)
    loop = EngineLoop(engine, model, config, lambda: bool(engine.snapshot().requests))
    peak = preemptions = 0
    for _ in range(200):
        step = loop.step()
        request = engine.snapshot().requests.get("r")
        if request is not None and request.group_block_ids:
            peak = max(peak, sum(1 for b in request.group_block_ids[1] if b >= 0))
        if step.scheduled is not None and step.scheduled.preempted_req_ids:
            preemptions += 1
        if request is None and loop.in_flight == 0:
            return peak, preemptions
    raise AssertionError("the request did not finish in 200 steps")


def test_the_cap_is_the_window_peak_without_lookahead() -> None:
    cap = admission_cap_blocks(WINDOW, max_in_flight_tokens(5, True), MAX_MODEL_LEN)
    assert cap == 5  # cdiv(4 + 2 * 5, 4) + 1
    assert _run(_config(lookahead=0), FULL_BLOCKS + cap) == (cap, 0)


def test_lookahead_slots_take_a_window_past_its_cap_and_preempt_a_lone_request() -> None:
    """With 4 lookahead slots the window holds 6 blocks, one past its cap; in a pool of
    the full group's 16 blocks and the window's cap, vLLM's own sizing for one
    request, the lone request preempts itself once (it then recomputes and finishes).
    The spec's bound asks 32 blocks; a block more than vLLM's sizing already suffices."""
    config = _config(lookahead=4)
    cap = admission_cap_blocks(WINDOW, max_in_flight_tokens(5, True), MAX_MODEL_LEN)
    assert cap is not None and blocks_for_one_request(config.kv_cache_groups, 64, True) == 32
    peak, preemptions = _run(config, FULL_BLOCKS + cap)
    assert peak == cap + 1 and preemptions >= 1
    assert _run(config, FULL_BLOCKS + cap + 1) == (cap + 1, 0)
