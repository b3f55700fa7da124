"""The harness's record of which content each block's KV holds (CACHE-COMPUTED's oracle).

No engine reports what its attention kernels wrote, but the harness knows
which tokens each step computed into which blocks. Steps run in the order
they are scheduled, so once a step is scheduled, every later step finds the
KV of the known tokens it computes (async scheduling included, where the
step has not landed yet); drafts become known, and their blocks' KV
content certain, only when the step lands and accepts them. A block handed
out afresh is about to be overwritten, so its old content is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping

from schedspec.spec import BlockHash, RequestState, RequestStatus, SchedulerOutput, State
from schedspec.spec.invariants import ChainHashes, computed_before


class KVContentOracle:
    def __init__(self, hashes: ChainHashes) -> None:
        self.hashes = hashes
        self.block_size = hashes.block_size
        # Block -> the content hash whose KV steps scheduled so far compute into it.
        self.written: dict[int, BlockHash] = {}

    def on_schedule(self, pre: State, output: SchedulerOutput, mid: State) -> None:
        """After a schedule() that broke no invariant: forget the blocks about to be
        overwritten, then remember the full blocks of known tokens the step computes."""
        before = computed_before(output)
        bs = self.block_size
        for rid in output.num_scheduled_tokens:
            request = mid.requests[rid]
            table = request.block_ids
            old = pre.requests.get(rid)
            if old is not None and old.block_ids and old.block_ids == table[: len(old.block_ids)]:
                fresh = table[len(old.block_ids) :]
            else:
                fresh = table[before.get(rid, 0) // bs :]
            for block in fresh:
                self.written.pop(block, None)
        for rid in output.num_scheduled_tokens:
            request = mid.requests[rid]
            done = min(request.num_computed_tokens, request.num_tokens)
            self._remember(request, before.get(rid, 0) // bs, done // bs)

    def on_land(self, output: SchedulerOutput, arrivals: Mapping[str, int], post: State) -> None:
        """After a step's output landed: the blocks its accepted drafts filled, up to each
        request's confirmed computed tokens, hold KV for their content."""
        before = computed_before(output)
        bs = self.block_size
        for rid in output.num_scheduled_tokens:
            request = post.requests.get(rid)
            if request is None or request.arrival != arrivals.get(rid, request.arrival):
                continue  # finished, or the id now names another request
            if request.status is not RequestStatus.RUNNING or request.num_stale_output_tokens:
                continue  # preempted since the step was scheduled: its blocks are gone
            confirmed = request.num_computed_tokens - request.num_in_flight_tokens
            done = min(confirmed, request.num_tokens)
            self._remember(request, before.get(rid, 0) // bs, done // bs)

    def _remember(self, request: RequestState, first: int, end: int) -> None:
        own = self.hashes.of(request)
        table = request.block_ids
        for index in range(first, min(end, len(table), len(own))):
            self.written[table[index]] = own[index]
