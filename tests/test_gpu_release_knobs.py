"""The gpu engine and vLLM 0.34.0's knobs: what gpu_impl does not run yet is refused,
naming the field, and `--engine gpu` draws configs without it (gpu_impl_configs)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from schedspec.adapters.gpu import GpuEngine, refusal
from schedspec.engines.registry import ENGINES, load_config_strategy
from schedspec.properties.strategies.configs import gpu_impl_configs
from schedspec.spec import ConfigError, SchedulerConfig
from tests.sched_helpers import make_config

CHUNKING_OFF = {"enable_chunked_prefill": False, "long_prefill_token_threshold": 8}
CACHE_AWARE = {"enable_prefix_caching": True, "cache_aware_admission_window": 2}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (CHUNKING_OFF, "long_prefill_needs_chunked_prefill"),
        (CACHE_AWARE, "cache_aware_admission_window"),
    ],
)
def test_what_gpu_impl_does_not_run_is_refused_naming_the_field(
    overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        GpuEngine(make_config(**overrides), device="cpu")
    assert refused.value.field == field


@pytest.mark.parametrize(
    "overrides",
    [
        {**CHUNKING_OFF, "long_prefill_needs_chunked_prefill": False},  # 0.33.0's rule
        {"long_prefill_token_threshold": 8},  # chunking on: both rules agree
        {**CACHE_AWARE, "policy": "priority"},  # the window is ignored there
        {"cache_aware_admission_window": 2},  # no prefix caching: ignored too
    ],
)
def test_what_gpu_impl_runs_exactly_is_accepted(overrides: dict[str, object]) -> None:
    assert refusal(make_config(**overrides)) is None
    GpuEngine(make_config(**overrides), device="cpu")


def test_the_gpu_engine_runs_on_gpu_impl_configs_by_default() -> None:
    assert ENGINES["gpu"].configs is not None
    strategy = load_config_strategy(ENGINES["gpu"].configs)

    @settings(max_examples=300, deadline=None, database=None)
    @given(config=strategy)
    def never_refused(config: SchedulerConfig) -> None:
        assert refusal(config) is None, config

    never_refused()
    assert repr(strategy) == repr(gpu_impl_configs())
