"""Snapshot records of a scheduler's requests, shared with the last snapshot where unchanged.

A checked step snapshots the engine about twice, and most live requests (the waiting
ones, about three in four in the suite) have not changed since the last snapshot. A
record here is rebuilt only when something it is built from differs from what the
last one was built from: every field RequestState.of reads, compared by value, so a
reused record is equal to the one a rebuild would give. Reuse also lets the checks'
fast paths tell an unchanged record by its identity (state_fast_path.StateFastPath).
"""

from __future__ import annotations

from operator import attrgetter

from schedspec.spec.request import Request
from schedspec.spec.state import RequestState

# Every Request attribute RequestState.of copies as it is (the two lists are copied
# into tuples beside these), read in one C call.
COPIED_AS_IS = (
    "request_id",
    "priority",
    "arrival",
    "prompt_token_ids",
    "num_computed_tokens",
    "status",
    "num_preemptions",
    "max_tokens",
    "eos_token_id",
    "stop_token_ids",
    "num_in_flight_tokens",
    "num_output_placeholders",
    "num_stale_output_tokens",
    "drop_stale_output",
    "abort_pending",
    "is_prefill_chunk",
    "remote_kv",
    "shared_prefix_boundary",
)
# The fields a record takes from elsewhere: the two lists, copied, and the block tables.
COPIED_OR_GIVEN = ("output_token_ids", "spec_token_ids", "block_ids", "group_block_ids")
_COPIED_AS_IS = attrgetter(*COPIED_AS_IS)

# What one record was built from: the attributes above, the outputs, the drafts, the
# block table and the group tables.
_Source = tuple[
    tuple[object, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[tuple[int, ...], ...],
]


class RequestRecords:
    """The last snapshot's record of each live request, and what each was built from."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[_Source, RequestState]] = {}
        self._next: dict[str, tuple[_Source, RequestState]] = {}

    def record(
        self,
        request: Request,
        block_ids: tuple[int, ...],
        group_block_ids: tuple[tuple[int, ...], ...] = (),
    ) -> RequestState:
        """RequestState.of(request, block_ids, group_block_ids), the last snapshot's own
        record where that is equal to it. Call once per live request, then done()."""
        source = (
            _COPIED_AS_IS(request),
            tuple(request.output_token_ids),
            tuple(request.spec_token_ids),
            block_ids,
            group_block_ids,
        )
        rid = request.request_id
        last = self._last.get(rid)
        if last is not None and last[0] == source:
            state = last[1]
        else:
            state = RequestState.of(request, block_ids, group_block_ids)
        self._next[rid] = (source, state)
        return state

    def done(self) -> None:
        """The snapshot is complete: its records are the ones the next compares with
        (a request that left is forgotten)."""
        self._last = self._next
        self._next = {}
