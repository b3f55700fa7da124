"""Small builders shared by the scheduler tests: configs, requests, hand-made model outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from schedspec.properties.checked_engine import CheckedEngine
from schedspec.properties.strategies.actions import RequestDraw, build_add_request
from schedspec.reference import KVCacheManager, Scheduler
from schedspec.spec import ModelRunnerOutput, Request, SchedulerConfig, SchedulerOutput


def make_config(**overrides: Any) -> SchedulerConfig:
    fields: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 64,
        "max_num_batched_tokens": 512,
        "max_num_seqs": 16,
        "max_model_len": 256,
    }
    fields.update(overrides)
    return SchedulerConfig(**fields)


def small_config(**overrides: Any) -> SchedulerConfig:
    """A 16-block cache of 4-token blocks, a 32-token budget and context, four seats: small
    enough that a handful of requests contend (the vLLM adapter tests' config)."""
    fields: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 16,
        "max_num_batched_tokens": 32,
        "max_num_seqs": 4,
        "max_model_len": 32,
    }
    return SchedulerConfig(**(fields | overrides))


def cache_aware_config(**overrides: Any) -> SchedulerConfig:
    """make_config with cache-aware admission acting from the start: prefix caching, a
    window of 4, a threshold of 0 (it engages in an empty cache), and one seat, so the
    waiting queue's order decides who runs next."""
    fields: dict[str, Any] = {
        "enable_prefix_caching": True,
        "cache_aware_admission_window": 4,
        "cache_aware_admission_threshold": 0.0,
        "max_num_seqs": 1,
    }
    fields.update(overrides)
    return make_config(**fields)


def make_scheduler(**overrides: Any) -> Scheduler:
    return Scheduler(make_config(**overrides))


def add(
    scheduler: Scheduler,
    request_id: str,
    num_prompt_tokens: int,
    max_tokens: int = 100,
    *,
    first_token: int = 1000,
    **kwargs: Any,
) -> Request:
    """Add a request whose prompt is first_token, first_token + 1, ... (distinct per request)."""
    prompt = list(range(first_token, first_token + num_prompt_tokens))
    request = Request(request_id, prompt, max_tokens, **kwargs)
    scheduler.add_request(request)
    return request


def emit(
    scheduler: Scheduler,
    output: SchedulerOutput,
    tokens: Mapping[str, Sequence[int]] | None = None,
    default_token: int = 7,
) -> None:
    """Answer a step: each request that finished its prefill or decoded emits
    `tokens[id]` if given, else one `default_token`; prefill chunks emit nothing."""
    given = dict(tokens or {})
    sampled: dict[str, Sequence[int]] = {}
    for rid in output.num_scheduled_tokens:
        request = scheduler.requests.get(rid)
        if request is None or request.is_prefill_chunk:
            continue
        sampled[rid] = given.get(rid, [default_token])
    scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids=sampled))


def step(
    scheduler: Scheduler, tokens: Mapping[str, Sequence[int]] | None = None
) -> SchedulerOutput:
    """schedule() then answer it with emit()."""
    output = scheduler.schedule()
    emit(scheduler, output, tokens)
    return output


def single_group_kv(scheduler: Scheduler) -> KVCacheManager:
    """The scheduler's KV cache manager, for a test of the single group (no kv_cache_groups)."""
    kv = scheduler.kv_cache_manager
    assert isinstance(kv, KVCacheManager), "a single-group scheduler"
    return kv


def free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def as_version(document: dict[str, Any], version: int) -> dict[str, Any]:
    """A trace document written now, with an older version number and without the config
    fields of versions 6 and later (the KV connector's, the KV cache groups), which no
    older trace can carry; fields of versions 2-5 stay, for the test to remove or keep."""
    from schedspec.traces.trace import CONNECTOR_SINCE_VERSION, FIELD_SINCE_VERSION

    document["version"] = version
    for name, since in FIELD_SINCE_VERSION.items():
        if since >= CONNECTOR_SINCE_VERSION and version < since:
            document["config"].pop(name, None)
    return document


def add_drawn(
    checked: CheckedEngine, config: SchedulerConfig, index: int, draw: RequestDraw
) -> None:
    """Add the drawn request as r{index}, let in at the door (door 0), to the checked
    engine."""
    admitted = dataclasses.replace(draw, door=0)
    checked.apply(build_add_request(config, f"r{index}", checked.state.requests, admitted))
