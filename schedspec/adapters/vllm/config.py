"""The spec's SchedulerConfig as vLLM's config objects, and the configs vLLM cannot run.

`build_scheduler` builds the scheduler class vLLM's engine core would build for the
config (`SchedulerConfig.get_scheduler_cls()`: `AsyncScheduler` with async scheduling,
else `Scheduler`), with its KVCacheManager and BlockPool, built as vLLM's unit tests
build it: a ModelConfig pointed at a temporary folder holding only a tiny `config.json`
(no tokenizer, no weights, HF_HUB_OFFLINE=1: adapters/vllm/runtime.py), and a
KVCacheConfig with one full-attention group and no tensors.

Translation of the config (`SchedulerConfig` -> vLLM):

- blocks: vLLM reserves block 0 as its null block, so it gets num_blocks + 1
  blocks; vLLM block b is our block b - 1 everywhere (tables, free queue,
  ref counts, prefix-cache map).
- watermark: vLLM keeps int(watermark * all blocks, null block included)
  spare; we keep int(watermark * num_blocks). The adapter passes the vLLM
  watermark whose block count equals ours (`vllm_watermark`).
- speculative decoding: num_lookahead_tokens 0 is vLLM's n-gram drafter
  (`SpeculativeConfig(model="ngram")`); num_lookahead_tokens == K is an
  EAGLE drafter, described by a second tiny `config.json`, whose lookahead
  vLLM sets to K. Other lookaheads cannot be expressed and are refused
  (`unsupported_reason`), as are EAGLE configs vLLM itself refuses (a token
  budget <= K).
- spec-decode padding: vLLM always pads a one-token admission to 1 + K
  tokens with K placeholder drafts when K > 0 (no dynamic-SD table), so a
  config with drafts must say pad_spec_decode=True (docs/FINDINGS.md F1);
  pad_spec_decode=False with drafts is refused (`unsupported_reason`).
- async scheduling: `async_scheduling` is passed to vLLM's SchedulerConfig
  explicitly, so VllmConfig's own resolution (it turns an unset flag on
  wherever the executor supports it) says sync or async as the spec's
  config does. Sync is what a deployment gets with `--no-async-scheduling`.
  The engine core then runs a batch queue of `max_concurrent_batches`
  steps: 2 async, 1 sync, which is the harness's pipeline.BatchQueue.
- model runner: a GPU deployment of vLLM 0.33.0 runs the V2 model runner
  for every config the adapter builds (`VllmConfig.use_v2_model_runner`:
  VLLM_USE_V2_MODEL_RUNNER unset, Triton present, and none of the features
  V2 lacks: no PP, no micro-batching, n-gram and EAGLE drafters are V2's).
  The adapter leaves that resolution to vLLM; on this scheduler-only
  install vLLM's platform is "unspecified", for which the property skips
  its Triton check and so resolves as on a GPU. Elsewhere (a vLLM CPU
  build without Triton, or VLLM_USE_V2_MODEL_RUNNER=0) it resolves to V1,
  which the adapter refuses rather than test a layout no GPU runs; set
  VLLM_USE_V2_MODEL_RUNNER=1 there. 0.34.0 removed the V1 runner, and with
  it the scheduler's `use_v2_model_runner` (feature detection: absent means
  V2). The V2 runner's layout is translated back (adapters/vllm/output.py).
- the release's knobs (adapters/vllm/releases.py): vLLM runs its own long-prefill
  rule whatever the config's knob says, and 0.34.0's `cache_aware_admission_window`
  and `_threshold` are passed to vLLM's SchedulerConfig as they are (vLLM's KV usage,
  free blocks over all but the null block, is the spec's); 0.33.0 has no window. A
  config whose knobs do not describe the installed release where they matter
  (`Release.mismatch`) still runs, and the engine claims safety only: vllm-v1 is
  vLLM's exact decisions as the config states them, and this release decides
  otherwise there. That is how two releases meet in one diff (`--profile safety`).
- KV connector (config.kv_connector): vLLM's KVTransferConfig names our connector
  class by module path (adapters/vllm/connector.py, the spec's fake connector),
  kv_role "kv_both" (it loads and sends), with the config's kv_load_failure_policy;
  0.34.0's max_num_inflight_kv_loads goes to vLLM's SchedulerConfig (0.33.0 has no
  such knob: `Release.refusal`). Only under sync scheduling: see `refusal`.
- prefix caching hashes with SHA-256, as vLLM's engine does by default;
  with an EAGLE drafter vLLM's block hashes also cover the token after each
  block (its "lookahead hashes"), as in production.
- log_stats off. `_check_translation` refuses to go on if vLLM's config
  resolution or hooks changed any of the values above.

What is refused, and the configs vLLM runs instead:

- `refusal` (and `unsupported_reason`, the same as one line): a lookahead without
  drafts or other than 0 or K, an EAGLE config whose budget is <= K (vLLM refuses it),
  drafts without padding (F1), a max_model_len above TINY_MAX_POSITIONS, the tiny
  model's position limit, a KV connector under async scheduling. `build_scheduler`
  raises it as a ConfigError, and the installed release's own refusals
  (`Release.refusal`: a cap on KV loads in flight before 0.34.0); an installed
  release outside releases.SUPPORTED is UnsupportedVllmError, before vLLM is imported.
- `expressible`: the nearest config vLLM can run (the release's knob values, an
  inexpressible lookahead becomes the n-gram drafter's 0, a drafter vLLM cannot build
  goes, padding on exactly when it speculates), for configs drawn without vLLM in mind.
- `avoid_known_corners`: the config moved out of the corners where vLLM and the spec
  are known to part (docs/FINDINGS.md F2, F3, G1), so a default run fails only on
  something new; its docstring says how each corner is left.

The Hypothesis strategies built on these (vllm_default_configs and its narrowings) are
schedspec/properties/strategies/engine_configs.py's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from schedspec.adapters.engine_import import TINY_MAX_POSITIONS
from schedspec.adapters.vllm import kv_groups
from schedspec.adapters.vllm.releases import Release, current_release
from schedspec.adapters.vllm.runtime import Vllm, load_vllm
from schedspec.engines.pipeline import BatchQueue
from schedspec.spec import ConfigError, SchedulerConfig


def refusal(config: SchedulerConfig) -> ConfigError | None:
    """Why vLLM (any supported release) cannot run this config at all (the field at fault
    and the reason), or None if it can. Knob values that do not describe the installed
    release are no refusal (Release.mismatch)."""
    k = config.num_speculative_tokens
    lookahead = config.lookahead_tokens
    if k == 0 and lookahead:
        return ConfigError(
            "num_lookahead_tokens",
            f"{lookahead} without speculative decoding: vLLM reserves lookahead slots "
            "only for a drafter (num_speculative_tokens > 0)",
        )
    if k and lookahead not in (0, k):
        return ConfigError(
            "num_lookahead_tokens",
            f"{lookahead}: vLLM's n-gram drafter has lookahead 0 and its EAGLE drafter "
            f"lookahead num_speculative_tokens ({k}); nothing else",
        )
    if k and lookahead and config.max_num_batched_tokens <= lookahead:
        return ConfigError(
            "max_num_batched_tokens",
            f"{config.max_num_batched_tokens} <= num_lookahead_tokens ({lookahead}): "
            "vLLM refuses such an EAGLE config",
        )
    if k and not config.pad_spec_decode:
        return ConfigError(
            "pad_spec_decode",
            f"False with num_speculative_tokens={k}: vLLM always pads a one-token "
            "admission with placeholder drafts when it speculates (docs/FINDINGS.md F1); "
            "it must be True",
        )
    if config.max_model_len > TINY_MAX_POSITIONS:
        return ConfigError(
            "max_model_len", f"above {TINY_MAX_POSITIONS}, the tiny model's position limit"
        )
    return kv_groups.refusal(config)


def unsupported_reason(config: SchedulerConfig) -> str | None:
    """`refusal` as one line ("field: reason"), or None if vLLM can run the config."""
    refused = refusal(config)
    return None if refused is None else str(refused)


def expressible(config: SchedulerConfig, release: Release | None = None) -> SchedulerConfig:
    """The nearest config vLLM (`release`, by default the installed one) can run: the
    release's knob values, an inexpressible lookahead becomes 0 (n-gram), a drafter
    vLLM cannot build goes, and padding is on exactly when it speculates. (A KV
    connector under async scheduling is refused by SchedulerConfig itself: vLLM then
    defers block frees past the batch in flight, which the spec does not model.)"""
    config = kv_groups.expressible((release or current_release()).knobs(config))
    if refusal(config) is None:
        return config
    padded = replace(config, pad_spec_decode=config.num_speculative_tokens > 0)
    if refusal(padded) is None:
        return padded
    ngram = replace(padded, num_lookahead_tokens=0)
    if refusal(ngram) is None:
        return ngram
    return replace(ngram, num_speculative_tokens=0, pad_spec_decode=False)


def avoid_known_corners(config: SchedulerConfig) -> SchedulerConfig:
    """The config moved out of the corners where vLLM and the spec are known to part
    (docs/FINDINGS.md), each to the nearest config that keeps the rest of the draw:

    - F2, a vLLM finding (a priority victim keeps the prefix-cache registrations its own
      step made, so a later hit reads KV never written): needs the priority policy and
      prefix caching together; under priority, prefix caching goes off.
    - F3, a vLLM finding (the long-prefill cap cuts the padding and vLLM fails its own
      assertion): needs padding and 0 < long_prefill_token_threshold < 1 + K; the cap
      becomes 1 + K (none where max_model_len is below that), so it never cuts a padded
      admission.
    - G1, a gap in the reference (FINDINGS "G1"): with an EAGLE drafter vLLM hashes each
      block together with the token after it, so a prefix-cache hit stops one block
      earlier wherever the next tokens differ; the reference's hits do not, so the
      vllm-v1 profile (ADMISSION-STOP, and a lockstep diff) parts there. With prefix
      caching on, the drafter is n-gram (lookahead 0) until the reference models it.
    - F5, a vLLM finding (a KV load that failed with nothing valid under "recompute"
      stays in vLLM's reservation, and its retry's async load is charged it: the retry
      must fit twice over, and where it cannot it waits for ever with the pool free):
      the policy becomes "fail". No pool floor avoids it: blocks held for sends the
      worker never reports shrink the pool below any floor, down to `smallest_pool`,
      where the spec still requires every request to finish.

    Each corner has a test (tests/test_vllm_adapter.py) showing that it still parts, so
    this narrowing hides nothing else. (G7, the Mamba split's stop at the shared-prefix
    junction, was one until the reference modelled it.)
    """
    if config.policy == "priority" and config.enable_prefix_caching:
        config = replace(config, enable_prefix_caching=False)
    padded = 1 + config.num_speculative_tokens
    if config.pad_spec_decode and 0 < config.long_prefill_token_threshold < padded:
        cap = padded if padded <= config.max_model_len else 0
        config = replace(config, long_prefill_token_threshold=cap)
    if config.enable_prefix_caching and config.lookahead_tokens > 0:
        config = replace(config, num_lookahead_tokens=0)
    if config.kv_connector and config.kv_load_failure_policy == "recompute":
        config = replace(config, kv_load_failure_policy="fail")
    return config


def vllm_watermark(config: SchedulerConfig) -> float:
    """The vLLM watermark whose block count, over num_blocks + 1 blocks, is ours.

    vLLM keeps int(w * (num_blocks + 1)) blocks spare; (k + 0.5) / (num_blocks + 1)
    gives exactly k = int(watermark * num_blocks) (and is < 1 since k < num_blocks).
    """
    k = config.watermark_blocks
    return 0.0 if k == 0 else (k + 0.5) / (config.num_blocks + 1)


def build_scheduler(config: SchedulerConfig, num_blocks: int | None = None) -> Any:
    """vLLM's Scheduler for this config, built the way vLLM's own unit tests build it.

    num_blocks, when given, replaces config.num_blocks: it lets a probe give
    the Scheduler less KV cache than max_model_len needs, which vLLM's engine
    refuses at start-up (and SchedulerConfig refuses too).
    """
    release = current_release()  # UnsupportedVllmError before vLLM is imported
    refused = refusal(config) or release.refusal(config)
    if refused is not None:
        raise refused
    v = load_vllm()
    model_config = v.ModelConfig(
        model=v.model_dir,
        skip_tokenizer_init=True,
        max_model_len=config.max_model_len,
        dtype="float32",
        seed=0,
    )
    scheduler_config = v.SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        watermark=vllm_watermark(config),
        policy=config.policy,
        # Explicit: left unset, VllmConfig turns it on wherever the executor can.
        async_scheduling=config.async_scheduling,
        **_cache_aware_admission(release, config),
        **_inflight_kv_loads(release, config),
    )
    cache_config = v.CacheConfig(
        block_size=config.block_size,
        enable_prefix_caching=config.enable_prefix_caching,
        prefix_caching_hash_algo="sha256",
        mamba_cache_mode=kv_groups.mamba_cache_mode(config),
    )
    vllm_config = v.VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=v.DeviceConfig(device="cpu"),
        speculative_config=_speculative_config(v, config, model_config),
        kv_transfer_config=_kv_transfer_config(v, config),
    )
    usable = config.num_blocks if num_blocks is None else num_blocks
    num_vllm_blocks = usable + 1  # block 0 is vLLM's null block
    kv_cache_config = kv_groups.kv_cache_config(v, config, num_vllm_blocks)
    cache_config.num_gpu_blocks = num_vllm_blocks
    scheduler_block_size, hash_block_size = _resolve_block_sizes(v, vllm_config, kv_cache_config)
    v.register_all_kvcache_specs(vllm_config)
    # The class vLLM's engine core builds: AsyncScheduler when async_scheduling resolved on.
    scheduler_class = vllm_config.scheduler_config.get_scheduler_cls()
    scheduler = scheduler_class(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        log_stats=False,
        structured_output_manager=v.StructuredOutputManager(vllm_config),
    )
    _check_translation(scheduler, vllm_config, config, usable)
    return scheduler


def _resolve_block_sizes(v: Vllm, vllm_config: Any, kv_cache_config: Any) -> tuple[int, int]:
    """The scheduler's block size and the block size vLLM hashes requests at, resolved as
    vLLM's engine core resolves them once the KV cache is sized (EngineCore's KV cache
    start-up, both releases): the cache config's block size becomes the smallest
    prefix-cacheable group's (the Mamba split reads it), then resolve_kv_cache_block_sizes
    gives the lcm of the groups' sizes and, under prefix caching, their gcd. One group:
    the config's block size, twice."""
    groups = kv_cache_config.kv_cache_groups
    cacheable = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
    vllm_config.cache_config.block_size = min(
        cacheable or [g.kv_cache_spec.block_size for g in groups]
    )
    sizes: tuple[int, int] = v.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    return sizes


def _cache_aware_admission(release: Release, config: SchedulerConfig) -> dict[str, Any]:
    """The cache-aware admission knobs for vLLM's SchedulerConfig, where the release
    has them (0.34.0 on); vLLM applies the window only under FCFS with prefix caching
    (Scheduler.__init__), as the spec does, so it is passed whatever the policy."""
    if not release.cache_aware_admission:
        return {}
    return {
        "cache_aware_admission_window": config.cache_aware_admission_window,
        "cache_aware_admission_threshold": config.cache_aware_admission_threshold,
    }


def _inflight_kv_loads(release: Release, config: SchedulerConfig) -> dict[str, Any]:
    """max_num_inflight_kv_loads for vLLM's SchedulerConfig, where the release has it
    (0.34.0 on; build_scheduler refused a cap elsewhere)."""
    if not release.inflight_kv_load_cap:
        return {}
    return {"max_num_inflight_kv_loads": config.max_num_inflight_kv_loads}


def _kv_transfer_config(v: Vllm, config: SchedulerConfig) -> Any:
    """vLLM's KVTransferConfig naming our connector class, or None without a connector.
    kv_both: the spec's connector both loads (RemoteKV) and sends (send_on_finish)."""
    if not config.kv_connector:
        return None
    from schedspec.adapters.vllm.connector import CONNECTOR_CLASS, CONNECTOR_MODULE

    return v.KVTransferConfig(
        kv_connector=CONNECTOR_CLASS,
        kv_connector_module_path=CONNECTOR_MODULE,
        kv_role="kv_both",
        kv_load_failure_policy=config.kv_load_failure_policy,
    )


def _speculative_config(v: Vllm, config: SchedulerConfig, model_config: Any) -> Any:
    k = config.num_speculative_tokens
    if k == 0:
        return None
    if config.lookahead_tokens == 0:
        return v.SpeculativeConfig(model="ngram", num_speculative_tokens=k)
    return v.SpeculativeConfig(
        method="eagle",
        model=v.eagle_dir,
        num_speculative_tokens=k,
        target_model_config=model_config,
        target_parallel_config=v.ParallelConfig(),
    )


def _check_translation(
    scheduler: Any, vllm_config: Any, config: SchedulerConfig, num_blocks: int
) -> None:
    """vLLM's platform hooks may rewrite a config; refuse to test anything but ours."""
    kv = scheduler.kv_cache_manager
    sc = vllm_config.scheduler_config
    # Absent before 0.34.0, which has no cache-aware admission: a window of 0.
    window = getattr(sc, "cache_aware_admission_window", 0)
    seen = {
        "block_size": scheduler.block_size,
        "num_blocks": len(kv.block_pool.blocks) - 1,
        "max_num_batched_tokens": scheduler.max_num_scheduled_tokens,
        "max_num_seqs": scheduler.max_num_running_reqs,
        "max_num_active_seqs": scheduler.max_num_active_reqs,
        "max_model_len": scheduler.max_model_len,
        "enable_chunked_prefill": scheduler.scheduler_config.enable_chunked_prefill,
        "long_prefill_token_threshold": scheduler.scheduler_config.long_prefill_token_threshold,
        "enable_prefix_caching": kv.enable_caching,
        "watermark_blocks": kv.watermark_blocks,
        "policy": scheduler.policy.name.lower(),
        "num_speculative_tokens": scheduler.num_spec_tokens,
        "num_lookahead_tokens": scheduler.num_lookahead_tokens,
        "drafting_slots": (
            vllm_config.speculative_config.max_num_new_slots_for_drafting
            if vllm_config.speculative_config is not None
            else 0
        ),
        # The padding condition's config part (scheduler.py's waiting loop).
        "pad_spec_decode": scheduler.num_spec_tokens > 0
        and scheduler.dynamic_sd_lookup is None
        and scheduler.num_sampled_tokens_per_step > 0,
        "async_scheduling": sc.async_scheduling,
        "scheduler_class": type(scheduler).__name__,
        "max_concurrent_batches": vllm_config.max_concurrent_batches,
        # (window, threshold): the threshold means nothing without a window.
        "cache_aware_admission": (window, sc.cache_aware_admission_threshold if window else None),
        "kv_connector": type(scheduler.connector).__name__ if scheduler.connector else None,
        "kv_load_failure_policy": (
            vllm_config.kv_transfer_config.kv_load_failure_policy
            if vllm_config.kv_transfer_config is not None
            else "fail"
        ),
        # Absent before 0.34.0, which has no cap: None.
        "max_num_inflight_kv_loads": getattr(sc, "max_num_inflight_kv_loads", None),
        "kv_cache_groups": kv_groups.spec_groups(kv.kv_cache_config),
        "mamba_cache_mode": vllm_config.cache_config.mamba_cache_mode,
        "null_block_id": kv.block_pool.null_block.block_id,
        # What a GPU deployment runs; the scheduler reads it once, when built. 0.34.0
        # removed the V1 runner and this attribute with it: absent is V2.
        "use_v2_model_runner": getattr(scheduler, "use_v2_model_runner", True),
    }
    # The window the installed release has: 0.33.0 runs every config without one.
    own_window = current_release().knobs(config).cache_aware_admission_window
    wanted = {
        "block_size": config.block_size,
        "num_blocks": num_blocks,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "max_num_active_seqs": config.max_num_seqs,
        "max_model_len": config.max_model_len,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "long_prefill_token_threshold": config.long_prefill_token_threshold,
        "enable_prefix_caching": config.enable_prefix_caching,
        "watermark_blocks": config.watermark_blocks,
        "policy": config.policy,
        "num_speculative_tokens": config.num_speculative_tokens,
        "num_lookahead_tokens": config.lookahead_tokens,
        "drafting_slots": 0,
        "pad_spec_decode": config.pad_spec_decode,
        "async_scheduling": config.async_scheduling,
        "scheduler_class": "AsyncScheduler" if config.async_scheduling else "Scheduler",
        "max_concurrent_batches": BatchQueue(config).size,
        "cache_aware_admission": (
            own_window,
            config.cache_aware_admission_threshold if own_window else None,
        ),
        "kv_connector": "SchedspecConnector" if config.kv_connector else None,
        "kv_load_failure_policy": config.kv_load_failure_policy,
        "max_num_inflight_kv_loads": config.max_num_inflight_kv_loads,
        "kv_cache_groups": kv_groups.groups_of(config),
        "mamba_cache_mode": kv_groups.mamba_cache_mode(config),
        "null_block_id": kv_groups.VLLM_NULL_BLOCK_ID,
        "use_v2_model_runner": True,
    }
    differ = {name: (wanted[name], got) for name, got in seen.items() if got != wanted[name]}
    if differ:
        hint = (
            " (the adapter runs the V2 model runner, as a GPU deployment of vLLM does: "
            "set VLLM_USE_V2_MODEL_RUNNER=1)"
            if "use_v2_model_runner" in differ
            else ""
        )
        raise RuntimeError(f"vLLM did not take the config as given (wanted, got): {differ}{hint}")
