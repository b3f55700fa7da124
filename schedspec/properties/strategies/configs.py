"""Hypothesis strategies for configs that reach the scheduler's corners.

Configs are small on purpose: tiny KV caches force preemption, tiny budgets
force chunking, short max_model_len makes the length cap and the
"prompt of max_model_len - 1 tokens" edge cheap to reach. Most configs are then
narrowed by a regime (strategies/regimes.py) into the corner of a vLLM bug that needs
several knobs at once.
"""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import strategies as st
from hypothesis.errors import Frozen, UnsatisfiedAssumption

from schedspec.properties.strategies.regimes import (
    CONNECTOR_REGIMES,
    HYBRID_REGIMES,
    MOST_SEATS,
    PLAIN_WEIGHT,
    REGIMES,
    SGLANG_PLAIN_WEIGHT,
    SGLANG_REGIMES,
    Regime,
)
from schedspec.spec import Family, SchedulerConfig, shown
from schedspec.spec.config import MIN_SGLANG_MAX_MODEL_LEN, POLICIES

BLOCK_SIZES = (1, 2, 3, 4, 8, 16, 32)
# Hypothesis works out a strategy's properties (emptiness, labels) on its first
# draw: strategies whose bounds depend on earlier draws are built once per
# bounds and kept, not rebuilt for every example.
_BLOCK_SIZE_DRAWS = st.sampled_from(BLOCK_SIZES)
_MAX_NUM_SEQS_DRAWS = st.integers(1, MOST_SEATS)
_NUM_SPEC_DRAWS = st.sampled_from([0, 1, 2, 4])
_WATERMARK_DRAWS = st.sampled_from([0.0, 0.0, 0.1, 0.3])
_POLICY_DRAWS = st.sampled_from(POLICIES)
# SGLang: page_size 1 is its default; larger pages are where its retraction leaks
# lived. Conservativeness below 1 admits more than the running requests may need
# later, which is how retraction is reached.
_PAGE_SIZE_DRAWS = st.sampled_from([1, 1, 2, 4])
_CONSERVATIVENESS_DRAWS = st.sampled_from([1.0, 0.3, 0.1])
# None: lookahead slots for every draft (vLLM's EAGLE-style proposers), which is
# where slots are capped at max_model_len; 0: none (n-gram).
_LOOKAHEAD_DRAWS = st.sampled_from([None, None, 0])
# vLLM 0.34.0's long-prefill rule first (where shrinking goes), 0.33.0's beside it.
_LONG_PREFILL_RULE_DRAWS = st.sampled_from([True, False])
# Cache-aware admission: off (0, vLLM's default) half the time, else a window of one
# (a legal no-op) to eight; the threshold where it engages from an empty cache (0.0),
# vLLM's default (0.5), and the edges.
_WINDOW_DRAWS = st.sampled_from([0, 0, 0, 0, 1, 2, 3, 8])
_ADMISSION_THRESHOLD_DRAWS = st.sampled_from([0.0, 0.0, 0.5, 0.25, 1.0])
# None (first, where shrinking goes): the config as drawn; else the regime that
# narrows it (strategies/regimes.py), each as often as its weight.
_REGIME_DRAWS: st.SearchStrategy[Regime | None] = st.sampled_from(
    [None] * PLAIN_WEIGHT + [r for r in REGIMES for _ in range(r.weight)]
)
_CONNECTOR_REGIME_DRAWS: st.SearchStrategy[Regime | None] = st.sampled_from(
    [None] * PLAIN_WEIGHT + [r for r in (*REGIMES, *CONNECTOR_REGIMES) for _ in range(r.weight)]
)
_HYBRID_REGIME_DRAWS: st.SearchStrategy[Regime | None] = st.sampled_from(
    [None] * PLAIN_WEIGHT + [r for r in (*REGIMES, *HYBRID_REGIMES) for _ in range(r.weight)]
)
_SGLANG_REGIME_DRAWS: st.SearchStrategy[Regime | None] = st.sampled_from(
    [None] * SGLANG_PLAIN_WEIGHT + [r for r in SGLANG_REGIMES for _ in range(r.weight)]
)


@functools.lru_cache(maxsize=4096)
def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@functools.lru_cache(maxsize=1024)
def _num_blocks_draws(min_blocks: int) -> st.SearchStrategy[int]:
    # The tightest legal cache half the time: preemption, the watermark and
    # head-of-line blocking all live there.
    return st.sampled_from([min_blocks, min_blocks + 1]) | _integers(min_blocks, 4 * min_blocks + 2)


@functools.lru_cache(maxsize=4096)
def _budget_draws(low: int, high: int) -> st.SearchStrategy[int]:
    # The smallest legal budget half the time. With chunked prefill, prompts are
    # split across steps, so drafts meet requests mid-prefill (PR #30618's corner)
    # and steps use their whole budget in every run (benchmarks/bench_corners.py).
    # Without it the budget is max_model_len: a long prompt that waits behind a
    # decode blocks the queue behind it (head-of-line), where a scheduler that
    # skips it to admit a shorter one shows.
    return st.just(low) | _integers(low, high)


@functools.lru_cache(maxsize=1024)
def _threshold_draws(max_model_len: int, num_spec: int) -> st.SearchStrategy[int]:
    # A cap of num_spec cuts a padded admission of 1 + num_spec tokens: the corner
    # where vLLM pads and then fails its own assertion (docs/FINDINGS.md F3).
    return st.sampled_from([0, 0, 1, min(num_spec, max_model_len)]) | _integers(0, max_model_len)


@st.composite
def configs(
    draw: st.DrawFn,
    max_model_len_cap: int = 96,
    async_scheduling: bool | None = None,
    pad_spec_decode: bool | None = None,
    long_prefill_needs_chunked_prefill: bool | None = None,
    cache_aware_admission: bool = True,
    kv_connector: bool = False,
    hybrid: bool = False,
) -> SchedulerConfig:
    """Small configs; async_scheduling, pad_spec_decode and the long-prefill rule are
    drawn unless fixed, and cache-aware admission unless turned off (an engine that runs
    only some modes or releases narrows them here rather than by filtering). Half of
    them narrowed by a regime (strategies/regimes.py) into a bug's corner; with
    kv_connector the KV connector's regimes are drawn too (the suite's own configs), and
    a caller that fixes async_scheduling on gets their configs without one (the spec
    refuses a connector under async scheduling). With hybrid (and no kv_connector: the
    spec refuses both at once), the hybrid KV cache regimes are drawn too
    (strategies/hybrid_regimes.py)."""
    if kv_connector and hybrid:
        raise ValueError("configs: kv_connector and hybrid cannot be drawn together")
    regime = draw(
        _CONNECTOR_REGIME_DRAWS
        if kv_connector
        else _HYBRID_REGIME_DRAWS
        if hybrid
        else _REGIME_DRAWS
    )
    block_size = draw(_BLOCK_SIZE_DRAWS)
    max_model_len = draw(_integers(2, max_model_len_cap))
    # From exactly one max_model_len request of blocks up to four: tiny caches
    # preempt constantly.
    min_blocks = -(-max_model_len // block_size)
    num_blocks = draw(_num_blocks_draws(min_blocks))
    max_num_seqs = draw(_MAX_NUM_SEQS_DRAWS)
    chunked = draw(st.booleans())
    low = max_num_seqs if chunked else max(max_num_seqs, max_model_len)
    budget = draw(_budget_draws(low, max(low, 2 * max_model_len)))
    num_spec = draw(_NUM_SPEC_DRAWS)
    threshold = draw(_threshold_draws(max_model_len, num_spec))
    # Drawn in this order (shrinking and stored examples depend on it).
    caching = draw(st.booleans())
    watermark = draw(_WATERMARK_DRAWS)
    policy = draw(_POLICY_DRAWS)
    lookahead = draw(_LOOKAHEAD_DRAWS) if num_spec else None
    pipelined = draw(st.booleans()) if async_scheduling is None else async_scheduling
    pad = num_spec > 0 and (draw(st.booleans()) if pad_spec_decode is None else pad_spec_decode)
    if pad:
        budget = max(budget, 1 + num_spec)  # a padded admission must fit the budget
    needs_chunked = (
        draw(_LONG_PREFILL_RULE_DRAWS)
        if long_prefill_needs_chunked_prefill is None
        else long_prefill_needs_chunked_prefill
    )
    window = draw(_WINDOW_DRAWS) if cache_aware_admission else 0
    admission_threshold = draw(_ADMISSION_THRESHOLD_DRAWS) if window else 0.5
    drawn = SchedulerConfig(
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=caching,
        watermark=watermark,
        policy=policy,
        num_speculative_tokens=num_spec,
        num_lookahead_tokens=lookahead,
        async_scheduling=pipelined,
        pad_spec_decode=pad,
        long_prefill_needs_chunked_prefill=needs_chunked,
        cache_aware_admission_window=window,
        cache_aware_admission_threshold=admission_threshold,
    )
    if regime is None:
        return drawn
    narrowed = regime.narrow(drawn)
    if pad_spec_decode is False and narrowed.pad_spec_decode:
        narrowed = dataclasses.replace(narrowed, pad_spec_decode=False)
    if async_scheduling and narrowed.kv_connector:
        narrowed = dataclasses.replace(
            narrowed,
            kv_connector=False,
            kv_load_failure_policy="fail",
            max_num_inflight_kv_loads=None,
        )
    if not cache_aware_admission and narrowed.cache_aware_admission_window:
        narrowed = dataclasses.replace(
            narrowed, cache_aware_admission_window=0, cache_aware_admission_threshold=0.5
        )
    return narrowed


@st.composite
def sglang_configs(
    draw: st.DrawFn,
    max_model_len_cap: int = 96,
    async_scheduling: bool | None = None,
    regimes: bool = True,
) -> SchedulerConfig:
    """Small configs of family "sglang" (SGLang's knobs drawn, vLLM's at their
    defaults); async_scheduling (SGLang's overlap scheduler) is drawn unless fixed, and a
    fixed mode outlasts a regime that would change it. Fifteen of eighteen are narrowed by an
    SGLang regime (strategies/regimes.py) unless `regimes` is off, for a caller that
    narrows the draws itself."""
    page_size = draw(_PAGE_SIZE_DRAWS)
    max_model_len = draw(_integers(MIN_SGLANG_MAX_MODEL_LEN, max_model_len_cap))
    min_pages = -(-max_model_len // page_size)
    num_pages = draw(_num_blocks_draws(min_pages))
    max_running = draw(_MAX_NUM_SEQS_DRAWS)
    chunked = draw(st.booleans())
    low = max(max_running, page_size) if chunked else max(max_running, max_model_len)
    chunk_size = draw(_integers(low, max(low, 2 * max_model_len)))
    drawn = SchedulerConfig(
        family="sglang",
        block_size=page_size,
        num_blocks=num_pages,
        max_num_batched_tokens=chunk_size,
        max_num_seqs=max_running,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        schedule_conservativeness=draw(_CONSERVATIVENESS_DRAWS),
        enable_mixed_chunk=chunked and draw(st.booleans()),
        async_scheduling=draw(st.booleans()) if async_scheduling is None else async_scheduling,
    )
    if not regimes:
        return drawn
    # Drawn last, so that the draws above keep their place in every example.
    regime = draw(_SGLANG_REGIME_DRAWS)
    if regime is None:
        return drawn
    narrowed = regime.narrow(drawn)
    if async_scheduling is not None and narrowed.async_scheduling != async_scheduling:
        narrowed = dataclasses.replace(narrowed, async_scheduling=async_scheduling)
    return narrowed


def family_configs(family: Family) -> st.SearchStrategy[SchedulerConfig]:
    """The suite's own configs for a policy family."""
    return sglang_configs() if family == "sglang" else configs()


class ConfigStrategyError(Exception):
    """A config strategy given from outside (--configs) that raised while drawing, or
    drew something that is not a SchedulerConfig: the caller's mistake, not the
    engine's, nor the harness's."""


@st.composite
def checked_configs(
    draw: st.DrawFn, strategy: st.SearchStrategy[SchedulerConfig]
) -> SchedulerConfig:
    """Draws from a strategy given from outside, turning its failures into
    ConfigStrategyError. Hypothesis' own signals (an assumption not met, a test case
    over its budget) pass through: they are how a strategy rejects a draw."""
    try:
        config = draw(strategy)
    except (UnsatisfiedAssumption, Frozen):
        raise
    except Exception as err:
        raise ConfigStrategyError(
            f"the config strategy raised {type(err).__name__}: {err}"
        ) from err
    if not isinstance(config, SchedulerConfig):
        raise ConfigStrategyError(
            f"the config strategy drew {shown(config)} (a {type(config).__name__}), "
            "not a SchedulerConfig"
        )
    return config


# Configs drawn to vet a --configs strategy before a run that draws its configs where a
# failure would be hard to report (swarm mode's draws, perhaps in worker processes).
VET_DRAWS = 5


def vet_config_strategy(strategy: st.SearchStrategy[SchedulerConfig], seed: int) -> None:
    """ConfigStrategyError if a few draws from the strategy (on seed) raise or draw what
    is not a SchedulerConfig, as checked_configs says; nothing else is run."""
    from hypothesis import Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    @hypothesis_seed(seed)
    @settings(max_examples=VET_DRAWS, database=None, deadline=None, phases=[Phase.generate])
    @given(checked_configs(strategy))
    def draw(config: SchedulerConfig) -> None:
        pass

    try:
        draw()
    except ConfigStrategyError:
        raise
    except BaseExceptionGroup as group:  # several distinct failures: the first one's
        first = group.exceptions[0]
        raise first if isinstance(first, ConfigStrategyError) else group from None
