"""The config regimes: each narrows a drawn config into its corner, keeps the rest of the
draw, and the default configs() spends its share of examples in each."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedspec.properties.corners import CORNER_NAMES
from schedspec.properties.strategies import hybrid_regimes
from schedspec.properties.strategies.actions import URGENT, decode_request_draw
from schedspec.properties.strategies.configs import configs, sglang_configs
from schedspec.properties.strategies.openings import OPENING_NAMES
from schedspec.properties.strategies.regimes import (
    CONNECTOR_REGIMES,
    CROWDED_POOL,
    CROWDED_SEATS,
    HYBRID_REGIMES,
    LONG_MAX_MODEL_LEN,
    MOST_SEATS,
    PLAIN_WEIGHT,
    REGIMES,
    SGLANG_PLAIN_WEIGHT,
    SGLANG_REGIMES,
    SHORT_MAX_MODEL_LEN,
    SHORTEST_MAX_MODEL_LEN,
    head_of_line,
    kv_loads_capped,
    kv_loads_contend,
    padded_near_max_model_len,
    padded_tight_budget,
    padded_under_a_cap,
    priority_contention,
    priority_tight_cache,
    sglang_crowded,
    sglang_mixed_overcommit,
    sglang_paged_chunks,
    sglang_readmit,
    sglang_small_chunks,
    sglang_tight_radix,
    tight_cache,
)
from schedspec.spec import SchedulerConfig
from schedspec.spec.config import MIN_SGLANG_MAX_MODEL_LEN
from schedspec.spec.kv_groups import MambaGroup
from schedspec.spec.request import max_prompt_tokens
from tests.sched_helpers import make_config

# A plain draw far from every corner: fcfs, one seat, a roomy cache, big budget, no cap.
ROOMY = make_config(
    block_size=8,
    num_blocks=40,
    max_num_batched_tokens=128,
    max_num_seqs=1,
    max_model_len=64,
    enable_chunked_prefill=False,
    long_prefill_token_threshold=0,
    policy="fcfs",
    num_speculative_tokens=0,
)


def test_priority_contention_worked_example() -> None:
    narrowed = priority_contention(ROOMY)
    assert narrowed.policy == "priority"
    assert narrowed.max_num_seqs == MOST_SEATS == 8
    assert narrowed.block_size == 4  # blocks of 8 tokens become 4: two to four
    assert narrowed.num_blocks == 2 * 16  # two max_model_len requests of 4-token blocks
    assert narrowed.enable_chunked_prefill and narrowed.enable_prefix_caching
    assert narrowed.long_prefill_token_threshold == 4  # 64 // 16
    assert narrowed.max_num_batched_tokens == 32  # 64 // 2
    # One-token blocks become two: the first request in the list would run out first.
    one_token = dataclasses.replace(ROOMY, block_size=1, num_blocks=64)
    assert priority_contention(one_token).block_size == 2
    # A sixteenth of a short max_model_len is under a block: the cap is a block, so a
    # victim's chunk completes one.
    short = dataclasses.replace(ROOMY, max_model_len=20, num_blocks=3, max_num_batched_tokens=20)
    assert priority_contention(short).long_prefill_token_threshold == 4  # not 20 // 16 = 1
    assert priority_contention(short).max_num_batched_tokens == 10


def test_priority_tight_cache_worked_example() -> None:
    narrowed = priority_tight_cache(ROOMY)
    assert narrowed.num_blocks == 16  # one max_model_len request of 4-token blocks
    assert narrowed == dataclasses.replace(priority_contention(ROOMY), num_blocks=16)


def test_tight_cache_worked_example() -> None:
    narrowed = tight_cache(ROOMY)
    assert (narrowed.num_blocks, narrowed.max_num_seqs) == (8, 2)  # 64 tokens of 8-token blocks
    assert narrowed.block_size == 8 and not narrowed.enable_chunked_prefill  # as drawn
    # fcfs, whatever was drawn: the priority regimes give priority its tight caches.
    assert tight_cache(dataclasses.replace(ROOMY, policy="priority")).policy == "fcfs"
    # A budget of one token with one seat grows to the two seats it must cover.
    one = dataclasses.replace(
        ROOMY, enable_chunked_prefill=True, max_num_batched_tokens=1, max_num_seqs=1
    )
    assert tight_cache(one).max_num_batched_tokens == 2


def test_kv_loads_contend_worked_example() -> None:
    narrowed = kv_loads_contend(ROOMY)
    assert narrowed.kv_connector and narrowed.max_num_inflight_kv_loads is None
    assert (narrowed.num_blocks, narrowed.max_num_seqs) == (8, 2)  # one 64-token request
    assert narrowed.enable_prefix_caching and not narrowed.async_scheduling
    # Where the capped regime lets one load in at a time, this one lets both park.
    assert kv_loads_capped(ROOMY).max_num_inflight_kv_loads == 2  # one seat drawn: 1 + 1
    assert (
        kv_loads_capped(dataclasses.replace(ROOMY, max_num_seqs=2)).max_num_inflight_kv_loads == 1
    )


@settings(max_examples=200, deadline=None)
@given(config=configs())
def test_every_connector_regime_narrows_any_drawn_config_to_a_legal_one(
    config: SchedulerConfig,
) -> None:
    for regime in CONNECTOR_REGIMES:
        narrowed = regime.narrow(config)
        assert narrowed.kv_connector and not narrowed.async_scheduling
        assert narrowed.max_model_len == config.max_model_len
        assert regime.corner in CORNER_NAMES


def test_connector_configs_carry_a_connector_in_half_their_draws() -> None:
    counts: Counter[bool] = Counter()

    @settings(max_examples=600, deadline=None, database=None)
    @given(config=configs(kv_connector=True))
    def draw(config: SchedulerConfig) -> None:
        counts[config.kv_connector] += 1

    draw()
    assert sum(r.weight for r in CONNECTOR_REGIMES) == PLAIN_WEIGHT + sum(r.weight for r in REGIMES)
    assert 0.35 < counts[True] / sum(counts.values()) < 0.65, counts


def test_head_of_line_worked_example() -> None:
    drawn = dataclasses.replace(ROOMY, enable_chunked_prefill=True, long_prefill_token_threshold=9)
    narrowed = head_of_line(drawn)
    assert not narrowed.enable_chunked_prefill
    assert (narrowed.max_num_batched_tokens, narrowed.max_num_seqs) == (64, 2)
    assert narrowed.long_prefill_token_threshold == 0  # a capped prompt never blocks


def test_padded_under_a_cap_worked_example() -> None:
    narrowed = padded_under_a_cap(ROOMY)
    # A context of 16 tokens (64 drawn): one-token prompts are common.
    assert narrowed.max_model_len == SHORT_MAX_MODEL_LEN == 16
    assert padded_under_a_cap(dataclasses.replace(ROOMY, max_model_len=9)).max_model_len == 9
    # No drafts drawn: one, with its lookahead slot; the cap of 1 is below 1 + K = 2.
    assert narrowed.pad_spec_decode
    assert (narrowed.num_speculative_tokens, narrowed.lookahead_tokens) == (1, 1)
    assert narrowed.long_prefill_token_threshold == 1
    assert narrowed.max_num_seqs == 2
    assert narrowed.max_num_batched_tokens == 128  # chunked prefill off: as drawn
    # With chunked prefill on, the smallest budget padding allows: 1 + K, or the seats.
    chunked = dataclasses.replace(ROOMY, enable_chunked_prefill=True, num_speculative_tokens=4)
    assert padded_under_a_cap(chunked).max_num_batched_tokens == 5
    # Four drafts with an n-gram drafter (lookahead 0) and a cap of 3 drawn: both kept.
    drawn = dataclasses.replace(
        ROOMY, num_speculative_tokens=4, num_lookahead_tokens=0, long_prefill_token_threshold=3
    )
    kept = padded_under_a_cap(drawn)
    assert (kept.lookahead_tokens, kept.long_prefill_token_threshold) == (0, 3)
    # A cap at or above 1 + K would not cut the padding: it becomes K.
    above = padded_under_a_cap(dataclasses.replace(drawn, long_prefill_token_threshold=9))
    assert above.long_prefill_token_threshold == 4
    # A cap drawn past the shortened context (here 40 of 64) is legal after narrowing.
    past = dataclasses.replace(ROOMY, long_prefill_token_threshold=40, num_speculative_tokens=4)
    assert padded_under_a_cap(past).long_prefill_token_threshold == 4


def test_padded_tight_budget_worked_example() -> None:
    drawn = dataclasses.replace(ROOMY, long_prefill_token_threshold=9, num_speculative_tokens=3)
    narrowed = padded_tight_budget(drawn)
    assert narrowed.pad_spec_decode and narrowed.enable_chunked_prefill
    assert narrowed.long_prefill_token_threshold == 0  # no cap: prefills end soon
    assert narrowed.max_num_seqs == 2
    assert narrowed.max_num_batched_tokens == 4  # 1 + K: a decode of 1 leaves 3, too few
    # Eight seats need a budget of eight: padding then fits beside up to four tokens.
    seats = padded_tight_budget(dataclasses.replace(drawn, max_num_seqs=8))
    assert seats.max_num_batched_tokens == 8
    # No drafts drawn: one, with the lookahead of K.
    assert padded_tight_budget(ROOMY).num_speculative_tokens == 1
    assert padded_tight_budget(ROOMY).max_num_batched_tokens == 2


@settings(max_examples=300, deadline=None)
@given(config=configs())
def test_every_regime_narrows_any_drawn_config_to_a_legal_one(config: SchedulerConfig) -> None:
    # SchedulerConfig validates in __post_init__: narrowing raises ConfigError if it breaks
    # a cross-field bound (budget under the seats, a cap past max_model_len, ...).
    for regime in REGIMES:
        narrowed = regime.narrow(config)
        # Only the padding regimes near the end of a context shorten it.
        shortened: dict[Callable[[SchedulerConfig], SchedulerConfig], int] = {
            padded_under_a_cap: min(config.max_model_len, SHORT_MAX_MODEL_LEN),
            padded_near_max_model_len: min(config.max_model_len, SHORTEST_MAX_MODEL_LEN),
        }
        assert narrowed.max_model_len == shortened.get(regime.narrow, config.max_model_len)
        assert narrowed.async_scheduling == config.async_scheduling
        assert regime.corner in CORNER_NAMES


@settings(max_examples=200, deadline=None)
@given(config=configs(async_scheduling=False, pad_spec_decode=False))
def test_fixed_modes_survive_the_regimes(config: SchedulerConfig) -> None:
    assert not config.async_scheduling and not config.pad_spec_decode


def test_default_configs_spend_their_share_in_the_regimes() -> None:
    # Of 1,100 draws, about 8/24 are priority contention (either cache): the priority
    # policy with eight seats, a cap and chunked prefill on, which plain draws reach far
    # less often.
    counts: Counter[str] = Counter()

    @settings(max_examples=1100, deadline=None, database=None)
    @given(config=configs())
    def draw(config: SchedulerConfig) -> None:
        contended = (
            config.policy == "priority"
            and config.max_num_seqs == MOST_SEATS
            and config.enable_chunked_prefill
            and config.long_prefill_token_threshold
            == min(config.max_model_len, max(config.block_size, config.max_model_len // 16))
        )
        counts["contended" if contended else "other"] += 1

    draw()
    total = PLAIN_WEIGHT + sum(r.weight for r in REGIMES)
    assert total == 24
    share = counts["contended"] / sum(counts.values())
    assert 0.25 < share < 0.5, counts


def test_padded_near_max_model_len_puts_the_longest_prompt_on_the_boundary() -> None:
    """vllm#53962's corner: with one draft, a repeated longest prompt (max_model_len - 1
    tokens, all but one cached) needs one token; padded it would be 2 and sample a third,
    one past max_model_len, so it must run unpadded."""
    drawn = make_config(max_model_len=96, num_speculative_tokens=3, block_size=16)
    narrowed = padded_near_max_model_len(drawn)
    assert narrowed.max_model_len == SHORTEST_MAX_MODEL_LEN
    assert (narrowed.num_speculative_tokens, narrowed.block_size) == (1, 1)
    assert narrowed.pad_spec_decode and narrowed.enable_prefix_caching
    assert narrowed.num_blocks == 3 * SHORTEST_MAX_MODEL_LEN and narrowed.policy == "fcfs"
    computed = narrowed.max_model_len - 2  # the longest prompt less its last token
    assert computed + 1 + narrowed.num_speculative_tokens + 1 == narrowed.max_model_len + 1


def test_half_the_priority_draws_are_urgent() -> None:
    priorities = Counter(decode_request_draw(0, 0, 0, 0, 20 * p).priority for p in range(8))
    assert priorities == {0: 1, 1: 1, 2: 1, 3: 1, URGENT: 4}


# ------------------------------------------------- SGLang's family


def test_sglang_regimes_worked_examples() -> None:
    drawn = make_config(
        family="sglang",
        block_size=2,
        num_blocks=100,
        max_num_batched_tokens=64,
        max_num_seqs=5,
        max_model_len=40,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
    )
    chunks = sglang_small_chunks(drawn)
    assert chunks.enable_chunked_prefill and chunks.enable_prefix_caching
    assert chunks.max_num_batched_tokens == 5  # a seat's worth (more than a page)
    radix = sglang_tight_radix(drawn)
    assert radix.enable_prefix_caching and radix.schedule_conservativeness == 0.1
    assert radix.num_blocks == 20  # one max_model_len request of 2-token pages
    assert radix.enable_chunked_prefill and radix.enable_mixed_chunk
    assert radix.max_num_batched_tokens == 64  # the drawn budget: at least a seat's
    # At least three seats, so that a retraction can leave two survivors to order.
    assert sglang_tight_radix(dataclasses.replace(drawn, max_num_seqs=1)).max_num_seqs == 3
    overcommit = sglang_mixed_overcommit(drawn)
    assert overcommit.max_model_len == overcommit.num_blocks == LONG_MAX_MODEL_LEN
    assert overcommit.block_size == 1 and overcommit.max_num_seqs == 2
    assert overcommit.max_num_batched_tokens == 4  # a decode's token and a chunk of three
    assert overcommit.enable_mixed_chunk and overcommit.schedule_conservativeness == 0.1
    crowded = sglang_crowded(dataclasses.replace(drawn, async_scheduling=True))
    assert crowded.max_model_len == MIN_SGLANG_MAX_MODEL_LEN == 8
    assert max_prompt_tokens(crowded) == 1  # one-token prompts: a victim frees little
    assert crowded.block_size == 1 and crowded.num_blocks == CROWDED_POOL * 8 == 40
    assert crowded.max_num_seqs == CROWDED_SEATS == 16
    assert crowded.max_num_batched_tokens == 16  # unchunked: at least the seats
    assert crowded.schedule_conservativeness == 0.1 and crowded.enable_prefix_caching
    assert not crowded.async_scheduling  # the plain loop
    chunked = sglang_crowded(dataclasses.replace(drawn, enable_chunked_prefill=True))
    assert chunked.enable_chunked_prefill and chunked.max_num_batched_tokens == 16
    paged = sglang_paged_chunks(dataclasses.replace(drawn, block_size=1))
    assert paged.block_size == 2 and paged.enable_chunked_prefill
    assert paged.max_num_batched_tokens == 8  # four pages, below the 33-token prompt
    assert paged.max_model_len == 40 and paged.num_blocks == 100  # both already enough
    assert sglang_paged_chunks(drawn).block_size == 2  # pages above a token kept
    # Pages of four: a budget of 16, so a context of at least 48 (the longest prompt 24
    # past the budget) and a pool of two contexts (24 pages of 4); one seat becomes three.
    single = dataclasses.replace(drawn, block_size=4, num_blocks=10, max_num_seqs=1)
    wide = sglang_paged_chunks(single)
    assert (wide.block_size, wide.max_num_batched_tokens, wide.max_num_seqs) == (4, 16, 3)
    assert (wide.max_model_len, wide.num_blocks) == (48, 24)
    assert max_prompt_tokens(wide) == 41
    # Twelve seats: a budget of a token a seat, more than four pages.
    crowded_pages = dataclasses.replace(drawn, block_size=1, max_num_seqs=12)
    assert sglang_paged_chunks(crowded_pages).max_num_batched_tokens == 12


@settings(max_examples=200, deadline=None)
@given(config=sglang_configs())
def test_every_sglang_regime_narrows_any_drawn_config_to_a_legal_one(
    config: SchedulerConfig,
) -> None:
    for regime in SGLANG_REGIMES:
        narrowed = regime.narrow(config)  # validated in __post_init__
        assert narrowed.family == "sglang" and regime.corner in CORNER_NAMES
        # Idempotent: a regime's configs are its fixed points (openings.paired_opening).
        assert regime.narrow(narrowed) == narrowed
        assert regime.opening is None or regime.opening in OPENING_NAMES
        if regime.narrow is sglang_crowded:
            # The shortest context and the plain loop: the crowd is of one-token prompts.
            assert narrowed.max_model_len == MIN_SGLANG_MAX_MODEL_LEN
            assert not narrowed.async_scheduling
            continue
        # sglang-mixed-overcommit, sglang-readmit and sglang-paged-chunks lengthen a short
        # context (their prompts and decodes must be long); the others keep it.
        assert narrowed.max_model_len >= config.max_model_len
        if regime.narrow is sglang_readmit:
            # The plain loop: a cohort decodes in step, its victims retracted together.
            assert not narrowed.async_scheduling
            assert narrowed.max_num_batched_tokens >= 2 * narrowed.max_model_len
            continue
        assert narrowed.async_scheduling == config.async_scheduling


@settings(max_examples=100, deadline=None)
@given(config=sglang_configs(async_scheduling=True))
def test_a_fixed_overlap_mode_outlasts_the_sglang_regimes(config: SchedulerConfig) -> None:
    assert config.async_scheduling  # sglang-crowded's plain loop included


def test_sglang_configs_spend_their_share_in_the_regimes() -> None:
    counts: Counter[str] = Counter()

    @settings(max_examples=500, deadline=None, database=None)
    @given(config=sglang_configs())
    def draw(config: SchedulerConfig) -> None:
        counts["radix" if config.schedule_conservativeness == 0.1 else "other"] += 1

    draw()
    total = SGLANG_PLAIN_WEIGHT + sum(r.weight for r in SGLANG_REGIMES)
    assert total == 18
    # The tight-radix, mixed-overcommit, crowded and readmit regimes (13 of 18) plus the
    # other draws of 0.1 (a third of 5 of 18): about four fifths.
    share = counts["radix"] / sum(counts.values())
    assert 0.65 < share < 0.92, counts


@settings(max_examples=200, deadline=None)
@given(config=configs())
def test_every_hybrid_regime_narrows_any_drawn_config_to_a_legal_one(
    config: SchedulerConfig,
) -> None:
    # SchedulerConfig validates in __post_init__: a pool below what one max_model_len
    # request holds over the groups, or a block size other than their lcm, raises.
    for regime in HYBRID_REGIMES:
        narrowed = regime.narrow(config)
        assert narrowed.kv_cache_groups and not narrowed.kv_connector
        assert narrowed.max_model_len == config.max_model_len
        assert narrowed.async_scheduling == config.async_scheduling
        assert regime.corner in CORNER_NAMES


def test_hybrid_configs_are_hybrid_in_half_their_draws() -> None:
    counts: Counter[bool] = Counter()

    @settings(max_examples=600, deadline=None, database=None)
    @given(config=configs(hybrid=True))
    def draw(config: SchedulerConfig) -> None:
        counts[bool(config.kv_cache_groups)] += 1

    draw()
    assert sum(r.weight for r in HYBRID_REGIMES) == PLAIN_WEIGHT + sum(r.weight for r in REGIMES)
    assert 0.35 < counts[True] / sum(counts.values()) < 0.65, counts


def test_mamba_wide_block_worked_example() -> None:
    """A Mamba block wider than the step's budget: #40707's corner."""
    narrowed = hybrid_regimes.mamba_wide_block(ROOMY)
    mamba = narrowed.kv_cache_groups[1]
    assert isinstance(mamba, MambaGroup) and mamba.mamba_cache_mode == "align"
    assert mamba.block_size > narrowed.max_num_batched_tokens
    assert narrowed.enable_chunked_prefill and narrowed.long_prefill_token_threshold == 0


@settings(max_examples=300, deadline=None)
@given(config=configs())
def test_configs_without_hybrid_draw_no_groups(config: SchedulerConfig) -> None:
    """The hybrid regimes are drawn only by configs(hybrid=True), as the connector's only
    by configs(kv_connector=True): configs() keeps its regime list and its draws."""
    assert config.kv_cache_groups == ()


@settings(max_examples=1, deadline=None, database=None)
@given(data=st.data())
def test_a_connector_and_hybrid_groups_are_not_drawn_together(data: st.DataObject) -> None:
    with pytest.raises(ValueError, match="together"):
        data.draw(configs(kv_connector=True, hybrid=True))
