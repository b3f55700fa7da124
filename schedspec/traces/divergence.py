"""What two engines may not disagree on in lockstep, and the record of the first disagreement.

Compared after every engine call: a schedule()'s decisions (tokens per
request in scheduling order, the total, drafts, preempted and finished ids,
which requests are new, resumed or running), the harness model's answer,
whether add_request accepted, and the abstract state seen through each
adapter. Block ids and the free-queue order are compared only on request:
two pools can make the same decisions with different block numbering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedspec.engines.events import Drain, Event
from schedspec.engines.recording import (
    Admission,
    ModelAnswer,
    Observation,
    Scheduled,
    Snapshot,
)
from schedspec.spec import RequestState, SchedulerOutput

# (field, how to read it), in the order a reader wants the first difference.
OUTPUT_FIELDS: tuple[tuple[str, Callable[[SchedulerOutput], object]], ...] = (
    # Pairs, not a dict: the scheduling order is part of the decision.
    ("num_scheduled_tokens", lambda o: tuple(o.num_scheduled_tokens.items())),
    ("total_num_scheduled_tokens", lambda o: o.total_num_scheduled_tokens),
    ("preempted_req_ids", lambda o: frozenset(o.preempted_req_ids)),
    ("finished_req_ids", lambda o: frozenset(o.finished_req_ids)),
    # An empty entry and a missing one say the same: no drafts verified.
    (
        "scheduled_spec_decode_tokens",
        lambda o: {r: tuple(d) for r, d in o.scheduled_spec_decode_tokens.items() if d},
    ),
    ("scheduled_new_reqs", lambda o: frozenset(n.request_id for n in o.scheduled_new_reqs)),
    (
        "resumed_reqs",
        lambda o: frozenset(c.request_id for c in o.scheduled_cached_reqs if c.resumed),
    ),
    (
        "running_reqs",
        lambda o: frozenset(c.request_id for c in o.scheduled_cached_reqs if not c.resumed),
    ),
)

REQUEST_FIELDS: tuple[tuple[str, Callable[[RequestState], object]], ...] = (
    ("status", lambda r: r.status),
    ("num_computed_tokens", lambda r: r.num_computed_tokens),
    ("output_token_ids", lambda r: r.output_token_ids),
    ("spec_token_ids", lambda r: r.spec_token_ids),
    ("num_blocks", lambda r: len(r.block_ids)),
    ("num_preemptions", lambda r: r.num_preemptions),
    # Where a Mamba-aligned split stops (0 but for hybrid configs with prefix caching).
    ("shared_prefix_boundary", lambda r: r.shared_prefix_boundary),
)
BLOCK_ID_FIELD: tuple[str, Callable[[RequestState], object]] = ("block_ids", lambda r: r.block_ids)


@dataclass(frozen=True)
class Divergence:
    """The first point where two engines disagree."""

    event_index: int  # -1: before any event (the engines' first snapshots)
    event: Event | None
    step: int  # which step of the event, from 0 (a drain makes many)
    observed: str  # what was compared: "schedule() output", "state after schedule", ...
    field: str
    left: object
    right: object
    request_id: str | None = None

    @property
    def path(self) -> str:
        return f"requests[{self.request_id!r}].{self.field}" if self.request_id else self.field

    @property
    def where(self) -> str:
        if self.event is None:
            return "at the start"
        text = f"after event {self.event_index} ({type(self.event).__name__})"
        return text + (f", step {self.step + 1} of it" if isinstance(self.event, Drain) else "")

    def render(self) -> str:
        return (
            f"{self.where}, {self.observed}: {self.path} differs: "
            f"left {show(self.left)}, right {show(self.right)}"
        )

    def __str__(self) -> str:
        return self.render()


class DivergenceError(AssertionError):
    """Two engines driven in lockstep disagreed; a finding, like a violation."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.render())
        self.divergence = divergence


def show(value: object) -> str:
    """A value as a reader wants it: sets sorted, enums by name."""
    if isinstance(value, frozenset | set):
        return "[" + ", ".join(repr(v) for v in sorted(value, key=lambda v: (len(str(v)), v))) + "]"
    name = getattr(value, "name", None)
    if isinstance(name, str) and not isinstance(value, str):
        return name
    if isinstance(value, tuple) and value and all(isinstance(p, tuple) for p in value):
        return " ".join(f"{p[0]}={p[1]}" for p in value if len(p) == 2) or repr(value)
    return repr(value)


# ------------------------------------------------------------- comparisons

Difference = tuple[str, str, object, object, str | None]  # observed, field, left, right, request


def first_difference(
    left: Observation, right: Observation, compare_block_ids: bool
) -> Difference | None:
    """Where two observations of the same call disagree, or None."""
    if isinstance(left, Scheduled) and isinstance(right, Scheduled):
        return _fields("schedule() output", OUTPUT_FIELDS, left.output, right.output)
    if isinstance(left, Snapshot) and isinstance(right, Snapshot):
        return _state_difference(left, right, compare_block_ids)
    if isinstance(left, ModelAnswer) and isinstance(right, ModelAnswer):
        lv = {r: tuple(t) for r, t in left.output.sampled_token_ids.items()}
        rv = {r: tuple(t) for r, t in right.output.sampled_token_ids.items()}
        return None if lv == rv else ("model output", "sampled_token_ids", lv, rv, None)
    if isinstance(left, Admission) and isinstance(right, Admission):
        if (left.refusal is None) == (right.refusal is None):
            return None
        return ("add_request", "accepted", _admitted(left), _admitted(right), left.request_id)
    return ("engine calls", "call", _call_name(left), _call_name(right), None)


def _admitted(admission: Admission) -> str:
    return "accepted" if admission.refusal is None else f"refused ({admission.refusal})"


def _call_name(observation: Observation) -> str:
    if isinstance(observation, Snapshot):
        return f"snapshot after {observation.after}"
    return type(observation).__name__


def _fields(
    observed: str,
    fields: tuple[tuple[str, Callable[[Any], object]], ...],
    left: object,
    right: object,
    request_id: str | None = None,
) -> Difference | None:
    for name, read in fields:
        lv, rv = read(left), read(right)
        if lv != rv:
            return observed, name, lv, rv, request_id
    return None


def _state_difference(
    left: Snapshot, right: Snapshot, compare_block_ids: bool
) -> Difference | None:
    observed = "first snapshot" if left.after == "start" else f"state after {left.after}"
    a, b = left.state, right.state
    if a.requests.keys() != b.requests.keys():
        return observed, "requests", frozenset(a.requests), frozenset(b.requests), None
    for name, lv, rv in (("running", a.running, b.running), ("waiting", a.waiting, b.waiting)):
        if lv != rv:
            return observed, name, lv, rv, None
    fields = (*REQUEST_FIELDS, BLOCK_ID_FIELD) if compare_block_ids else REQUEST_FIELDS
    for rid, request in a.requests.items():
        other = b.requests[rid]
        if request != other:  # the cheap test first: most requests agree on everything
            found = _fields(observed, fields, request, other, rid)
            if found is not None:
                return found
    free_a, free_b = a.kv.free_block_ids, b.kv.free_block_ids
    if len(free_a) != len(free_b):
        return observed, "num_free_blocks", len(free_a), len(free_b), None
    if compare_block_ids and free_a != free_b:
        return observed, "free_block_ids", free_a, free_b, None
    return None
