"""The reference scheduler as an engine: it already speaks the spec, so it only
declares the profiles it claims: safety and the profile of the family it is built in."""

from __future__ import annotations

from schedspec.reference import Scheduler, SGLangScheduler
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile


class ReferenceEngine(Scheduler):
    profiles: frozenset[Profile] = frozenset({"safety", "vllm-v1"})


class SGLangReferenceEngine(SGLangScheduler):
    profiles: frozenset[Profile] = frozenset({"safety", "sglang"})


def reference_engine(config: SchedulerConfig) -> ReferenceEngine | SGLangReferenceEngine:
    """The reference in the config's policy family."""
    if config.family == "sglang":
        return SGLangReferenceEngine(config)
    return ReferenceEngine(config)
