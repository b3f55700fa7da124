"""The configs each real engine is checked on: the suite's own (strategies/configs.py)
narrowed to what that engine runs, by the plain rules its adapter states (what it
refuses and the nearest config it runs instead, the corners where it is known to part
from the spec: adapters/vllm/config.py, adapters/sglang/config.py).

The registry (engines/registry.py) names vllm_default_configs and sglang_default_configs
as `--engine vllm`'s and `--engine sglang`'s default configs; the narrowings below them
are for `--configs` (CI's lockstep diffs run vllm_async_configs_with_drafts and
vllm_async_configs_without_drafts).

vLLM's configs are the installed release's (adapters/vllm/releases.py; the newest
supported where vLLM is not installed): configs() draws them with its long-prefill rule
fixed, and cache-aware admission drawn only where it has it (0.34.0).
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import strategies as st

from schedspec.adapters.sglang.config import within_sglangs_caps
from schedspec.adapters.vllm.config import avoid_known_corners, expressible
from schedspec.adapters.vllm.releases import Release, current_release
from schedspec.properties.strategies.configs import configs, sglang_configs
from schedspec.spec import SchedulerConfig

# ------------------------------------------------------------------------- vLLM


def vllm_configs(
    max_model_len_cap: int = 96,
    *,
    async_scheduling: bool | None = None,
    drafts: bool | None = None,
    release: Release | None = None,
) -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs as vLLM runs them: sync and async, no drafts, n-gram
    (lookahead 0) and EAGLE (lookahead K) drafters, padding on whenever it
    speculates (see `expressible`). vLLM's findings F2 and F3 live in here.

    async_scheduling fixes the mode; drafts=True makes every config speculate
    (K = 0 draws become an EAGLE K = 1), drafts=False none; None draws them.
    release: whose knob values (by default the installed release's): its long-prefill
    rule, and cache-aware admission drawn only where it has it.
    """
    release = release or current_release()
    drawn = configs(
        max_model_len_cap,
        async_scheduling=async_scheduling,
        pad_spec_decode=True,
        long_prefill_needs_chunked_prefill=release.long_prefill_needs_chunked_prefill,
        cache_aware_admission=release.cache_aware_admission,
    )
    if drafts is not None:
        drawn = drawn.map(functools.partial(_with_drafts, drafts))
    return drawn.map(functools.partial(expressible, release=release))


def _with_drafts(drafts: bool, config: SchedulerConfig) -> SchedulerConfig:
    if not drafts:
        return replace(
            config, num_speculative_tokens=0, num_lookahead_tokens=None, pad_spec_decode=False
        )
    if config.num_speculative_tokens:
        return config
    # A padded admission (1 + K tokens) must fit the budget, as configs() ensures.
    budget = max(config.max_num_batched_tokens, 2)
    return replace(
        config, num_speculative_tokens=1, pad_spec_decode=True, max_num_batched_tokens=budget
    )


def vllm_default_configs(
    max_model_len_cap: int = 96,
    *,
    async_scheduling: bool | None = None,
    drafts: bool | None = None,
    release: Release | None = None,
) -> st.SearchStrategy[SchedulerConfig]:
    """`--engine vllm`'s default configs: vllm_configs() outside the corners where vLLM and
    the spec are known to part (`avoid_known_corners`), so a run fails only on something new."""
    return vllm_configs(
        max_model_len_cap, async_scheduling=async_scheduling, drafts=drafts, release=release
    ).map(avoid_known_corners)


# The default configs narrowed, by name for --configs (CI's lockstep diffs run these).
def vllm_async_configs_with_drafts() -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs() in async mode, every config speculating."""
    return vllm_default_configs(async_scheduling=True, drafts=True)


def vllm_async_configs_without_drafts() -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs() in async mode, no config speculating."""
    return vllm_default_configs(async_scheduling=True, drafts=False)


def vllm_sync_configs_with_drafts() -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs() in sync mode (`--no-async-scheduling`), every config
    speculating."""
    return vllm_default_configs(async_scheduling=False, drafts=True)


# ----------------------------------------------------------------------- SGLang


def sglang_default_configs(max_model_len_cap: int = 96) -> st.SearchStrategy[SchedulerConfig]:
    """`--engine sglang`'s default configs: the suite's SGLang-family configs (page sizes
    1, 2 and 4, chunked prefill on and off, radix cache on and off, conservativeness
    1, 0.3 and 0.1, mixed chunk on and off, plain and overlap loops), max_num_seqs
    within SGLang's cap (`within_sglangs_caps`)."""
    return sglang_configs(max_model_len_cap).map(within_sglangs_caps)
