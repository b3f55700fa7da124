"""Latency metrics and summaries, with worked examples."""

from __future__ import annotations

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.metrics import (
    Percentiles,
    format_table,
    percentile,
    request_metrics,
    summarize,
)
from schedspec.simulate.simulator import RequestTimeline, simulate
from schedspec.simulate.workloads import SimRequest
from schedspec.spec import SchedulerConfig


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([], 50) is None
    assert Percentiles.of([]) == Percentiles(None, None, None, None)
    assert Percentiles.of([5.0]) == Percentiles(5.0, 5.0, 5.0, 5.0)


def test_request_metrics_worked_example() -> None:
    # Arrives at 1; emits 1 token at 2, 1 at 3, 2 (a draft accepted) at 5; done at 5.
    t = RequestTimeline("A", 1.0, prompt_len=10, max_tokens=4)
    for end, count in ((2.0, 1), (3.0, 1), (5.0, 2)):
        t.emit(end, count)
    t.finish_time, t.finish_status = 5.0, "FINISHED_LENGTH_CAPPED"
    m = request_metrics(t)
    assert (m.ttft, m.tpot, m.worst_gap, m.e2e, m.num_output_tokens) == (1.0, 1.0, 2.0, 4.0, 4)


def test_a_timeline_counts_the_tokens_it_is_told_of() -> None:
    t = RequestTimeline("A", 0.0, prompt_len=10, max_tokens=8)
    assert (t.num_output_tokens, t.num_tokens) == (0, 10)
    t.emit(1.0, 2)  # a draft accepted
    t.emit(1.5, 1)
    assert (t.emit_times, t.emit_counts) == ([1.0, 1.5], [2, 1])
    assert (t.num_output_tokens, t.num_tokens) == (3, 13)


def test_single_token_has_no_tpot() -> None:
    t = RequestTimeline("A", 0.0, prompt_len=10, max_tokens=1)
    t.emit(2.0, 1)
    t.finish_time, t.finish_status = 2.0, "FINISHED_LENGTH_CAPPED"
    m = request_metrics(t)
    assert (m.tpot, m.worst_gap) == (None, None)


def test_unfinished_request_is_an_error() -> None:
    with pytest.raises(ValueError, match="'A' did not finish"):
        request_metrics(RequestTimeline("A", 0.0, prompt_len=10, max_tokens=1))


def test_summary_of_a_run() -> None:
    config = SchedulerConfig(
        block_size=16, num_blocks=64, max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512
    )
    unit = CostModel(
        weight_bytes=1, hbm_bandwidth=1, flops_per_token=1e-9, peak_flops=1, kv_bytes_per_token=1e-3
    )
    # Two requests alone: A's three steps (1.100, 1.101, 1.102 s), then B's one (1.010 s).
    workload = [SimRequest("A", 0.0, tuple(range(100)), 3), SimRequest("B", 10.0, (7,) * 10, 1)]
    result = simulate("toy", reference_engine, config, workload, unit, 0, 100)
    metrics = [request_metrics(t) for t in result.requests.values()]
    s = summarize(result, metrics)
    assert (s.num_requests, s.steps, s.preemptions, s.recomputed_tokens) == (2, 4, 0, 0)
    assert s.makespan_s == pytest.approx(11.010)
    assert s.output_tokens_per_s == pytest.approx(4 / 11.010)
    assert s.ttft_s.max == pytest.approx(1.1)
    assert s.prefix_cache_hit_rate is None  # caching off in this config
    # A holds at most 7 blocks (102 tokens, 16 a block) of the 64.
    assert s.kv_usage_peak == pytest.approx(7 / 64)
    lines = format_table([s, s])
    assert lines[0].split() == ["toy", "toy"]
    # p50 of TTFTs 1.100 and 1.010 s.
    assert any(line.startswith("TTFT p50 (ms)") and line.split()[-1] == "1055.0" for line in lines)
    assert "prefix-cache hit rate" in "\n".join(lines)
