"""The inputs of the invariant predicates: one state, or one transition between two."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from schedspec.spec.block_hash import BlockHash, extend_block_hashes
from schedspec.spec.outputs import ModelRunnerOutput, RequestOutput, SchedulerOutput
from schedspec.spec.request import Request
from schedspec.spec.state import RequestState, State


class ChainHashes:
    """The chained block hashes of each request's own tokens, grown as tokens arrive.

    Content checks compare an engine's cached blocks against these. One
    instance serves one run: a request's tokens only ever grow.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._hashes: dict[tuple[str, int], list[BlockHash]] = {}

    def of(self, request: RequestState) -> list[BlockHash]:
        hashes = self._hashes.setdefault((request.request_id, request.arrival), [])
        if len(hashes) < request.num_tokens // self.block_size:
            tokens = request.prompt_token_ids + request.output_token_ids
            extend_block_hashes(hashes, tokens, self.block_size)
        return hashes


class PassedOver(NamedTuple):
    """A waiting head that schedule() calls passed over while nothing ran (PROGRESS): which
    request (its id and incarnation), and how many calls did."""

    request_id: str
    arrival: int
    times: int


@dataclass(frozen=True)
class Departure:
    """A request that left while in the running list."""

    request: RequestState  # as it was just before it left
    in_last_step: bool  # scheduled by the latest schedule() before it left


class Departures:
    """What a harness records between two schedule() calls for the next transition:
    the requests that finished, and of them those that were running."""

    def __init__(self) -> None:
        self.finished: set[str] = set()
        self.left_running: dict[str, Departure] = {}
        # Live ids named by an abort (finish_requests), whether or not they left.
        self.aborted: set[str] = set()
        # The ids the latest schedule() scheduled.
        self.last_step: frozenset[str] = frozenset()

    def on_schedule(self, pre: State, output: SchedulerOutput, post: State) -> None:
        """A schedule() returned: start over, counting what left inside it (a pending
        abort that ends in schedule(), SGLang's chunked request) for the next one."""
        self.clear()
        self.note(pre, post)
        self.last_step = frozenset(output.num_scheduled_tokens)

    def note(self, pre: State, post: State) -> None:
        """Record every request of pre that post no longer holds."""
        running = set(pre.running)
        for rid, request in pre.requests.items():
            if rid not in post.requests:
                self.finished.add(rid)
                if rid in running:
                    self.left_running[rid] = Departure(request, rid in self.last_step)

    def note_abort(self, pre: State, post: State, request_ids: Iterable[str]) -> None:
        """Record an abort of request_ids between pre and post."""
        self.note(pre, post)
        self.aborted.update(r for r in request_ids if r in pre.requests)

    def clear(self) -> None:
        self.finished.clear()
        self.left_running.clear()
        self.aborted.clear()


@dataclass(frozen=True)
class ScheduleTransition:
    """pre --schedule()--> post, with the SchedulerOutput it returned."""

    pre: State
    output: SchedulerOutput
    post: State
    hashes: ChainHashes
    # Ids the harness saw finish (stop or abort) since the previous schedule().
    finished_since_last_schedule: frozenset[str] = frozenset()
    # Block -> the content hash whose KV earlier steps fully computed into it.
    kv_written: Mapping[int, BlockHash] = field(default_factory=dict)
    # Of the finished ones, those that were in the running list when they finished, as
    # they were just before (SGLang's admission latch reopens when one leaves its batch).
    left_running: Mapping[str, Departure] = field(default_factory=dict)
    # The ids the previous schedule() scheduled (SGLang's last batch).
    previous_step: frozenset[str] = frozenset()
    # The history PROGRESS judges the step against, summed up by the harness
    # (liveness.passed_over_after): the head earlier schedule() calls passed over while
    # nothing ran; None: none is remembered.
    head_passed_over: PassedOver | None = None
    # Ids named by finish_requests since the previous schedule() that were live when
    # named (an abort the engine may defer to this step: SGLang's chunked request).
    aborted_since_last_schedule: frozenset[str] = frozenset()

    # Worked out once, as the transition is made, for all the predicates that read
    # them (a cached_property costs a lock on each first read on Python 3.11).
    # num_computed_tokens of each scheduled request before the step, from the output.
    computed_before: Mapping[str, int] = field(init=False, repr=False, compare=False)
    # The requests this step took from the waiting queue: the new ones, then the
    # resumed ones; and the same as a set.
    admitted: tuple[str, ...] = field(init=False, repr=False, compare=False)
    admitted_ids: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        output = self.output
        resumed = [d.request_id for d in output.scheduled_cached_reqs if d.resumed]
        admitted = (*[d.request_id for d in output.scheduled_new_reqs], *resumed)
        object.__setattr__(self, "computed_before", computed_before(output))
        object.__setattr__(self, "admitted", admitted)
        object.__setattr__(self, "admitted_ids", frozenset(admitted))


@dataclass(frozen=True)
class UpdateTransition:
    """pre --update_from_output(output, model_output)--> post."""

    pre: State
    output: SchedulerOutput
    model_output: ModelRunnerOutput
    post: State
    # What the engine reported per sampling request (None: it reports nothing).
    request_outputs: Mapping[str, RequestOutput] | None = None
    # Which incarnation (arrival index) of each id the step was scheduled for: an
    # id can be aborted and reused while the step is in flight.
    scheduled_arrivals: Mapping[str, int] = field(default_factory=dict)
    # Per request that sampled: the position (token index) of its first sampled
    # token, as the model runner saw it when it ran the step.
    sampled_at: Mapping[str, int] = field(default_factory=dict)
    # The run's chained hashes of each request's own tokens (None: the caller keeps
    # none, and the completeness of registrations goes unchecked).
    hashes: ChainHashes | None = None

    def scheduled_for(self, request: RequestState) -> bool:
        """Was this step scheduled for this very request (not for an earlier, aborted
        request with the same id)? Unknown incarnations count as this one."""
        if request.request_id not in self.output.num_scheduled_tokens:
            return False
        arrival = self.scheduled_arrivals.get(request.request_id)
        return arrival is None or arrival == request.arrival

    def is_stale(self, request: RequestState) -> bool:
        """Is this step's output for the request stale (scheduled before its preemption)?"""
        return self.scheduled_for(request) and request.num_stale_output_tokens > 0


@dataclass(frozen=True)
class AddTransition:
    """pre --add_request(request)--> post; `refusal` is the error the engine raised, if any."""

    pre: State
    request: Request
    refusal: Exception | None
    post: State


@dataclass(frozen=True)
class DraftsTransition:
    """pre --update_draft_token_ids(proposed)--> post: the drafter's proposal, per
    request id, as the harness offered it."""

    pre: State
    proposed: Mapping[str, tuple[int, ...]]
    post: State


@dataclass(frozen=True)
class AbortTransition:
    """pre --finish_requests(request_ids)--> post."""

    pre: State
    request_ids: tuple[str, ...]
    post: State


@dataclass(frozen=True)
class DrainResult:
    """The end of a drain: steps taken with no arrivals, and the final state."""

    initial: State  # when the drain started
    final: State
    num_steps: int
    step_bound: int = field(default=0)
    # Finished requests whose sends the worker never reports (RemoteKV
    # send_never_finishes): their blocks stay held by the connector, and rightly.
    unreported_sends: frozenset[str] = frozenset()


def computed_before(output: SchedulerOutput) -> Mapping[str, int]:
    """num_computed_tokens of each scheduled request before the step, from the output."""
    before = {d.request_id: d.num_computed_tokens for d in output.scheduled_new_reqs}
    for cached in output.scheduled_cached_reqs:
        before[cached.request_id] = cached.num_computed_tokens
    return before
