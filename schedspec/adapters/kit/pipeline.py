"""What each live request has in flight, counted by the adapter from the steps it scheduled
and landed (docs/SPEC.md, "Async scheduling").

Most engines keep no such counters: they are the spec's words for "this step's tokens are
scheduled and their output has not landed". A step's tokens are in flight from
schedule() until update_from_output() lands that step; under async scheduling a
sampling step also leaves one output placeholder until it lands; a request preempted
(or retracted) with a step in flight has that step's output stale, delivered or
dropped as the engine does. `is_prefill_chunk` is whether the last step scheduled for
it stopped short of its known tokens (so it samples nothing).

A synchronous engine's adapter needs only on_schedule, on_land and forget: between
steps everything is 0, and inside one step the tokens scheduled are in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScheduledRow:
    """One request of a step as the engine scheduled it: its spec id, the tokens it runs,
    its computed count before the step, and whether the step samples a token (it is no
    prefill chunk that stops short of the request's known tokens)."""

    request_id: str
    num_tokens: int
    computed_before: int
    samples: bool


@dataclass
class InFlight:
    """What is in flight for one request."""

    tokens: int = 0
    placeholders: int = 0
    stale: int = 0
    drop_stale: bool = False
    prefill_chunk: bool = False


_IDLE = InFlight()  # nothing in flight: what `of` gives a request without counters


@dataclass
class Pipeline:
    """The in-flight counters of every live request (by the engine's own request key),
    kept from the steps scheduled and landed. Steps land in the order they were
    scheduled (every engine's loop does)."""

    async_scheduling: bool
    _counters: dict[str, InFlight] = field(default_factory=dict)

    def of(self, key: str) -> InFlight:
        """The request's counters (read them; the shared idle ones where it has none)."""
        return self._counters.get(key) or _IDLE

    def on_schedule(self, rows: Mapping[str, ScheduledRow]) -> None:
        """A step put in flight: its rows by request key."""
        for key, row in rows.items():
            counters = self._counters.setdefault(key, InFlight())
            counters.tokens += row.num_tokens
            counters.prefill_chunk = not row.samples
            if self.async_scheduling and row.samples:
                counters.placeholders += 1

    def on_preempt(self, key: str, drop_stale: bool) -> None:
        """The engine preempted the request: what it has in flight is stale, dropped when
        it lands if `drop_stale` (SGLang's retraction), else delivered."""
        counters = self._counters.setdefault(key, InFlight())
        counters.stale = counters.tokens
        counters.drop_stale = drop_stale and counters.tokens > 0
        counters.placeholders = 0
        counters.prefill_chunk = False

    def on_land(self, rows: Mapping[str, ScheduledRow]) -> None:
        """A step's output processed: its rows by request key."""
        for key, row in rows.items():
            counters = self._counters.get(key)
            if counters is None:
                continue
            counters.tokens -= row.num_tokens
            if counters.stale:
                counters.stale -= row.num_tokens
                counters.drop_stale = counters.drop_stale and counters.stale > 0
            elif self.async_scheduling and row.samples:
                counters.placeholders -= 1

    def forget(self, key: str) -> None:
        """A request that finished or was aborted."""
        self._counters.pop(key, None)
