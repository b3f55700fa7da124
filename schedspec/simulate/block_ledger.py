"""KV usage read off the scheduler's outputs, so any engine's usage can be plotted.

The engine publishes every block it hands a request (NewRequestData.block_ids,
CachedRequestData.new_block_ids, a resumed request's whole new table) and
says when a request lets go of them (preempted_req_ids; a finish status in
its RequestOutput). Counting references per block id gives the blocks in use
without asking the engine for a snapshot every step. A block whose last
holder let go counts as free, as in the block pool, even if the prefix cache
keeps its content.
"""

from __future__ import annotations

from schedspec.spec import SchedulerOutput


class BlockLedger:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._tables: dict[str, list[int]] = {}
        self._refs: dict[int, int] = {}  # block id -> live tables holding it

    @property
    def used_blocks(self) -> int:
        return len(self._refs)

    @property
    def usage(self) -> float:
        """The share of blocks some live request holds (block_pool.get_usage())."""
        return len(self._refs) / self.num_blocks

    def apply(self, out: SchedulerOutput) -> None:
        """Take in one schedule()'s block decisions: preemptions free, schedules grow."""
        for rid in out.preempted_req_ids:
            self.release(rid)
        for new in out.scheduled_new_reqs:
            self.release(new.request_id)
            self._hold(new.request_id, new.block_ids)
        for cached in out.scheduled_cached_reqs:
            if cached.resumed:
                self.release(cached.request_id)
            self._hold(cached.request_id, cached.new_block_ids)

    def release(self, request_id: str) -> None:
        """The request finished or was preempted: its table goes."""
        for block in self._tables.pop(request_id, ()):
            left = self._refs[block] - 1
            if left:
                self._refs[block] = left
            else:
                del self._refs[block]

    def _hold(self, request_id: str, block_ids: tuple[int, ...]) -> None:
        self._tables.setdefault(request_id, []).extend(block_ids)
        for block in block_ids:
            self._refs[block] = self._refs.get(block, 0) + 1
