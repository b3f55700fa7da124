"""What an engine has: the capabilities an adapter declares, and the configs they allow.

The spec's config space covers every knob of vLLM V1 and SGLang; an engine of one's own
rarely has them all. An adapter declares the features its engine has in a
`capabilities` attribute (a frozenset of Capability), and every run draws configs within
them (`within`): an engine without drafts is never given num_speculative_tokens > 0,
one without priority scheduling never the priority policy. The corners a capability is
needed for are "not applicable" in the run's corner table (properties/corners.py).

A capability that comes with a protocol method (DRAFTS: update_draft_token_ids) is
refused when the adapter is loaded if the method is missing, None, or the adapter kit's
refusing default (`refuses_drafts`): otherwise the refusal would come only from the
first run that happened to draw drafts.

An adapter that declares nothing is taken to have every capability (ALL_CAPABILITIES):
it is held to the whole config space, as every adapter was before capabilities
existed, so a missing declaration never quietly checks less. The registered engines
declare theirs explicitly.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from schedspec.spec import Family, SchedulerConfig, SpecInputError, shown


class Capability(enum.Enum):
    """A feature an engine may have, named after the config knob that asks for it."""

    DRAFTS = "drafts"  # speculative decoding: num_speculative_tokens > 0
    SPEC_DECODE_PADDING = "spec-decode-padding"  # pad_spec_decode (needs DRAFTS)
    ASYNC_SCHEDULING = "async-scheduling"  # the next step scheduled before output lands
    PRIORITY = "priority"  # policy "priority"
    PREFIX_CACHING = "prefix-caching"  # enable_prefix_caching
    CHUNKED_PREFILL = "chunked-prefill"  # enable_chunked_prefill
    LONG_PREFILL_CAP = "long-prefill-cap"  # long_prefill_token_threshold > 0
    WATERMARK = "watermark"  # watermark > 0
    CACHE_AWARE_ADMISSION = "cache-aware-admission"  # cache_aware_admission_window > 0
    KV_CONNECTOR = "kv-connector"  # kv_connector (remote KV loads and sends)
    MIXED_CHUNK = "mixed-chunk"  # SGLang's enable_mixed_chunk
    HYBRID_KV = "hybrid-kv"  # kv_cache_groups (sliding-window, chunked-local, Mamba groups)


ALL_CAPABILITIES: frozenset[Capability] = frozenset(Capability)
# What the SGLang family's configs can ask for (its other knobs are vLLM's, kept off).
SGLANG_FAMILY_CAPABILITIES: frozenset[Capability] = frozenset(
    {
        Capability.ASYNC_SCHEDULING,
        Capability.PREFIX_CACHING,
        Capability.CHUNKED_PREFILL,
        Capability.MIXED_CHUNK,
    }
)
# What the vLLM family's configs can ask for (all but SGLang's own knob).
VLLM_FAMILY_CAPABILITIES: frozenset[Capability] = ALL_CAPABILITIES - {Capability.MIXED_CHUNK}
FAMILY_CAPABILITIES: dict[Family, frozenset[Capability]] = {
    "vllm": VLLM_FAMILY_CAPABILITIES,
    "sglang": SGLANG_FAMILY_CAPABILITIES,
}
# An adapter that declares none is held to every config (the module docstring says why).
DEFAULT_CAPABILITIES = ALL_CAPABILITIES
# The protocol method each capability needs, where it needs one, and what it must do.
METHODS: dict[Capability, tuple[str, str]] = {
    Capability.DRAFTS: ("update_draft_token_ids", "take the drafter's proposals")
}
# The config knob that asks for each capability, as a refusal names it.
KNOBS: dict[Capability, str] = {
    Capability.DRAFTS: "num_speculative_tokens > 0",
    Capability.SPEC_DECODE_PADDING: "pad_spec_decode",
    Capability.ASYNC_SCHEDULING: "async_scheduling",
    Capability.PRIORITY: "policy='priority'",
    Capability.PREFIX_CACHING: "enable_prefix_caching",
    Capability.CHUNKED_PREFILL: "enable_chunked_prefill",
    Capability.LONG_PREFILL_CAP: "long_prefill_token_threshold > 0",
    Capability.WATERMARK: "watermark > 0",
    Capability.CACHE_AWARE_ADMISSION: "cache_aware_admission_window > 0",
    Capability.KV_CONNECTOR: "kv_connector",
    Capability.MIXED_CHUNK: "enable_mixed_chunk",
    Capability.HYBRID_KV: "kv_cache_groups",
}
# A capability that makes sense only with another.
REQUIRES: dict[Capability, Capability] = {
    Capability.SPEC_DECODE_PADDING: Capability.DRAFTS,
    Capability.MIXED_CHUNK: Capability.CHUNKED_PREFILL,
}

F = TypeVar("F", bound=Callable[..., object])
_REFUSES = "_schedspec_refuses_drafts"


def refuses_drafts(method: F) -> F:
    """Mark an update_draft_token_ids that takes no drafts (the adapter kit's default):
    an adapter whose method is this one does not have DRAFTS, whatever it declares."""
    setattr(method, _REFUSES, True)
    return method


class CapabilityError(SpecInputError):
    """An adapter's `capabilities` declaration is malformed or not backed by its methods."""


_UNDECLARED = "declares no capabilities, so it is taken to have every one, including"


def claimed_capabilities(engine: object) -> frozenset[Capability]:
    """The capabilities an adapter declares in its `capabilities` attribute (none:
    DEFAULT_CAPABILITIES), checked: a frozenset of Capability, each with what it
    requires, and the method each needs present."""
    name = type(engine).__qualname__
    declared = getattr(engine, "capabilities", None)
    if declared is None:
        declared = DEFAULT_CAPABILITIES
    if not isinstance(declared, set | frozenset) or not all(
        isinstance(c, Capability) for c in declared
    ):
        raise CapabilityError(
            "capabilities",
            f"the adapter {name} declares {shown(declared)}: expected a frozenset of "
            "schedspec.engines.capabilities.Capability, e.g. "
            "frozenset({Capability.PREFIX_CACHING, Capability.CHUNKED_PREFILL})",
        )
    for capability, needed in REQUIRES.items():
        if capability in declared and needed not in declared:
            raise CapabilityError(
                "capabilities",
                f"the adapter {name} declares {capability.name} without {needed.name}, "
                f"which it needs: declare both, or neither",
            )
    said = "declares" if getattr(engine, "capabilities", None) is not None else _UNDECLARED
    for capability, (method, job) in METHODS.items():
        if capability in declared and not _has_method(engine, method):
            raise CapabilityError(
                "capabilities",
                f"the adapter {name} {said} {capability.name}, but its `{method}` is "
                f"missing, None or the adapter kit's refusing default: implement {method} "
                f"({job}), or leave {capability.name} out of `capabilities` so that no "
                "config draws it",
            )
    return frozenset(declared)


def _has_method(engine: object, method: str) -> bool:
    found = getattr(engine, method, None)
    return callable(found) and not getattr(found, _REFUSES, False)


def needed_capabilities(config: SchedulerConfig) -> frozenset[Capability]:
    """The capabilities an engine needs to run `config`."""
    needs = {
        Capability.DRAFTS: config.num_speculative_tokens > 0,
        Capability.SPEC_DECODE_PADDING: config.pad_spec_decode,
        Capability.ASYNC_SCHEDULING: config.async_scheduling,
        Capability.PRIORITY: config.policy == "priority",
        Capability.PREFIX_CACHING: config.enable_prefix_caching,
        Capability.CHUNKED_PREFILL: config.enable_chunked_prefill,
        Capability.LONG_PREFILL_CAP: config.long_prefill_token_threshold > 0,
        Capability.WATERMARK: config.watermark > 0,
        Capability.CACHE_AWARE_ADMISSION: config.cache_aware_admission_window > 0,
        Capability.KV_CONNECTOR: config.kv_connector,
        Capability.MIXED_CHUNK: config.enable_mixed_chunk,
        Capability.HYBRID_KV: bool(config.kv_cache_groups),
    }
    return frozenset(c for c, needed in needs.items() if needed)


def unmet_capabilities(
    capabilities: frozenset[Capability], config: SchedulerConfig
) -> frozenset[Capability]:
    """What `config` needs that `capabilities` lacks."""
    return needed_capabilities(config) - capabilities


def within(capabilities: frozenset[Capability], config: SchedulerConfig) -> SchedulerConfig:
    """`config` with every knob the capabilities lack turned off (its off value), and the
    bounds that turning it off moves kept (chunked prefill off needs a budget of
    max_model_len). A config already within them is returned as it is."""
    missing = unmet_capabilities(capabilities, config)
    if not missing:
        return config
    changes: dict[str, object] = {}
    if Capability.DRAFTS in missing or Capability.SPEC_DECODE_PADDING in missing:
        changes["pad_spec_decode"] = False
    if Capability.DRAFTS in missing:
        changes.update(num_speculative_tokens=0, num_lookahead_tokens=None)
    if Capability.ASYNC_SCHEDULING in missing:
        changes["async_scheduling"] = False
    if Capability.PRIORITY in missing:
        changes["policy"] = "fcfs"
    if Capability.PREFIX_CACHING in missing:
        changes["enable_prefix_caching"] = False
    if Capability.CHUNKED_PREFILL in missing:
        changes.update(
            enable_chunked_prefill=False,
            enable_mixed_chunk=False,
            max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len),
        )
    if Capability.LONG_PREFILL_CAP in missing:
        changes["long_prefill_token_threshold"] = 0
    if Capability.WATERMARK in missing:
        changes["watermark"] = 0.0
    if Capability.CACHE_AWARE_ADMISSION in missing:
        changes.update(cache_aware_admission_window=0, cache_aware_admission_threshold=0.5)
    if Capability.KV_CONNECTOR in missing:
        changes.update(
            kv_connector=False, kv_load_failure_policy="fail", max_num_inflight_kv_loads=None
        )
    if Capability.MIXED_CHUNK in missing:
        changes["enable_mixed_chunk"] = False
    if Capability.HYBRID_KV in missing:
        # The scheduler block size (the groups' lcm) stays, and the pool a hybrid request
        # needs is at least the single group's.
        changes["kv_cache_groups"] = ()
    return replace(config, **changes)  # type: ignore[arg-type]
