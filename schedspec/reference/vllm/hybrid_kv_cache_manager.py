"""The scheduler's KV cache manager for a hybrid config: the single group's interface
(kv_cache_manager.py) over HybridKVCacheCoordinator, so the Scheduler runs either the
same way (docs/SPEC.md, "Hybrid KV cache groups").

The scheduler sees flat block lists: a hit is every group's hit blocks in group order
(each group's share is fixed by the hit length: cdiv(hit, group block size) blocks),
and new blocks are the non-null ones in group order, as RequestState.block_ids lists a
hybrid request's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedspec.reference.sizing import cdiv
from schedspec.reference.vllm.free_block_queue import KVCacheBlock
from schedspec.reference.vllm.kv_cache_coordinator import GroupBlocks, HybridKVCacheCoordinator
from schedspec.reference.vllm.kv_cache_manager import (
    KVCacheManager,
    KVCacheManagerBase,
    admission_watermark,
)
from schedspec.spec import Request, SchedulerConfig


def make_kv_cache_manager(config: SchedulerConfig) -> KVCacheManager | HybridKVCacheManager:
    """The single group's manager for a config without kv_cache_groups, else the hybrid one."""
    return HybridKVCacheManager(config) if config.kv_cache_groups else KVCacheManager(config)


class HybridKVCacheManager(KVCacheManagerBase):
    def __init__(self, config: SchedulerConfig) -> None:
        self.coordinator = HybridKVCacheCoordinator(config)
        super().__init__(config, self.coordinator.block_pool)

    def hash_prompt(self, request: Request) -> None:
        """Hash a new request's full prompt blocks in every group, off the scheduling path."""
        if self.enable_caching:
            for gid in range(len(self.coordinator.managers)):
                self.coordinator.block_hashes(request, gid)

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The reconciled hit, as every group's hit blocks in group order. The lookup also
        records the request's shared-prefix junction, as vLLM's scheduler stores the
        manager's third answer on the request at every lookup: the longest single-group
        hit where the reconciled one is shorter, else 0 (an aligned Mamba group's split
        stops a chunk there, mamba_split.py). The single group's manager never sets it:
        vLLM's unitary coordinator answers 0."""
        hits, length, uncached = self.coordinator.get_computed_blocks(request)
        request.shared_prefix_boundary = length + uncached if uncached else 0
        return [block for group in hits for block in group], length

    def get_num_cached_tokens(self, request: Request) -> int:
        """How many tokens get_computed_blocks would hit now (a probe: nothing is touched)."""
        return self.coordinator.get_computed_blocks(request)[1]

    def _split_hits(self, blocks: Sequence[KVCacheBlock], num_hit_tokens: int) -> GroupBlocks:
        """get_computed_blocks' flat list back into its groups."""
        groups: list[list[KVCacheBlock]] = []
        start = 0
        for manager in self.coordinator.managers:
            end = start + cdiv(num_hit_tokens, manager.block_size)
            groups.append(list(blocks[start:end]))
            start = end
        assert start == len(blocks), "hit blocks do not match the hit length"
        return tuple(groups)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        has_running_requests: bool = False,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        reserved_blocks: int = 0,
    ) -> list[KVCacheBlock] | None:
        """The single group's allocate_slots over every group: the new non-null blocks in
        group order, or None and no allocation. The KV connector is refused with
        groups (config), so there are no external tokens nor reserved blocks."""
        if num_new_tokens <= 0 and num_new_computed_tokens <= 0:
            raise ValueError("allocate_slots needs new tokens or new computed tokens")
        assert num_external_computed_tokens == 0 and reserved_blocks == 0, "no KV connector"
        new_blocks = self.coordinator.allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=self._split_hits(new_computed_blocks, num_new_computed_tokens),
            num_lookahead_tokens=num_lookahead_tokens,
            num_in_flight_tokens=request.num_in_flight_tokens,
            full_sequence_must_fit=full_sequence_must_fit,
            watermark_blocks=admission_watermark(
                request, has_running_requests, self.watermark_blocks
            ),
            delay_cache_blocks=delay_cache_blocks,
        )
        if new_blocks is None:
            return None
        null = self.coordinator.null_block
        return [block for group in new_blocks for block in group if block is not null]

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_tokens)

    def uncache_uncomputed_blocks(self, request: Request) -> None:
        """Take back registrations past the request's computed tokens, in every group."""
        self.coordinator.uncache_blocks_past(request, request.num_computed_tokens)

    def free(self, request: Request) -> None:
        self.coordinator.free(request)

    def group_block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        """Each group's table (NULL_BLOCK_ID for the null block), in group order."""
        return self.coordinator.get_block_ids(request_id)

    def get_block_ids(self, request_id: str) -> tuple[int, ...]:
        """Every non-null block the request holds, group 0's first."""
        null = self.coordinator.null_block.block_id
        return tuple(b for table in self.group_block_ids(request_id) for b in table if b != null)

    def new_step_starts(self) -> None:
        """A schedule() begins: the Mamba states cached before it may be hit."""
        self.coordinator.new_step_starts()

    def end_step(self) -> None:
        """The Mamba state copies owed by this step go to the worker with its output; the
        reference runs no worker, so they are dropped once the step is scheduled."""
        self.coordinator.take_state_copies()
