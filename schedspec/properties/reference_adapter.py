"""The reference scheduler as an engine: it already speaks the spec, so it only
declares the profiles it claims."""

from __future__ import annotations

from schedspec.reference import Scheduler
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile


class ReferenceEngine(Scheduler):
    profiles: frozenset[Profile] = frozenset({"safety", "vllm-v1"})


def reference_engine(config: SchedulerConfig) -> ReferenceEngine:
    return ReferenceEngine(config)
