"""The reference scheduler as an engine: it already speaks the spec, so it only
declares the profiles it claims (safety and the profile of the family it is built in)
and its capabilities: every knob of its family."""

from __future__ import annotations

from schedspec.engines.capabilities import (
    SGLANG_FAMILY_CAPABILITIES,
    VLLM_FAMILY_CAPABILITIES,
    Capability,
)
from schedspec.reference import Scheduler, SGLangScheduler
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile


class ReferenceEngine(Scheduler):
    profiles: frozenset[Profile] = frozenset({"safety", "vllm-v1"})
    capabilities: frozenset[Capability] = VLLM_FAMILY_CAPABILITIES


class SGLangReferenceEngine(SGLangScheduler):
    profiles: frozenset[Profile] = frozenset({"safety", "sglang"})
    capabilities: frozenset[Capability] = SGLANG_FAMILY_CAPABILITIES


def reference_engine(config: SchedulerConfig) -> ReferenceEngine | SGLangReferenceEngine:
    """The reference in the config's policy family."""
    if config.family == "sglang":
        return SGLangReferenceEngine(config)
    return ReferenceEngine(config)
