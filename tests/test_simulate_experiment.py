"""The seed's claim, measured: chunked prefill raises the long prompt's TTFT and
lowers the decodes' worst TPOT."""

from __future__ import annotations

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.simulate.configs import EXPERIMENT_PRESETS, resolve_configs
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.experiment import TradeOff, format_trade_offs, trade_off
from schedspec.simulate.metrics import request_metrics
from schedspec.simulate.runs import run_configs
from schedspec.simulate.workloads import long_prompt_among_decodes


def _trade_offs(cost: CostModel) -> dict[str, TradeOff]:
    configs = resolve_configs([], False, True, {"num_blocks": 6976}, cost)
    assert [c.name for c in configs] == list(EXPERIMENT_PRESETS)
    workload = long_prompt_among_decodes(0, 4096)
    runs = run_configs(configs, workload, reference_engine, cost, 0, 100_000)
    return {r.result.name: trade_off(r.result.name, r.metrics) for r in runs}


def test_chunking_trades_long_prompt_ttft_for_decode_smoothness() -> None:
    rows = _trade_offs(CostModel())
    whole, chunked = rows["no-chunking"], rows["chunked-512"]
    assert chunked.long_ttft_s > whole.long_ttft_s
    assert chunked.decodes_worst_gap_s < whole.decodes_worst_gap_s
    # The whole 3500-token prompt runs in one step with the 16 decodes: that step
    # is the decodes' worst gap, compute bound at 3516 * 13.48 GFLOP / 989 TFLOP/s.
    assert whole.decodes_worst_gap_s == pytest.approx(3516 * 13.48e9 / 989e12, rel=0.1)
    lines = format_trade_offs([whole, chunked], 3500)
    assert "a 3500-token prompt" in lines[0]
    assert lines[-1].startswith("  chunked-512 vs no-chunking: long prompt TTFT x1.")


def test_without_a_weight_floor_or_kv_cost_the_ttft_penalty_vanishes() -> None:
    # The TTFT penalty comes from paying the weight floor and the KV re-reads once
    # per chunk: with both near zero, chunking costs the long prompt almost nothing.
    flat = CostModel(weight_bytes=1.0, kv_bytes_per_token=1e-9)
    rows = _trade_offs(flat)
    assert rows["chunked-512"].long_ttft_s == pytest.approx(
        rows["no-chunking"].long_ttft_s, rel=0.02
    )


def test_needs_the_long_prompt_workload() -> None:
    cost = CostModel()
    (config,) = resolve_configs(["chunked"], False, False, {}, cost)
    workload = long_prompt_among_decodes(0, 4096)[:3]
    (run,) = run_configs([config], workload, reference_engine, cost, 0, 10_000)
    with pytest.raises(ValueError, match="no request 'long'"):
        trade_off("chunked", [request_metrics(t) for t in run.result.requests.values()])
