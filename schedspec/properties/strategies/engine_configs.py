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
from schedspec.spec.kv_groups import MambaGroup

# ------------------------------------------------------------------------- vLLM


def vllm_configs(
    max_model_len_cap: int = 96,
    *,
    async_scheduling: bool | None = None,
    drafts: bool | None = None,
    release: Release | None = None,
    kv_connector: bool = False,
    hybrid: bool = False,
) -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs as vLLM runs them: sync and async, no drafts, n-gram
    (lookahead 0) and EAGLE (lookahead K) drafters, padding on whenever it
    speculates (see `expressible`). vLLM's findings F2 and F3 live in here.

    async_scheduling fixes the mode; drafts=True makes every config speculate
    (K = 0 draws become an EAGLE K = 1), drafts=False none; None draws them.
    release: whose knob values (by default the installed release's): its long-prefill
    rule, and cache-aware admission drawn only where it has it.
    kv_connector: the KV connector's regimes are drawn too (sync configs only carry
    one); the cap on loads in flight only where the release has it.
    hybrid: the hybrid KV cache regimes are drawn too, their groups as the adapter runs
    them on vLLM (adapters/vllm/kv_groups.py `expressible`).
    """
    release = release or current_release()
    drawn = configs(
        max_model_len_cap,
        async_scheduling=async_scheduling,
        pad_spec_decode=True,
        long_prefill_needs_chunked_prefill=release.long_prefill_needs_chunked_prefill,
        cache_aware_admission=release.cache_aware_admission,
        kv_connector=kv_connector,
        hybrid=hybrid,
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
    kv_connector: bool = False,
    hybrid: bool = False,
) -> st.SearchStrategy[SchedulerConfig]:
    """`--engine vllm`'s default configs: vllm_configs() outside the corners where vLLM and
    the spec are known to part (`avoid_known_corners`), so a run fails only on something new."""
    return vllm_configs(
        max_model_len_cap,
        async_scheduling=async_scheduling,
        drafts=drafts,
        release=release,
        kv_connector=kv_connector,
        hybrid=hybrid,
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


def vllm_connector_configs(
    max_model_len_cap: int = 96, *, release: Release | None = None
) -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs with the KV connector's regimes drawn too (issue 31): vLLM's
    own connector scheduler path runs our connector class (adapters/vllm/connector.py),
    in sync mode wherever one is drawn, with the cap on loads in flight only where the
    release has it, and outside F5 (`avoid_known_corners`). `schedspec check --engine
    vllm --configs schedspec.properties.strategies.engine_configs:vllm_connector_configs`."""
    return vllm_default_configs(max_model_len_cap, release=release, kv_connector=True)


def vllm_hybrid_configs(
    max_model_len_cap: int = 96, *, release: Release | None = None
) -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs with the hybrid KV cache regimes drawn too (issue 34): vLLM's
    scheduler built from the groups (adapters/vllm/kv_groups.py). `schedspec check
    --engine vllm --configs
    schedspec.properties.strategies.engine_configs:vllm_hybrid_configs`, and the same
    for `diff --right vllm --compare-block-ids`."""
    return vllm_default_configs(max_model_len_cap, release=release, hybrid=True)


def vllm_hybrid_attention_configs() -> st.SearchStrategy[SchedulerConfig]:
    """vllm_hybrid_configs without Mamba groups: the window and chunked-local rules alone
    (docs/FINDINGS.md G5 and G6 are theirs). Mamba's checkpoint stop (G4) and junction stop
    (G7) are modelled, and vllm_hybrid_configs draws Mamba, with prefix caching."""
    return vllm_hybrid_configs().filter(
        lambda config: not any(isinstance(g, MambaGroup) for g in config.kv_cache_groups)
    )


def hybrid_configs(max_model_len_cap: int = 96) -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs with the hybrid KV cache regimes drawn too (docs/SPEC.md,
    "Hybrid KV cache groups"): half of them with sliding-window, chunked-local and Mamba
    groups beside full attention. For engines with Capability.HYBRID_KV: `schedspec check
    --configs schedspec.properties.strategies.engine_configs:hybrid_configs`, as .ci/run
    runs it on the reference."""
    return configs(max_model_len_cap, hybrid=True)


# ----------------------------------------------------------------------- SGLang


def sglang_default_configs(max_model_len_cap: int = 96) -> st.SearchStrategy[SchedulerConfig]:
    """`--engine sglang`'s default configs: the suite's SGLang-family configs (page sizes
    1, 2 and 4, chunked prefill on and off, radix cache on and off, conservativeness
    1, 0.3 and 0.1, mixed chunk on and off, plain and overlap loops), max_num_seqs
    within SGLang's cap (`within_sglangs_caps`). Without the SGLang regimes, as
    vllm_default_configs stays outside vLLM's known corners: their small chunks beside
    decodes in a tight pool are S4's corner (docs/FINDINGS.md), where SGLang 0.5.23 runs
    a chunk's allocation out of memory inside schedule(); with them, `schedspec diff
    --left reference --right sglang --seed 20261206` met it under sglang-small-chunks at
    conservativeness 0.3 (89 slots, chunks of 4, mixed)."""
    return sglang_configs(max_model_len_cap, regimes=False).map(within_sglangs_caps)


# Between two releases (scripts/cross_release_diff.py): where every supported release
# makes the same decisions as far as the knobs can tell, and each knob's corner alone.
def vllm_release_neutral_configs(
    release: Release | None = None,
) -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs() where Release.mismatch is None for every supported
    release: chunked prefill on or no long-prefill cap, and no cache-aware window. Two
    releases diffed on these must agree at every step; where they do not, they part on
    something no knob states yet."""
    return vllm_default_configs(release=release).map(_release_neutral)


def vllm_long_prefill_rule_configs(
    release: Release | None = None,
) -> st.SearchStrategy[SchedulerConfig]:
    """vllm_release_neutral_configs() with chunked prefill off and a long-prefill cap (half
    max_model_len, or 1 + K with drafts): where the releases' long-prefill rules part."""
    return vllm_release_neutral_configs(release).map(_capped_unchunked)


def vllm_cache_aware_configs(release: Release | None = None) -> st.SearchStrategy[SchedulerConfig]:
    """vllm_release_neutral_configs() under fcfs with prefix caching and a cache-aware
    window of 2 to 4 (threshold 0: it acts on every step): where 0.34.0 reorders."""
    return st.builds(_windowed, vllm_release_neutral_configs(release), st.integers(2, 4))


def _release_neutral(config: SchedulerConfig) -> SchedulerConfig:
    neutral = replace(config, cache_aware_admission_window=0, cache_aware_admission_threshold=0.5)
    if not neutral.enable_chunked_prefill and neutral.long_prefill_token_threshold:
        neutral = replace(neutral, long_prefill_token_threshold=0)
    return neutral


def _capped_unchunked(config: SchedulerConfig) -> SchedulerConfig:
    # Chunking off needs a budget of max_model_len (SchedulerConfig). F3's corner (a cap
    # below 1 + K cutting a padded admission) stays out, as in the defaults: the cap is at
    # least 1 + K, and where that exceeds max_model_len the config drafts nothing, so a
    # cap is always there for the rules to part on.
    if 1 + config.num_speculative_tokens > config.max_model_len:
        config = replace(
            config, num_speculative_tokens=0, num_lookahead_tokens=0, pad_spec_decode=False
        )
    cap = max(1, config.max_model_len // 2, 1 + config.num_speculative_tokens)
    return avoid_known_corners(
        replace(
            config,
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len),
            long_prefill_token_threshold=min(cap, config.max_model_len),
        )
    )


def _windowed(config: SchedulerConfig, window: int) -> SchedulerConfig:
    # The window acts only under fcfs (so F2's corner, priority with caching, stays out);
    # turning prefix caching on moves an EAGLE drafter to n-gram (G1's corner).
    return avoid_known_corners(
        replace(
            config,
            policy="fcfs",
            enable_prefix_caching=True,
            cache_aware_admission_window=window,
            cache_aware_admission_threshold=0.0,
        )
    )


def connector_configs(max_model_len_cap: int = 96) -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs with the KV connector's regimes drawn too (docs/SPEC.md, "The
    KV connector"): `schedspec check --configs
    schedspec.properties.strategies.engine_configs:connector_configs`, as .ci/run runs it
    on the reference. Synchronous where the connector is drawn (the spec refuses it under
    async scheduling)."""
    return configs(max_model_len_cap, kv_connector=True)
