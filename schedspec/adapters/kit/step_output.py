"""A step as the spec's SchedulerOutput, derived from what the engine scheduled and the
states around the call.

An engine tells its model runner a batch (the requests and how many tokens each runs),
rarely the diff the spec's SchedulerOutput describes. Everything else that output says
follows from the adapter's own snapshots before and after schedule(): a request
scheduled while WAITING is new (its prompt, whole block table and prefix-cache hit);
one scheduled while PREEMPTED is resumed (its whole table, its hit, its kept outputs);
a RUNNING one gets the blocks its table grew by. A request RUNNING before and
PREEMPTED after was preempted by the call. The requests that finished since the
previous schedule() are the adapter's to collect (FinishedSince).
"""

from __future__ import annotations

from collections.abc import Iterable

from schedspec.adapters.kit.pipeline import ScheduledRow
from schedspec.spec import (
    CachedRequestData,
    NewRequestData,
    RequestStatus,
    SchedulerOutput,
    State,
)


def step_output(
    rows: tuple[ScheduledRow, ...],
    pre: State,
    post: State,
    finished: frozenset[str],
) -> SchedulerOutput:
    """The spec's SchedulerOutput of one schedule() call: `rows` is what it scheduled, in
    scheduling order, `pre` and `post` the states around it, `finished` the requests that
    finished since the previous call."""
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


class FinishedSince:
    """The requests that left the state (finished or aborted) since the last schedule():
    noted around every call that may finish one, taken by the next schedule()."""

    def __init__(self) -> None:
        self._finished: set[str] = set()

    def note(self, pre: State, post: State) -> None:
        """Requests live before a call and gone after it finished during it."""
        self._finished.update(rid for rid in pre.requests if rid not in post.requests)

    def add(self, request_ids: Iterable[str]) -> None:
        self._finished.update(request_ids)

    def take(self) -> frozenset[str]:
        """The requests noted so far, forgotten here: the next call reports the next ones."""
        taken = frozenset(self._finished)
        self._finished.clear()
        return taken
