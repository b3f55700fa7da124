"""SchedulerConfig: every bad value is refused on construction, naming field and bound."""

from __future__ import annotations

from typing import Any

import pytest

from schedspec.spec import ConfigError, SchedulerConfig
from schedspec.spec.config import MAX_NUM_BLOCKS, MAX_SPECULATIVE_TOKENS
from tests.sched_helpers import make_config


def test_defaults_match_vllm() -> None:
    config = make_config()
    assert config.enable_chunked_prefill is True
    assert config.long_prefill_token_threshold == 0
    assert config.enable_prefix_caching is False
    assert config.watermark == 0.0
    assert config.policy == "fcfs"
    assert config.num_speculative_tokens == 0
    assert config.lookahead_tokens == 0
    # The newest supported release's rules (vLLM 0.34.0) and vLLM's own defaults.
    assert config.long_prefill_needs_chunked_prefill is True
    assert config.cache_aware_admission_window == 0
    assert config.cache_aware_admission_threshold == 0.5


def test_lookahead_defaults_to_num_speculative_tokens_and_can_be_zero() -> None:
    assert make_config(num_speculative_tokens=3).lookahead_tokens == 3
    assert make_config(num_speculative_tokens=3, num_lookahead_tokens=0).lookahead_tokens == 0


def test_watermark_blocks_is_floor_of_fraction_of_usable_blocks() -> None:
    assert make_config(num_blocks=100, watermark=0.035).watermark_blocks == 3
    assert make_config(num_blocks=64, watermark=0.01).watermark_blocks == 0


def test_config_is_frozen() -> None:
    config = make_config()
    with pytest.raises(AttributeError):
        config.block_size = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "field", "bound"),
    [
        ({"block_size": 0}, "block_size", ">= 1"),
        ({"num_blocks": 0}, "num_blocks", ">= 1"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", ">= 1"),
        ({"max_num_seqs": 0}, "max_num_seqs", ">= 1"),
        ({"max_model_len": 1}, "max_model_len", ">= 2"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold", ">= 0"),
        ({"num_speculative_tokens": -1}, "num_speculative_tokens", ">= 0"),
        ({"num_lookahead_tokens": -2}, "num_lookahead_tokens", ">= 0"),
        ({"watermark": 1.0}, "watermark", "[0, 1)"),
        ({"watermark": -0.1}, "watermark", "[0, 1)"),
        ({"policy": "lifo"}, "policy", "fcfs"),
        ({"block_size": True}, "block_size", "int"),
        ({"block_size": 4.0}, "block_size", "int"),
        ({"enable_chunked_prefill": 1}, "enable_chunked_prefill", "bool"),
        ({"watermark": "0.1"}, "watermark", "float"),
        # The cache must hold one max_model_len request: 8 blocks * 4 < 256.
        ({"num_blocks": 8}, "num_blocks", ">= max_model_len"),
        # Without chunking, a whole prompt must fit one step's budget.
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 255},
            "max_num_batched_tokens",
            ">= max_model_len",
        ),
        (
            {"max_num_batched_tokens": 8, "max_num_seqs": 9},
            "max_num_batched_tokens",
            "max_num_seqs",
        ),
        ({"long_prefill_token_threshold": 257}, "long_prefill_token_threshold", "<= max_model_len"),
        # Upper bounds, for memory: the message says why.
        ({"num_blocks": 10**9}, "num_blocks", "<= 4194304 (each KV block is a record"),
        ({"num_speculative_tokens": 10**8}, "num_speculative_tokens", "<= 256 (every step"),
        ({"num_lookahead_tokens": 257}, "num_lookahead_tokens", "<= 256"),
        # A damaged value is shown short, however long or deep it is.
        ({"max_num_seqs": list(range(10**5))}, "max_num_seqs", "[0, 1, 2, 3, 4, 5, 6, 7, ...]"),
        # Padding needs a draft count to pad with, and a budget the padded step fits.
        ({"pad_spec_decode": True}, "pad_spec_decode", "num_speculative_tokens >= 1"),
        (
            {
                "pad_spec_decode": True,
                "num_speculative_tokens": 2,
                "max_num_batched_tokens": 2,
                "max_num_seqs": 2,
            },
            "max_num_batched_tokens",
            ">= 1 + num_speculative_tokens (3)",
        ),
        ({"async_scheduling": 1}, "async_scheduling", "bool"),
        # vLLM 0.34.0's knobs.
        ({"long_prefill_needs_chunked_prefill": 0}, "long_prefill_needs_chunked_prefill", "bool"),
        ({"cache_aware_admission_window": -1}, "cache_aware_admission_window", ">= 0"),
        ({"cache_aware_admission_threshold": 1.01}, "cache_aware_admission_threshold", "[0, 1]"),
        ({"cache_aware_admission_threshold": -0.5}, "cache_aware_admission_threshold", "[0, 1]"),
    ],
)
def test_bad_values_name_field_and_bound(overrides: dict[str, Any], field: str, bound: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_config(**overrides)
    assert info.value.field == field
    assert field in str(info.value)
    assert bound in str(info.value)
    assert isinstance(info.value, ValueError)


def test_the_largest_sizes_are_accepted() -> None:
    config = make_config(num_blocks=MAX_NUM_BLOCKS, num_speculative_tokens=MAX_SPECULATIVE_TOKENS)
    assert config.lookahead_tokens == MAX_SPECULATIVE_TOKENS


def test_boundary_values_are_accepted() -> None:
    # Exactly one max_model_len request of capacity, and a budget of exactly max_model_len.
    SchedulerConfig(
        block_size=4,
        num_blocks=64,
        max_num_batched_tokens=256,
        max_num_seqs=1,
        max_model_len=256,
        enable_chunked_prefill=False,
        long_prefill_token_threshold=256,
        watermark=0.99,
    )
