"""An SGLang batch as the spec's SchedulerOutput, and what each step leaves in flight.

Nothing here imports SGLang: the functions read SGLang's objects (typed Any) that the
adapter (adapters/sglang/engine.py) hands them.

SGLang tells its model runner a batch (ScheduleBatch: the requests, their req_to_token
rows, extend lengths), not a diff of what changed. The spec's SchedulerOutput is built
from it and from the states before and after schedule() (the adapter's snapshots of
SGLang's own state): a request scheduled while WAITING is new (its prompt, whole table
and prefix-cache hit); one scheduled while PREEMPTED (retracted) is resumed (its whole
table, its hit, its kept outputs); a RUNNING one (a chunk after the first, or a decode)
gets the blocks its table grew by. num_scheduled_tokens is the batch's extend length per
request (1 for a decode row), in batch order; a row's computed count before the step is
SGLang's prefix length for an extend or mixed row, and its allocated length before the
step for a decode row.

What is in flight is the adapter's to count (SGLang keeps no such counters): a step's
tokens are in flight from schedule() until its result is processed. Under the overlap
scheduler (async_scheduling) a sampling step also leaves one output placeholder (the
token SGLang relays through its future map), and a request retracted while a step of
its own is in flight has that step's output dropped when it lands
(process_batch_result skips a retracted request): stale, and dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from schedspec.spec import (
    CachedRequestData,
    NewRequestData,
    RequestStatus,
    SchedulerOutput,
    State,
)


@dataclass(frozen=True)
class BatchRow:
    """One request of an SGLang batch: its spec id, the tokens it runs, its computed count
    before the step, and whether its step samples a token (not a non-final chunk)."""

    request_id: str
    num_tokens: int
    computed_before: int
    samples: bool


def spec_output(
    rows: tuple[BatchRow, ...],
    pre: State,
    post: State,
    finished: frozenset[str],
) -> SchedulerOutput:
    """The spec's SchedulerOutput of one schedule() call: `rows` is the batch it formed,
    `pre` and `post` the states around it, `finished` the requests that finished since
    the previous call. Preempted: RUNNING before, PREEMPTED after (SGLang's retraction)."""
    new: list[NewRequestData] = []
    cached: list[CachedRequestData] = []
    for row in rows:
        before = pre.requests[row.request_id]
        after = post.requests[row.request_id]
        if before.status is RequestStatus.WAITING:
            new.append(
                NewRequestData(
                    row.request_id, after.prompt_token_ids, after.block_ids, row.computed_before
                )
            )
        elif before.status is RequestStatus.PREEMPTED:
            cached.append(
                CachedRequestData(
                    row.request_id,
                    True,
                    after.block_ids,
                    row.computed_before,
                    len(after.output_token_ids),
                )
            )
        else:
            cached.append(
                CachedRequestData(
                    row.request_id,
                    False,
                    after.block_ids[len(before.block_ids) :],
                    row.computed_before,
                    len(before.output_token_ids) + before.num_output_placeholders,
                )
            )
    scheduled = {row.request_id: row.num_tokens for row in rows}
    preempted = frozenset(
        rid
        for rid, request in post.requests.items()
        if request.status is RequestStatus.PREEMPTED
        and rid in pre.requests
        and pre.requests[rid].status is RequestStatus.RUNNING
    )
    return SchedulerOutput(
        scheduled_new_reqs=tuple(new),
        scheduled_cached_reqs=tuple(cached),
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={},
        preempted_req_ids=preempted,
        finished_req_ids=finished,
    )


@dataclass
class InFlight:
    """What is in flight for one request (docs/SPEC.md, "Async scheduling")."""

    tokens: int = 0
    placeholders: int = 0
    stale: int = 0
    drop_stale: bool = False
    prefill_chunk: bool = False


@dataclass
class Pipeline:
    """The in-flight counters of every live request (by SGLang rid), kept from the steps
    scheduled and landed."""

    async_scheduling: bool
    _counters: dict[str, InFlight] = field(default_factory=dict)

    def of(self, rid: str) -> InFlight:
        return self._counters.get(rid) or InFlight()

    def on_schedule(self, rows: Mapping[str, BatchRow]) -> None:
        """A step put in flight: rows by SGLang rid."""
        for rid, row in rows.items():
            counters = self._counters.setdefault(rid, InFlight())
            counters.tokens += row.num_tokens
            counters.prefill_chunk = not row.samples
            if self.async_scheduling and row.samples:
                counters.placeholders += 1

    def on_retract(self, rid: str) -> None:
        """SGLang retracted the request: what it has in flight is stale and will be dropped."""
        counters = self._counters.setdefault(rid, InFlight())
        counters.stale = counters.tokens
        counters.drop_stale = counters.tokens > 0
        counters.placeholders = 0
        counters.prefill_chunk = False

    def on_land(self, rows: Mapping[str, BatchRow]) -> None:
        """A step's output processed (steps land in the order they were scheduled)."""
        for rid, row in rows.items():
            counters = self._counters.get(rid)
            if counters is None:
                continue
            counters.tokens -= row.num_tokens
            if counters.stale:
                counters.stale -= row.num_tokens
                counters.drop_stale = counters.stale > 0
            elif self.async_scheduling and row.samples:
                counters.placeholders -= 1

    def forget(self, rid: str) -> None:
        """A request that finished or was aborted."""
        self._counters.pop(rid, None)
