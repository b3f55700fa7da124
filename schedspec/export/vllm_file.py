"""A trace as a pytest file for vLLM: its own V1 Scheduler, built and stepped on CPU the
way vLLM's tests/v1/core/test_scheduler.py does (a VllmConfig of its own config objects,
a KVCacheConfig with no tensors, Requests, a hand-built ModelRunnerOutput a step).

The config's translation is the adapter's (adapters/vllm/config.py: the null block, the
watermark, the drafter), written out as constants. What the file cannot run is refused
naming the config field (lowering.config_refusal): async scheduling (the file is the
synchronous engine core's loop, as vLLM's scheduler tests are), a KV connector, and
whatever the adapter refuses.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedspec.adapters.engine_import import tiny_llama
from schedspec.adapters.vllm.config import refusal, vllm_watermark
from schedspec.export.lowering import Lowering, config_refusal
from schedspec.export.source import assignment
from schedspec.export.test_file import Provenance, render
from schedspec.traces.trace import Trace

VLLM = Lowering(
    engine="vLLM",
    family="vllm",
    loop="drives the scheduler synchronously, as vLLM's scheduler tests do",
    takes_drafts=True,
)
ABOUT = (
    "It builds vLLM's V1 Scheduler on CPU as vLLM's own scheduler tests do (a tiny model "
    "config, a KVCacheConfig with no tensors), makes Requests, and steps it synchronously: "
    "schedule(), a hand-built ModelRunnerOutput, update_from_output(). The model is a "
    "deterministic function of (seed, request id, position). After every call it asserts "
    "schedspec's invariants (BUDGET, SEQS, CACHE-CONTENT, CONSERVATION; DRAIN and "
    "NO-LEAK after a drain) on the scheduler's own objects: it fails where the bug is and "
    "passes on a fixed vLLM."
)


def vllm_test_file(trace: Trace, provenance: Provenance, engine_args: Mapping[str, object]) -> str:
    """The pytest file; engine_args: extra keyword arguments of vLLM's SchedulerConfig."""
    refused = config_refusal(trace.config, VLLM, refusal(trace.config))
    if refused is not None:
        raise refused
    config = trace.config
    extra: dict[str, object] = {}
    if config.cache_aware_admission_window:  # vLLM 0.34.0's knobs, where the trace uses them
        extra["cache_aware_admission_window"] = config.cache_aware_admission_window
        extra["cache_aware_admission_threshold"] = config.cache_aware_admission_threshold
    extra.update(engine_args)
    constants = [
        "# The scheduler's config (the trace's, as vLLM's config objects take it).",
        *assignment("BLOCK_SIZE", config.block_size),
        *assignment("NUM_BLOCKS", config.num_blocks, "usable blocks; vLLM adds null block 0"),
        *assignment("MAX_NUM_BATCHED_TOKENS", config.max_num_batched_tokens),
        *assignment("MAX_NUM_SEQS", config.max_num_seqs),
        *assignment("MAX_MODEL_LEN", config.max_model_len),
        *assignment("ENABLE_CHUNKED_PREFILL", config.enable_chunked_prefill),
        *assignment("LONG_PREFILL_TOKEN_THRESHOLD", config.long_prefill_token_threshold),
        *assignment("ENABLE_PREFIX_CACHING", config.enable_prefix_caching),
        *assignment(
            "WATERMARK", vllm_watermark(config), f"keeps {config.watermark_blocks} blocks spare"
        ),
        *assignment("POLICY", config.policy),
        *assignment("NUM_SPECULATIVE_TOKENS", config.num_speculative_tokens),
        *assignment("EAGLE", config.lookahead_tokens > 0, "else the n-gram drafter"),
        *assignment("SCHEDULER_EXTRA_ARGS", extra),
        "# The model: tokens and drafts are a pure function of these.",
        *assignment("SEED", trace.model.seed),
        *assignment("VOCAB_SIZE", trace.model.vocab_size),
        *assignment("DRAFT_ACCEPTANCE", trace.model.draft_acceptance),
        *assignment("TINY_MODEL", tiny_llama("LlamaForCausalLM")),
    ]
    return render("vllm", constants, [ABOUT], provenance, config, trace.events, VLLM)
