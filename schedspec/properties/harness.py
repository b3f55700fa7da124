"""What the state machine, the minimizer and trace replay drive: a target.

A target builds, for each example, a harness that applies events and
raises on a finding: CheckedEngine for one engine (InvariantViolationError),
the lockstep pair of the differential runner (that, or DivergenceError).
Both go through the same state machine, suite runner and minimizer, so a
divergence is found, shrunk and written as a trace exactly like a violation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from schedspec.engines.capabilities import Capability
from schedspec.engines.events import Event
from schedspec.engines.profiles import probe_capabilities
from schedspec.engines.protocol import EngineFactory
from schedspec.properties.checked_engine import CheckedEngine, CheckStats
from schedspec.spec import SchedulerConfig, State
from schedspec.spec.invariants import Profile, family_of
from schedspec.traces.trace import ModelParams, Trace


class Harness(Protocol):
    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def state(self) -> State:
        """The abstract state the rules draw from (the left engine's, in lockstep)."""

    def apply(self, event: Event) -> None:
        """Apply one event; raise an AssertionError subclass on a finding."""

    def trace(self, note: str = "") -> Trace:
        """The events applied so far (the failing one included)."""


class Target(Protocol):
    @property
    def profile(self) -> Profile: ...

    def capabilities(self) -> frozenset[Capability]:
        """What its engines all have (each built once to read it: engines/profiles.py)."""

    def start(self, config: SchedulerConfig, model: ModelParams, stats: CheckStats) -> Harness:
        """A fresh harness for one example (or one replay)."""


@dataclass(frozen=True)
class SingleEngine:
    """The invariant suite's target: one engine, checked against a profile."""

    factory: EngineFactory
    profile: Profile

    def capabilities(self) -> frozenset[Capability]:
        return probe_capabilities([self.factory], family_of(self.profile) or "vllm")

    def start(self, config: SchedulerConfig, model: ModelParams, stats: CheckStats) -> Harness:
        return CheckedEngine.from_factory(self.factory, config, self.profile, model, stats)


def replay_target(target: Target, trace: Trace) -> Harness:
    """Re-run a trace on a target; raises at the first finding, as the harness does."""
    harness = target.start(trace.config, trace.model, CheckStats())
    for event in trace.events:
        harness.apply(event)
    return harness
