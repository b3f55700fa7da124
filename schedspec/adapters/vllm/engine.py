"""vLLM V1's scheduler under schedspec: an EngineAdapter, on CPU, with no model download.

vLLM is imported only inside this module, and only when an engine is built;
install it with `scripts/install_vllm.sh VENV_DIR`. The adapter drives the
scheduler class vLLM's engine core would build for the config
(`SchedulerConfig.get_scheduler_cls()`: `AsyncScheduler` with async
scheduling, else `Scheduler`), with its KVCacheManager and BlockPool, built as
vLLM's unit tests build it: a ModelConfig pointed at a temporary folder holding
only a tiny `config.json` (no tokenizer, no weights, HF_HUB_OFFLINE=1), and a
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
  VLLM_USE_V2_MODEL_RUNNER=1 there. The V2 runner's layout is translated
  back (see schedule() below).
- prefix caching hashes with SHA-256, as vLLM's engine does by default;
  with an EAGLE drafter vLLM's block hashes also cover the token after each
  block (its "lookahead hashes"), as in production.
- log_stats off. `_check_translation` refuses to go on if vLLM's config
  resolution or hooks changed any of the values above.

Translation of the calls: add_request applies the checks vLLM makes above
the Scheduler (the front end's prompt-length check, duplicate ids) through
`schedspec.spec.validate_new_request`, then builds a vLLM Request with the
engine's block hasher; its arrival_time is its arrival index, so vLLM's
priority order (priority, arrival_time) is ours. Its vLLM request id is the
spec's id plus "#" and the arrival index (vllm_output.internal_id), as vLLM's
front end gives every request an internal id of its own: a client may reuse
an aborted request's id while that request's step is still in flight, and
vLLM keys its requests by id (with one id for both, vLLM applies the old
step's output to the new request). Every id is translated back on the way
out. aborts go one id at a time
(vLLM iterates a set, which would make a multi-id abort's free order, and so
later block ids, depend on string hashing).

schedule() translates vLLM's SchedulerOutput to the spec's. The V2 runner
learns a resumed request whole again: vLLM lists it among
scheduled_new_reqs, with all its token ids (`prefill_token_ids`: prompt and
outputs) and its whole block table. The spec, like the V1 runner, says
"resumed": a CachedRequestData with resumed=True, the whole table, the
computed count before the step and num_output_tokens = its outputs (a
resumed request has no placeholders: preemption zeroed them). A new request
of vLLM's output is resumed exactly when it was PREEMPTED, and only
preemption makes it so, which its num_preemptions counts.

`SchedulerOutput.skip_drafts` (V2 runner with a lookahead drafter, i.e.
EAGLE: vLLM's `can_skip_drafts`) tells the model runner to propose no drafts
after the step, because no scheduled request can use them: each is a
non-final prefill chunk or sure to reach max_tokens in this step
(`Scheduler._drafts_unused`). The scheduler's own state does not depend on
it, and the spec's SchedulerOutput has no such field. The harness's
FakeModel fills placeholder drafts with the drafter's guesses as if the
drafter had run: that models vLLM only if vLLM's claim holds, so the adapter
holds vLLM to it: a request whose last step skipped drafting must not be
scheduled again with drafts it would verify (the running loop's drafts; an
admission's padding drafts were never proposed by anyone). Seeing one is a
RuntimeError naming the request.

update_from_output() lands the oldest step in flight (vLLM's engine core
lands them in order) and returns what vLLM reports to the front end per
request (its EngineCoreOutputs: kept tokens and finish reason), which STOP
checks; vLLM does not report a computed count, so that field stays None.

The refinement mapping (`snapshot`): per request, vLLM's token lists, drafts,
num_computed_tokens, status, block table (minus the null block offset),
num_preemptions, priority and arrival index, and the async pipeline's
counters (num_in_flight_tokens, num_output_placeholders,
num_stale_output_tokens, drop_stale_output, is_prefill_chunk); the waiting
queue in the order vLLM pops it (kv-holding queue first, then the FCFS deque
or the priority heap drained in order); the running list; the free queue
front to back; each block's ref count and cached hash; the prefix-cache map.
vLLM names a block's content by SHA-256 over pickled tokens, the spec by
chained BLAKE2b: each vLLM request carries its own block hashes, computed
from its tokens, so the adapter pairs vLLM hash i of a request with the spec
hash of the same request's block i (from its tokens, independent of any
block table) and translates the pool's hashes through that pairing. (With
EAGLE's lookahead hashes two vLLM hashes can name one spec hash: same block,
different next token; the prefix-cache map then lists that spec hash twice.)
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from schedspec.adapters.vllm.output import (
    DraftingSkips,
    external_id,
    internal_id,
    spec_block_ids,
    spec_output,
)
from schedspec.engines.pipeline import BatchQueue
from schedspec.properties.strategies.configs import configs
from schedspec.spec import (
    BlockHash,
    ConfigError,
    KVState,
    ModelRunnerOutput,
    OutputError,
    Request,
    RequestError,
    RequestOutput,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
    extend_block_hashes,
    validate_new_request,
)
from schedspec.spec.config import require_family
from schedspec.spec.invariants import Profile

INSTALL_STEP = "scripts/install_vllm.sh VENV_DIR"
# max_position_embeddings of the tiny model: the largest max_model_len we can ask for.
MAX_MODEL_LEN = 1 << 20
_LLAMA: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": MAX_MODEL_LEN,
    "torch_dtype": "float32",
}
_EAGLE: dict[str, object] = {
    **_LLAMA,
    "architectures": ["EagleLlamaForCausalLM"],
    "num_hidden_layers": 1,
}


class VllmMissingError(ImportError):
    """vLLM is not importable in this environment."""


# ----------------------------------------------------------------- vLLM import


@dataclass(frozen=True)
class _Vllm:
    """The vLLM names the adapter uses (all Any: vLLM ships no type stubs)."""

    CacheConfig: Any
    DeviceConfig: Any
    ModelConfig: Any
    ParallelConfig: Any
    SchedulerConfig: Any
    SpeculativeConfig: Any
    VllmConfig: Any
    Scheduler: Any
    FullAttentionSpec: Any
    KVCacheConfig: Any
    KVCacheGroupSpec: Any
    StructuredOutputManager: Any
    register_all_kvcache_specs: Any
    get_request_block_hasher: Any
    init_none_hash: Any
    get_hash_fn_by_name: Any
    Request: Any
    RequestStatus: Any
    SamplingParams: Any
    ModelRunnerOutput: Any
    DraftTokenIds: Any
    float32: Any
    model_dir: str
    eagle_dir: str


_loaded: _Vllm | None = None


def _load_vllm() -> _Vllm:
    """Import vLLM once, offline and quiet, with the tiny model folders written."""
    global _loaded
    if _loaded is not None:
        return _loaded
    # Read when huggingface_hub is imported: the tiny model is a local folder.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_vllm_logging()
    try:
        import torch
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            ParallelConfig,
            SpeculativeConfig,
            VllmConfig,
        )
        from vllm.config import SchedulerConfig as VllmSchedulerConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.outputs import DraftTokenIds
        from vllm.v1.outputs import ModelRunnerOutput as VllmModelRunnerOutput
        from vllm.v1.request import Request as VllmRequest
        from vllm.v1.request import RequestStatus as VllmRequestStatus
        from vllm.v1.structured_output import StructuredOutputManager
    except ImportError as err:
        raise VllmMissingError(
            f"the vLLM adapter needs vLLM, which cannot be imported here ({err}); "
            f"install it into this venv with `{INSTALL_STEP}`"
        ) from err
    root = tempfile.mkdtemp(prefix="schedspec-vllm-")
    atexit.register(shutil.rmtree, root, True)
    model_dir = os.path.join(root, "model")
    eagle_dir = os.path.join(root, "eagle")
    for folder, hf_config in ((model_dir, _LLAMA), (eagle_dir, _EAGLE)):
        os.mkdir(folder)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(hf_config, f)
    _loaded = _Vllm(
        CacheConfig=CacheConfig,
        DeviceConfig=DeviceConfig,
        ModelConfig=ModelConfig,
        ParallelConfig=ParallelConfig,
        SchedulerConfig=VllmSchedulerConfig,
        SpeculativeConfig=SpeculativeConfig,
        VllmConfig=VllmConfig,
        Scheduler=Scheduler,
        FullAttentionSpec=FullAttentionSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        StructuredOutputManager=StructuredOutputManager,
        register_all_kvcache_specs=register_all_kvcache_specs,
        get_request_block_hasher=get_request_block_hasher,
        init_none_hash=init_none_hash,
        get_hash_fn_by_name=get_hash_fn_by_name,
        Request=VllmRequest,
        RequestStatus=VllmRequestStatus,
        SamplingParams=SamplingParams,
        ModelRunnerOutput=VllmModelRunnerOutput,
        DraftTokenIds=DraftTokenIds,
        float32=torch.float32,
        model_dir=model_dir,
        eagle_dir=eagle_dir,
    )
    return _loaded


# vLLM's own logger warns about every tiny config (block sizes, budgets); torch's
# custom-op registry warns "Triton not available" whenever vLLM imports its Triton
# kernels on a machine without Triton (an engine build that misses vLLM's model-info
# cache does, to write the cache).
QUIETED_LOGGERS = ("vllm", "torch._library.triton")
# Any of these set means the user configured vLLM's logging and wants to see it.
VLLM_LOGGING_VARIABLES = (
    "VLLM_LOGGING_LEVEL",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_CONFIGURE_LOGGING",
)


def quiet_vllm_logging() -> None:
    """Keep only errors from QUIETED_LOGGERS, unless the user configured vLLM's logging
    (a VLLM_LOGGING_VARIABLES variable set) or already gave that logger a level."""
    if any(name in os.environ for name in VLLM_LOGGING_VARIABLES):
        return
    for name in QUIETED_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.ERROR)


def vllm_available() -> bool:
    """Whether vLLM can be imported (and so a VllmEngine built)."""
    try:
        _load_vllm()
    except VllmMissingError:
        return False
    return True


# ---------------------------------------------------------- config translation


def refusal(config: SchedulerConfig) -> ConfigError | None:
    """Why vLLM cannot run this config as the spec states it (the field at fault and
    the reason), or None if it can."""
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
    if config.max_model_len > MAX_MODEL_LEN:
        return ConfigError(
            "max_model_len", f"above {MAX_MODEL_LEN}, the tiny model's position limit"
        )
    return None


def unsupported_reason(config: SchedulerConfig) -> str | None:
    """`refusal` as one line ("field: reason"), or None if vLLM can run the config."""
    refused = refusal(config)
    return None if refused is None else str(refused)


def expressible(config: SchedulerConfig) -> SchedulerConfig:
    """The nearest config vLLM can run: an inexpressible lookahead becomes 0 (n-gram),
    a drafter vLLM cannot build goes, and padding is on exactly when it speculates."""
    if unsupported_reason(config) is None:
        return config
    padded = replace(config, pad_spec_decode=config.num_speculative_tokens > 0)
    if unsupported_reason(padded) is None:
        return padded
    ngram = replace(padded, num_lookahead_tokens=0)
    if unsupported_reason(ngram) is None:
        return ngram
    return replace(ngram, num_speculative_tokens=0, pad_spec_decode=False)


def vllm_configs(
    max_model_len_cap: int = 96,
    *,
    async_scheduling: bool | None = None,
    drafts: bool | None = None,
) -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs as vLLM runs them: sync and async, no drafts, n-gram
    (lookahead 0) and EAGLE (lookahead K) drafters, padding on whenever it
    speculates (see `expressible`). vLLM's findings F2 and F3 live in here.

    async_scheduling fixes the mode; drafts=True makes every config speculate
    (K = 0 draws become an EAGLE K = 1), drafts=False none; None draws them.
    """
    drawn = configs(max_model_len_cap, async_scheduling=async_scheduling, pad_spec_decode=True)
    if drafts is not None:
        drawn = drawn.map(functools.partial(_with_drafts, drafts))
    return drawn.map(expressible)


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

    Each corner has a test (tests/test_vllm_adapter.py) showing that it still parts,
    so this narrowing hides nothing else.
    """
    if config.policy == "priority" and config.enable_prefix_caching:
        config = replace(config, enable_prefix_caching=False)
    padded = 1 + config.num_speculative_tokens
    if config.pad_spec_decode and 0 < config.long_prefill_token_threshold < padded:
        cap = padded if padded <= config.max_model_len else 0
        config = replace(config, long_prefill_token_threshold=cap)
    if config.enable_prefix_caching and config.lookahead_tokens > 0:
        config = replace(config, num_lookahead_tokens=0)
    return config


def vllm_default_configs(
    max_model_len_cap: int = 96,
    *,
    async_scheduling: bool | None = None,
    drafts: bool | None = None,
) -> st.SearchStrategy[SchedulerConfig]:
    """`--engine vllm`'s default configs: vllm_configs() outside the corners where vLLM and
    the spec are known to part (`avoid_known_corners`), so a run fails only on something new."""
    return vllm_configs(max_model_len_cap, async_scheduling=async_scheduling, drafts=drafts).map(
        avoid_known_corners
    )


# The default configs narrowed, by name for --configs (CI's lockstep diffs run these).
def vllm_async_configs_with_drafts() -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs() in async mode, every config speculating."""
    return vllm_default_configs(async_scheduling=True, drafts=True)


def vllm_async_configs_without_drafts() -> st.SearchStrategy[SchedulerConfig]:
    """vllm_default_configs() in async mode, no config speculating."""
    return vllm_default_configs(async_scheduling=True, drafts=False)


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
    refused = refusal(config)
    if refused is not None:
        raise refused
    v = _load_vllm()
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
    )
    cache_config = v.CacheConfig(
        block_size=config.block_size,
        enable_prefix_caching=config.enable_prefix_caching,
        prefix_caching_hash_algo="sha256",
    )
    vllm_config = v.VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=v.DeviceConfig(device="cpu"),
        speculative_config=_speculative_config(v, config, model_config),
    )
    usable = config.num_blocks if num_blocks is None else num_blocks
    num_vllm_blocks = usable + 1  # block 0 is vLLM's null block
    kv_cache_config = v.KVCacheConfig(
        num_blocks=num_vllm_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            v.KVCacheGroupSpec(
                ["layer"],
                v.FullAttentionSpec(
                    block_size=config.block_size, num_kv_heads=1, head_size=1, dtype=v.float32
                ),
            )
        ],
    )
    cache_config.num_gpu_blocks = num_vllm_blocks
    v.register_all_kvcache_specs(vllm_config)
    # The class vLLM's engine core builds: AsyncScheduler when async_scheduling resolved on.
    scheduler_class = vllm_config.scheduler_config.get_scheduler_cls()
    scheduler = scheduler_class(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=config.block_size,
        log_stats=False,
        structured_output_manager=v.StructuredOutputManager(vllm_config),
    )
    _check_translation(scheduler, vllm_config, config, usable)
    return scheduler


def _speculative_config(v: _Vllm, config: SchedulerConfig, model_config: Any) -> Any:
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
        "async_scheduling": vllm_config.scheduler_config.async_scheduling,
        "scheduler_class": type(scheduler).__name__,
        "max_concurrent_batches": vllm_config.max_concurrent_batches,
        # What a GPU deployment runs; the scheduler reads it once, when built.
        "use_v2_model_runner": scheduler.use_v2_model_runner,
    }
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
        "use_v2_model_runner": True,
    }
    differ = {name: (wanted[name], got) for name, got in seen.items() if got != wanted[name]}
    if differ:
        hint = (
            " (the adapter runs the V2 model runner, as a GPU deployment of vLLM 0.33.0 "
            "does: set VLLM_USE_V2_MODEL_RUNNER=1)"
            if "use_v2_model_runner" in differ
            else ""
        )
        raise RuntimeError(f"vLLM did not take the config as given (wanted, got): {differ}{hint}")


# ------------------------------------------------------------------- the adapter

_STATUS: dict[str, RequestStatus] = {
    "WAITING": RequestStatus.WAITING,
    "RUNNING": RequestStatus.RUNNING,
    "PREEMPTED": RequestStatus.PREEMPTED,
    "FINISHED_STOPPED": RequestStatus.FINISHED_STOPPED,
    "FINISHED_LENGTH_CAPPED": RequestStatus.FINISHED_LENGTH_CAPPED,
    "FINISHED_ABORTED": RequestStatus.FINISHED_ABORTED,
}
# vLLM's FinishReason names: STOP covers EOS and stop tokens (and stop strings).
_FINISH_STATUS: dict[str, RequestStatus] = {
    "STOP": RequestStatus.FINISHED_STOPPED,
    "LENGTH": RequestStatus.FINISHED_LENGTH_CAPPED,
    "ABORT": RequestStatus.FINISHED_ABORTED,
}


class VllmEngine:
    """vLLM V1's scheduler (AsyncScheduler or Scheduler) seen through the spec.

    It claims vllm-v1 too: in both modes, with and without drafts, it makes every
    decision the profile pins down, outside the corners `avoid_known_corners` names
    (vLLM's findings F2 and F3, the reference's gap G1: docs/FINDINGS.md).
    """

    profiles: frozenset[Profile] = frozenset({"safety", "vllm-v1"})

    def __init__(self, config: SchedulerConfig, *, num_blocks: int | None = None) -> None:
        """num_blocks: see `build_scheduler` (probes only; the snapshot then has that many)."""
        require_family(config, "vLLM's scheduler", ("vllm",))
        self.config = config
        self._v = _load_vllm()
        self.scheduler: Any = build_scheduler(config, num_blocks)
        self._block_hasher: Any = None
        if config.enable_prefix_caching:
            # As vLLM's EngineCore does: the configured hash, vLLM's hash lookahead.
            hash_fn = self._v.get_hash_fn_by_name("sha256")
            self._v.init_none_hash(hash_fn)
            self._block_hasher = self._v.get_request_block_hasher(
                config.block_size,
                hash_fn,
                self.scheduler.vllm_config.num_hash_lookahead_tokens,
            )
        self._num_arrivals = 0
        # The vLLM id of each spec id's latest request (vllm_output.internal_id).
        self._internal: dict[str, str] = {}
        # Every request added and not yet seen finished: its hashes are learned
        # even from inside the update_from_output call that frees it.
        self._tracked: dict[str, Any] = {}
        self._own_hashes: dict[str, list[BlockHash]] = {}
        self._num_learned: dict[str, int] = {}
        self._spec_hash: dict[bytes, BlockHash] = {}  # vLLM block hash -> spec hash
        # Each step scheduled and not landed, oldest first: ours and vLLM's output.
        self._in_flight: deque[tuple[SchedulerOutput, Any]] = deque()
        self._drafting = DraftingSkips()

    # ------------------------------------------------------------------ calls

    def add_request(self, request: Request) -> None:
        # vLLM checks these above the Scheduler (front end, engine core).
        validate_new_request(request, self.config)
        if self._live_id(request.request_id) is not None:
            raise RequestError("request_id", f"duplicate request id {request.request_id!r}")
        rid = internal_id(request.request_id, self._num_arrivals)
        params = self._v.SamplingParams(
            max_tokens=request.max_tokens, stop_token_ids=list(request.stop_token_ids)
        )
        if request.eos_token_id is not None:
            params.update_from_generation_config({}, request.eos_token_id)
        vllm_request = self._v.Request(
            request_id=rid,
            prompt_token_ids=list(request.prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(self._num_arrivals),
            priority=request.priority,
            block_hasher=self._block_hasher,
        )
        self.scheduler.add_request(vllm_request)
        self._num_arrivals += 1
        self._internal[request.request_id] = rid
        self._tracked[rid] = vllm_request
        self._own_hashes[rid] = []
        self._num_learned[rid] = 0
        self._learn(rid, vllm_request)

    def schedule(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        ours = spec_output(out, self.scheduler.requests)
        self._drafting.check(ours, out.skip_drafts)
        self._in_flight.append((ours, out))
        return ours

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        """Land the oldest step in flight (vLLM's engine core lands steps in the order
        it scheduled them, and vLLM's counters, num_in_flight_tokens and stale output,
        count on that). Returns what vLLM reports to the front end for each request
        that emitted tokens or finished: its kept tokens and finish status."""
        if not self._in_flight or (
            self._in_flight[0][0] is not scheduler_output
            and self._in_flight[0][0] != scheduler_output
        ):
            raise OutputError("scheduler_output", "not the oldest schedule() output in flight")
        out = self._in_flight.popleft()[1]
        req_ids = list(out.num_scheduled_tokens)  # vLLM's ids of this step's requests
        sampled = model_runner_output.sampled_token_ids
        strangers = sorted(set(sampled) - set(map(external_id, req_ids)))
        if strangers:
            raise OutputError("sampled_token_ids", f"requests not scheduled: {strangers}")
        runner_output = self._v.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[list(sampled.get(external_id(rid), ())) for rid in req_ids],
        )
        reported = self.scheduler.update_from_output(out, runner_output)
        self._learn_tracked()
        return {
            external_id(o.request_id): RequestOutput(
                external_id(o.request_id),
                tuple(o.new_token_ids),
                self._finish_status(o.finish_reason),
            )
            for engine_core_outputs in reported.values()
            for o in engine_core_outputs.outputs
        }

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        live = [(self._live_id(rid), drafts) for rid, drafts in draft_token_ids.items()]
        known = [(rid, drafts) for rid, drafts in live if rid is not None]
        self.scheduler.update_draft_token_ids(
            self._v.DraftTokenIds(
                req_ids=[rid for rid, _ in known],
                draft_token_ids=[list(drafts) for _, drafts in known],
            )
        )

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        aborted = self._v.RequestStatus.FINISHED_ABORTED
        for request_id in dict.fromkeys(request_ids):
            rid = self._live_id(request_id)
            if rid is not None:
                self.scheduler.finish_requests(rid, aborted)
        self._learn_tracked()

    def _live_id(self, request_id: str) -> str | None:
        """vLLM's id of the live request the spec calls request_id, if there is one."""
        rid = self._internal.get(request_id)
        return rid if rid is not None and rid in self.scheduler.requests else None

    # ---------------------------------------------------- the refinement mapping

    def snapshot(self) -> State:
        s = self.scheduler
        kv = s.kv_cache_manager
        pool = kv.block_pool
        requests: dict[str, RequestState] = {}
        for rid, r in s.requests.items():
            self._learn(rid, r)
            params = r.sampling_params
            request_id = external_id(rid)
            requests[request_id] = RequestState(
                request_id=request_id,
                priority=r.priority,
                arrival=int(r.arrival_time),
                prompt_token_ids=tuple(r.prompt_token_ids),
                output_token_ids=tuple(r.output_token_ids),
                spec_token_ids=tuple(r.spec_token_ids),
                num_computed_tokens=r.num_computed_tokens,
                status=self._status(r),
                block_ids=spec_block_ids(kv.get_block_ids(rid)),
                num_preemptions=r.num_preemptions,
                max_tokens=r.max_tokens,
                eos_token_id=params.eos_token_id,
                stop_token_ids=tuple(params.stop_token_ids or ()),
                num_in_flight_tokens=r.num_in_flight_tokens,
                num_output_placeholders=r.num_output_placeholders,
                num_stale_output_tokens=r.num_stale_output_tokens,
                drop_stale_output=r.drop_stale_output,
                is_prefill_chunk=r.is_prefill_chunk,
            )
        blocks = pool.blocks[1:]  # block 0 is the null block
        return State(
            config=self.config,
            requests=requests,
            # The order vLLM pops them in: kv-holding requests first, then the
            # FCFS deque front to back or the priority heap drained in order.
            waiting=tuple(external_id(r.request_id) for r in s.kv_holding_waiting)
            + tuple(external_id(r.request_id) for r in s.waiting),
            running=tuple(external_id(r.request_id) for r in s.running),
            kv=KVState(
                num_blocks=len(blocks),
                free_block_ids=tuple(
                    b.block_id - 1 for b in pool.free_block_queue.get_all_free_blocks()
                ),
                ref_counts=tuple(b.ref_cnt for b in blocks),
                block_hashes=tuple(
                    None if b.block_hash is None else self._spec_of(b.block_hash) for b in blocks
                ),
                prefix_cache=tuple(
                    (self._spec_of(key), self._held_ids(held))
                    for key, held in pool.cached_block_hash_to_block._cache.items()
                ),
            ),
        )

    def _status(self, request: Any) -> RequestStatus:
        name = request.status.name
        status = _STATUS.get(name)
        if status is None:
            # Grammar, remote-KV, streaming, error and repetition states need
            # inputs the harness never gives; seeing one is an adapter gap.
            raise RuntimeError(f"request {request.request_id!r} in vLLM status {name}")
        return status

    @staticmethod
    def _finish_status(reason: Any) -> RequestStatus | None:
        """vLLM's FinishReason (an IntEnum, or None while live) as the spec's status."""
        if reason is None:
            return None
        status = _FINISH_STATUS.get(reason.name)
        if status is None:
            # Errors and repetition detection need inputs the harness never gives.
            raise RuntimeError(f"vLLM finish reason {reason.name}")
        return status

    @staticmethod
    def _held_ids(held: Any) -> tuple[int, ...]:
        """One prefix-cache entry's blocks: a single block, or {block_id: block}."""
        if isinstance(held, dict):
            return tuple(block_id - 1 for block_id in held)
        return (held.block_id - 1,)

    # ------------------------------------------------------ hash translation

    def _learn(self, rid: str, request: Any) -> None:
        """Pair the request's vLLM block hashes with the spec's hashes of its own blocks."""
        vllm_hashes = request.block_hashes
        done = self._num_learned.get(rid, 0)
        if len(vllm_hashes) <= done:
            return
        own = self._own_hashes.setdefault(rid, [])
        extend_block_hashes(own, list(request.all_token_ids), self.config.block_size)
        for i in range(done, len(vllm_hashes)):
            known = self._spec_hash.setdefault(bytes(vllm_hashes[i]), own[i])
            if known != own[i]:
                raise RuntimeError(
                    f"request {rid!r}: vLLM gives block {i} the hash of other content"
                )
        self._num_learned[rid] = len(vllm_hashes)

    def _learn_tracked(self) -> None:
        """After a call that may append tokens or free requests: learn, then forget
        the requests that finished."""
        for rid, request in list(self._tracked.items()):
            self._learn(rid, request)
            if request.is_finished():
                del self._tracked[rid]
                self._drafting.forget(external_id(rid))
                self._own_hashes.pop(rid, None)
                self._num_learned.pop(rid, None)

    def _spec_of(self, key: bytes) -> BlockHash:
        """A pool key (block hash + 4-byte group id) as the spec's hash."""
        found = self._spec_hash.get(bytes(key[:-4]))
        if found is None:
            raise RuntimeError("a vLLM block carries a hash no request's tokens produce")
        return found
