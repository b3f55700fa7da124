"""Other engines under the simulator: the torch engine and vLLM's scheduler make the
reference's decisions, so every request's simulated latency must come out the same."""

from __future__ import annotations

import importlib.util
import os

import pytest

from schedspec.engines.registry import load_engine_factory
from schedspec.simulate.configs import resolve_configs
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.runs import run_configs
from schedspec.simulate.workloads import SyntheticWorkload

VLLM = "schedspec.adapters.vllm.engine:VllmEngine"
INSTALL = "schedspec install vllm"


def _skip_reason(engine: str) -> str | None:
    if engine == VLLM and importlib.util.find_spec("vllm") is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the vLLM simulation, but vLLM is not installed: run {INSTALL}")
        return f"vLLM is not installed: run {INSTALL} to run this test"
    return None


@pytest.mark.parametrize("engine", ["gpu", VLLM])
def test_engine_gives_the_reference_latencies(engine: str) -> None:
    reason = _skip_reason(engine)
    if reason is not None:
        pytest.skip(reason)
    cost = CostModel()
    # A tight cache so preemption and prefix hits are part of what must agree.
    configs = resolve_configs(
        ["small:num_blocks=160,max_model_len=1024,max_num_batched_tokens=512"],
        False,
        False,
        {},
        cost,
    )
    workload = SyntheticWorkload(num_requests=24, rate=40.0, prefix_len=64).generate(3, 1024)
    runs = {
        name: run_configs(configs, workload, load_engine_factory(name), cost, 0, 10**5)
        for name in ("reference", engine)
    }
    for reference, other in zip(runs["reference"], runs[engine], strict=True):
        assert other.metrics == reference.metrics
        assert other.summary == reference.summary
    assert runs["reference"][0].summary.preemptions > 0
    assert (runs["reference"][0].summary.prefix_cache_hit_rate or 0.0) > 0
