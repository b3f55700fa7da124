"""What a real engine's install probe builds: the plan each adapter's probe.py declares
(its engine, its config families, the per-user caches its engine reads) and
schedspec/properties/probe.py runs under the harness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from schedspec.engines.protocol import EngineFactory
from schedspec.spec import SchedulerConfig


class ProbeFamily(Protocol):
    """One config family of an adapter: its config, and its name in messages."""

    def config(self) -> SchedulerConfig: ...

    def __str__(self) -> str: ...


@dataclass(frozen=True)
class ProbePlan:
    """An adapter's install probe: build `build` for each of `families`' configs, with
    each of `cache_variables` (read where a per-user cache or config folder is chosen)
    pointed at an empty folder."""

    engine: str  # the engine's name in messages: "vLLM"
    build: EngineFactory
    built: str  # what `build` builds, plural, for the line that reports success
    families: tuple[ProbeFamily, ...]
    spans: str  # what the families span, for that line
    cache_variables: tuple[str, ...]
