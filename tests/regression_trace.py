"""The regression traces of tests/regression_traces/: traces a campaign once failed on,
kept with what the fix says about them, and vLLM's agreement with the reference on them."""

from __future__ import annotations

from pathlib import Path

from schedspec.adapters.reference import reference_engine
from schedspec.engines.registry import load_engine_factory
from schedspec.properties.differential import DiffOptions, diff_trace
from schedspec.traces.trace import Trace
from tests.vllm_required import require_vllm

DIRECTORY = Path(__file__).parent / "regression_traces"


def regression_trace(name: str) -> Trace:
    """tests/regression_traces/NAME.json."""
    return Trace.load(DIRECTORY / f"{name}.json")


def assert_vllm_agrees(trace: Trace, what: str) -> None:
    """vLLM's scheduler and the reference, in lockstep on `trace` under vllm-v1, agree at
    every step, block ids included, and each holds every invariant (`what` names the case
    in the skip reason where vLLM is not installed)."""
    require_vllm(what)
    result = diff_trace(
        trace,
        reference_engine,
        load_engine_factory("vllm"),
        "vllm-v1",
        DiffOptions(compare_block_ids=True),
    )
    assert result.passed, result.divergence or result.violation or result.error
    assert result.entries, "the diff stepped nothing"
