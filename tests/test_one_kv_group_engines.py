"""Engines that keep one full-attention KV cache group refuse a hybrid config where it
enters, naming `kv_cache_groups` (spec/config.require_single_kv_group), and a replay of a
trace whose config an engine refuses is a usage error naming the field, not an engine
failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedspec.cli.main import main
from schedspec.spec import ConfigError, SchedulerConfig
from schedspec.spec.config import require_single_kv_group
from schedspec.spec.kv_groups import FullAttentionGroup, MambaGroup, SlidingWindowGroup
from schedspec.traces.trace import Trace
from tests.sched_helpers import make_config

HYBRID = make_config(
    block_size=16,
    num_blocks=64,
    max_model_len=128,
    enable_prefix_caching=True,
    kv_cache_groups=(
        FullAttentionGroup(block_size=16),
        SlidingWindowGroup(block_size=8, sliding_window=20),
        MambaGroup(block_size=16, mamba_cache_mode="align"),
    ),
)


def test_a_single_group_config_passes() -> None:
    require_single_kv_group(make_config(), "an engine", "why")


def test_a_hybrid_config_is_refused_naming_the_field_the_groups_and_why() -> None:
    with pytest.raises(ConfigError) as err:
        require_single_kv_group(HYBRID, "my engine", "it has one block table")
    assert err.value.field == "kv_cache_groups"
    message = str(err.value)
    assert "my engine runs one full-attention KV cache group only (it has one block table)" in (
        message
    )
    assert "3 groups (full_attention, sliding_window, mamba)" in message
    assert "kv_cache_groups=()" in message


def _gpu_impl_scheduler(config: SchedulerConfig) -> Any:
    from schedspec.gpu_impl.engine import BatchedScheduler

    return BatchedScheduler(config)


def _paged_model_runner(config: SchedulerConfig) -> Any:
    from schedspec.gpu_impl.execution.model_runner import PagedModelRunner
    from tests.test_execution_invariance import tiny_model

    return PagedModelRunner(tiny_model(), config)


def _gpu_adapter(config: SchedulerConfig) -> Any:
    from schedspec.adapters.gpu import GpuEngine

    return GpuEngine(config, device="cpu")


@pytest.mark.parametrize(
    ("build", "engine"),
    [
        (_gpu_impl_scheduler, "gpu_impl"),
        (_paged_model_runner, "the paged model runner"),
        (_gpu_adapter, "gpu_impl"),
    ],
)
def test_gpu_impl_refuses_a_hybrid_config_where_it_enters(build: Any, engine: str) -> None:
    pytest.importorskip("torch")
    with pytest.raises(ConfigError, match=f"{engine} runs one full-attention") as err:
        build(HYBRID)
    assert err.value.field == "kv_cache_groups"
    assert "No hybrid KV cache groups" in str(err.value)  # docs/GPU_IMPL.md's section


def test_gpu_impl_still_builds_a_single_group_config() -> None:
    pytest.importorskip("torch")
    assert _gpu_impl_scheduler(make_config()).config == make_config()


def test_the_sglang_adapter_refuses_a_hybrid_config_before_its_family() -> None:
    # Before SGLang is imported: the refusal needs no SGLang install.
    from schedspec.adapters.sglang.engine import SGLangEngine

    with pytest.raises(ConfigError, match="the SGLang adapter runs one full-attention") as err:
        SGLangEngine(HYBRID)
    assert err.value.field == "kv_cache_groups"


def _replay(tmp_path: Path, config: SchedulerConfig, engine: str) -> Any:
    path = tmp_path / "trace.json"
    Trace(config=config, events=()).save(path)
    return CliRunner().invoke(main, ["replay", str(path), "--engine", engine])


def test_replaying_a_hybrid_trace_on_gpu_impl_is_a_usage_error_naming_the_field(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    result = _replay(tmp_path, HYBRID, "gpu")
    assert result.exit_code == 2, result.output
    assert "'gpu' cannot run the trace's config: kv_cache_groups: gpu_impl runs one" in (
        result.output
    )


def test_replaying_any_config_an_engine_refuses_is_a_usage_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result = _replay(tmp_path, make_config(kv_connector=True), "gpu")
    assert result.exit_code == 2, result.output
    assert "'gpu' cannot run the trace's config: kv_connector: gpu_impl has no KV" in (
        result.output
    )


def test_diff_replaying_a_hybrid_trace_with_gpu_impl_is_a_usage_error(
    tmp_path: Path,
) -> None:
    """gpu_impl does not declare HYBRID_KV: refused on its side before the engines run,
    not reported as the engine's failure at its first call."""
    pytest.importorskip("torch")
    path = tmp_path / "trace.json"
    Trace(config=HYBRID, events=()).save(path)
    result = CliRunner().invoke(
        main, ["diff-replay", str(path), "--left", "reference", "--right", "gpu"]
    )
    assert result.exit_code == 2, result.output
    assert "'--right': 'gpu' cannot run the trace's config: it needs HYBRID_KV" in (result.output)
