"""KV cache groups in the config: each kind checked where it enters, the geometry rule, the
default single group, and the trace format's round trip (docs/SPEC.md, "Hybrid KV cache
groups")."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from schedspec.spec import ConfigError, SchedulerConfig
from schedspec.spec.config import smallest_pool
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    blocks_for_one_request,
    scheduler_block_size,
)
from schedspec.traces.trace import Trace, TraceError, trace_from_json
from tests.sched_helpers import as_version, make_config

FULL_16 = FullAttentionGroup(block_size=16)
WINDOW_8 = SlidingWindowGroup(block_size=8, sliding_window=20)
MAMBA_16 = MambaGroup(block_size=16, mamba_cache_mode="align", num_speculative_blocks=1)


def hybrid_config(
    groups: tuple[KVCacheGroupSpec, ...] = (FULL_16, WINDOW_8), **overrides: Any
) -> SchedulerConfig:
    fields: dict[str, Any] = {
        "block_size": 16,
        "num_blocks": 64,
        "max_model_len": 128,
        "kv_cache_groups": groups,
    }
    return make_config(**{**fields, **overrides})


def test_the_default_is_the_single_full_attention_group_of_before() -> None:
    config = make_config()
    assert config.kv_cache_groups == ()
    # Shown nowhere: a failure report of a single-group config reads as before.
    assert "kv_cache_groups" not in config.own_fields()
    assert "kv_cache_groups" in hybrid_config().own_fields()


@pytest.mark.parametrize(
    ("build", "field", "bound"),
    [
        (lambda: FullAttentionGroup(block_size=0), "block_size", ">= 1"),
        (lambda: SlidingWindowGroup(block_size=4, sliding_window=0), "sliding_window", ">= 1"),
        (lambda: SlidingWindowGroup(block_size=True, sliding_window=4), "block_size", "an int"),
        (
            lambda: ChunkedLocalGroup(block_size=4, attention_chunk_size=-1),
            "attention_chunk_size",
            ">= 1",
        ),
        (lambda: MambaGroup(block_size=4, mamba_cache_mode="all"), "mamba_cache_mode", "one of"),  # type: ignore[arg-type]
        (
            lambda: MambaGroup(block_size=4, num_speculative_blocks=257),
            "num_speculative_blocks",
            "<= 256",
        ),
    ],
)
def test_each_group_field_is_checked_on_construction(build: Any, field: str, bound: str) -> None:
    with pytest.raises(ConfigError, match=bound) as caught:
        build()
    assert caught.value.field == field


def test_scheduler_block_size_is_the_least_common_multiple() -> None:
    # 16-token attention blocks beside 24-token Mamba blocks: a scheduler block of 48
    # is 3 attention blocks and 2 Mamba blocks.
    groups = (FULL_16, MambaGroup(block_size=24))
    assert scheduler_block_size(groups) == 48
    assert hybrid_config(groups, block_size=48, num_blocks=16).block_size == 48
    with pytest.raises(ConfigError, match=r"least common multiple .*\(48\), got 16") as caught:
        hybrid_config(groups, block_size=16)
    assert caught.value.field == "block_size"


@pytest.mark.parametrize(
    ("groups", "overrides", "field", "bound"),
    [
        ([FULL_16, WINDOW_8], {}, "kv_cache_groups", "a tuple"),
        ((FULL_16, "mamba"), {}, "kv_cache_groups[1]", "one of FullAttentionGroup"),
        ((FULL_16,), {}, "kv_cache_groups", "the default"),
        (
            (FULL_16, ChunkedLocalGroup(block_size=8, attention_chunk_size=32)),
            {},
            "kv_cache_groups[1].block_size",
            "the scheduler block size",
        ),
        (
            (FULL_16, MambaGroup(block_size=16)),
            {"enable_prefix_caching": True},
            "kv_cache_groups[1].mamba_cache_mode",
            "'align'",
        ),
        ((FULL_16, WINDOW_8), {"family": "sglang"}, "family", "'vllm'"),
        ((FULL_16, WINDOW_8), {"kv_connector": True}, "kv_connector", "False"),
        # 8 blocks of 16 for the full group, 16 of 8 for the window: 24 at most held.
        ((FULL_16, WINDOW_8), {"num_blocks": 23}, "num_blocks", ">= 24"),
    ],
)
def test_a_bad_group_mix_is_refused_naming_the_field(
    groups: Any, overrides: dict[str, Any], field: str, bound: str
) -> None:
    with pytest.raises(ConfigError, match=bound) as caught:
        hybrid_config(groups, **overrides)
    assert caught.value.field == field


def test_the_pool_bound_sums_what_one_request_holds_per_group() -> None:
    # 128 tokens: 8 full blocks, 16 window blocks (freed only once processed), and a
    # Mamba group in align mode holds a running state, the one it copies from, and one
    # draft scratch state.
    groups = (FULL_16, WINDOW_8, MAMBA_16)
    assert blocks_for_one_request(groups, 128) == 8 + 16 + 3
    assert smallest_pool(hybrid_config(groups)) == 27
    # The single group's bound is today's: the blocks of max_model_len tokens.
    assert smallest_pool(make_config(block_size=4, max_model_len=256)) == 64
    assert hybrid_config(groups, num_blocks=27).num_blocks == 27


def test_a_mamba_group_in_mode_none_is_bounded_like_attention_over_its_blocks() -> None:
    # Mode "none" allocates by the attention rule: a 128-token prompt in 16-token state
    # blocks takes 8 at once (+1 draft scratch); at vLLM's default block size for the
    # mode (max_model_len) that is one state.
    small = MambaGroup(block_size=16, num_speculative_blocks=1)
    assert blocks_for_one_request((small,), 128) == 8 + 1
    assert blocks_for_one_request((MambaGroup(block_size=128),), 128) == 1


def test_under_async_scheduling_an_aligned_mamba_group_holds_one_state_more() -> None:
    """States retire on processed tokens: when step n+1's state block is allocated, step
    n's tokens are in flight, so its state and the one it copied from are both held
    (the reference measured it: tests/test_hybrid_scheduler.py)."""
    groups = (FULL_16, MAMBA_16)
    assert blocks_for_one_request(groups, 128) == 8 + 2 + 1
    assert blocks_for_one_request(groups, 128, async_scheduling=True) == 8 + 3 + 1


def test_a_hybrid_trace_round_trips_through_json() -> None:
    groups = (
        FULL_16,
        WINDOW_8,
        MAMBA_16,
        ChunkedLocalGroup(block_size=16, attention_chunk_size=64),
    )
    trace = Trace(config=hybrid_config(groups, num_blocks=64), events=())
    document = json.loads(json.dumps(trace.to_json()))
    assert document["config"]["kv_cache_groups"][2] == {
        "block_size": 16,
        "mamba_cache_mode": "align",
        "num_speculative_blocks": 1,
        "kind": "mamba",
    }
    assert trace_from_json(document) == trace


def test_an_older_trace_loads_with_the_single_group_and_cannot_carry_groups() -> None:
    trace = Trace(config=make_config(), events=())
    older = as_version(trace.to_json(), 6)
    assert "kv_cache_groups" not in older["config"]
    assert trace_from_json(older).config.kv_cache_groups == ()
    carrying = as_version(Trace(config=hybrid_config(), events=()).to_json(), 6)
    carrying["config"]["kv_cache_groups"] = [dataclasses.asdict(FULL_16)]
    with pytest.raises(TraceError, match="not a field of version 6") as caught:
        trace_from_json(carrying)
    assert caught.value.field == "config.kv_cache_groups"


@pytest.mark.parametrize(
    ("groups", "field"),
    [
        ({"kind": "full_attention"}, "config.kv_cache_groups"),
        ([{"kind": "lightning", "block_size": 16}], "config.kv_cache_groups[0].kind"),
        ([{"kind": "mamba", "block_size": 0}], "config.kv_cache_groups[0].block_size"),
        ([5], "config.kv_cache_groups[0]"),
        (
            [{"kind": "sliding_window", "block_size": 8, "sliding_window": 4, "extra": 1}],
            "config.kv_cache_groups[0]",
        ),
    ],
)
def test_a_damaged_group_in_a_trace_names_its_field(groups: Any, field: str) -> None:
    document = json.loads(json.dumps(Trace(config=hybrid_config(), events=()).to_json()))
    document["config"]["kv_cache_groups"] = groups
    with pytest.raises(TraceError) as caught:
        trace_from_json(document)
    assert caught.value.field == field
