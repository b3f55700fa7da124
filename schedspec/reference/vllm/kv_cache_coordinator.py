"""Several KV cache groups over one block pool: the reconciled prefix-cache hit, two-phase
allocation, window frees and what freeing a request releases (vLLM 0.34.0
v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator, and the parts of
v1/core/kv_cache_manager.py KVCacheManager.allocate_slots that call it). docs/SPEC.md,
"Hybrid KV cache groups", states each rule.

The scheduler reaches it through HybridKVCacheManager (hybrid_kv_cache_manager.py), which
gives it the single group's interface.
"""

from __future__ import annotations

from schedspec.reference.sizing import cdiv
from schedspec.reference.vllm.block_pool import BlockPool
from schedspec.reference.vllm.free_block_queue import KVCacheBlock
from schedspec.reference.vllm.mamba_manager import MambaManager
from schedspec.reference.vllm.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
    make_null_block,
)
from schedspec.spec import (
    BlockHash,
    Request,
    SchedulerConfig,
    extend_block_hashes,
)
from schedspec.spec.kv_groups import (
    ChunkedLocalGroup,
    FullAttentionGroup,
    KVCacheGroupSpec,
    MambaGroup,
    SlidingWindowGroup,
    admission_cap_blocks,
    group_block_hash,
    max_in_flight_tokens,
)

GroupBlocks = tuple[list[KVCacheBlock], ...]  # one list per group, in group order

_MANAGERS: dict[type[KVCacheGroupSpec], type[SingleTypeKVCacheManager]] = {
    FullAttentionGroup: FullAttentionManager,
    SlidingWindowGroup: SlidingWindowManager,
    ChunkedLocalGroup: ChunkedLocalAttentionManager,
    MambaGroup: MambaManager,
}


class HybridKVCacheCoordinator:
    def __init__(self, config: SchedulerConfig) -> None:
        if not config.kv_cache_groups:
            raise ValueError("a hybrid coordinator needs kv_cache_groups")
        self.scheduler_block_size = config.block_size
        self.max_model_len = config.max_model_len
        self.enable_caching = config.enable_prefix_caching
        self.block_pool = BlockPool(config.num_blocks, config.enable_prefix_caching)
        self.null_block = make_null_block()
        self.managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            _MANAGERS[type(spec)](
                spec,
                self.block_pool,
                self.null_block,
                config.enable_prefix_caching,
                # Partial hits finer than a scheduler block are not modelled.
                config.block_size,
            )
            for spec in config.kv_cache_groups
        )
        # Per group, the most blocks the full-sequence admission gate counts: a window or
        # chunked-local group frees as the request runs (None: every block is held).
        in_flight = max_in_flight_tokens(config.max_num_batched_tokens, config.async_scheduling)
        self._admission_caps = tuple(
            admission_cap_blocks(spec, in_flight, config.max_model_len)
            for spec in config.kv_cache_groups
        )
        # Full attention looks up first: its hit only shrinks (a prefix of a hit is a
        # hit), so it bounds the others' searches from the start.
        self._lookup_order = sorted(
            range(len(self.managers)),
            key=lambda i: not isinstance(self.managers[i], FullAttentionManager),
        )
        # Per request and group: the chained hashes of its full blocks at the group's
        # block size, tagged with the group; kept across preemption, dropped at the end.
        self._block_hashes: dict[str, list[list[BlockHash]]] = {}
        self._untagged: dict[str, list[list[BlockHash]]] = {}

    def block_hashes(self, request: Request, group_id: int) -> list[BlockHash]:
        rid = request.request_id
        n = len(self.managers)
        chain = self._untagged.setdefault(rid, [[] for _ in range(n)])[group_id]
        tagged = self._block_hashes.setdefault(rid, [[] for _ in range(n)])[group_id]
        size = self.managers[group_id].block_size
        extend_block_hashes(chain, request.all_token_ids, size)
        tagged.extend(group_block_hash(h, group_id) for h in chain[len(tagged) :])
        return tagged

    def find_longest_cache_hit(
        self, request: Request, max_cache_hit_length: int
    ) -> tuple[GroupBlocks, int, int]:
        """Every group's hit blocks, the reconciled hit length, and the uncached common
        prefix (vLLM's num_uncached_common_prefix_tokens): how far the longest hit one
        group alone had runs past the reconciled one.

        The reconciled hit is the longest length no group refuses, found as a fixed
        point. Each group in turn either accepts the current length or cuts it to its
        own hit; after any cut, every group is asked again. The length only shrinks, so
        it ends, and no group's hit is shorter. Each lookup is bounded by the length
        before it, so the longest single-group hit is the first group's (full attention
        when there is one)."""
        hits: list[list[KVCacheBlock] | None] = [None] * len(self.managers)
        hit_length = max_cache_hit_length
        longest = 0
        while True:
            length = hit_length
            for gid in self._lookup_order:
                manager = self.managers[gid]
                found = hits[gid]
                if isinstance(manager, FullAttentionManager) and found is not None:
                    # One lookup serves: a shorter length's hit is a prefix of it.
                    length = min(length, len(found) * manager.block_size)
                    continue
                found = manager.find_longest_cache_hit(self.block_hashes(request, gid), length)
                hits[gid] = found
                length = len(found) * manager.block_size
                longest = max(longest, length)
            if length >= hit_length:
                break
            hit_length = length
        for gid, manager in enumerate(self.managers):
            found = hits[gid]
            assert found is not None
            del found[cdiv(hit_length, manager.block_size) :]
        return tuple(h or [] for h in hits), hit_length, longest - hit_length

    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int, int]:
        """The reconciled hit, never covering the last token (its logits are the step's),
        and the uncached common prefix past it (find_longest_cache_hit)."""
        if not self.enable_caching:
            return tuple([] for _ in self.managers), 0, 0
        return self.find_longest_cache_hit(request, request.num_tokens - 1)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: GroupBlocks,
        total_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Free-pool blocks an allocation consumes over all groups: one pool, one sum.

        The full-sequence admission gate (apply_admission_cap) counts a window or
        chunked-local group at no more than its admission cap (`admission_cap_blocks`):
        windows free as the request runs, so that is the most it ever holds (vLLM's
        `apply_admission_cap`; cdiv(num_tokens, block_size) capped, as here by capping
        num_tokens at cap * block_size). A step's own allocation counts every block."""
        total = 0
        for gid, manager in enumerate(self.managers):
            tokens = num_tokens
            cap = self._admission_caps[gid]
            if apply_admission_cap and cap is not None:
                tokens = min(num_tokens, cap * manager.block_size)
            total += manager.get_num_blocks_to_allocate(
                request_id,
                tokens,
                new_computed_blocks[gid],
                total_computed_tokens,
                num_tokens_main_model,
            )
        return total

    def allocate_new_computed_blocks(
        self, request_id: str, new_computed_blocks: GroupBlocks, num_computed_tokens: int
    ) -> None:
        """Phase one: every group takes (touches) its hit blocks before any group takes a
        new block, so no group's allocation evicts another group's hit still sitting
        free in the queue (vLLM #33775). An allocated request gets no new hits."""
        if any(request_id in m.num_cached_block for m in self.managers):
            assert not any(new_computed_blocks), f"{request_id} is allocated: no new hits"
            return
        for gid, manager in enumerate(self.managers):
            manager.add_local_computed_blocks(
                request_id, new_computed_blocks[gid], num_computed_tokens
            )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> GroupBlocks:
        """Phase two: each group's fresh blocks for the new slots."""
        return tuple(
            m.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
            for m in self.managers
        )

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        for manager in self.managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register each group's full blocks up to the last scheduler-block boundary: a
        hit ends on one, so a block past it could never be reached."""
        aligned = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        for gid, manager in enumerate(self.managers):
            manager.cache_blocks(request.request_id, self.block_hashes(request, gid), aligned)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: GroupBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_in_flight_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        watermark_blocks: int = 0,
        delay_cache_blocks: bool = False,
    ) -> GroupBlocks | None:
        """Slots for the request's new tokens in every group, or None and no change
        (window frees aside: they release blocks nobody reads any more).

        An admission (full_sequence_must_fit) must first fit its whole known sequence,
        counted before this step's window frees and with window and chunked-local groups
        at their admission cap, as vLLM 0.33.0 and 0.34.0 count it. Then window frees come
        (they may make the room), on processed tokens only; then the sum over groups is
        checked against the free blocks less the watermark, so the allocation is all
        or nothing across groups; then the two phases.
        """
        rid = request.request_id
        hits = new_computed_blocks or tuple([] for _ in self.managers)
        total_computed = min(
            request.num_computed_tokens + num_new_computed_tokens, self.max_model_len
        )
        free = self.block_pool.get_num_free_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            needed = self.get_num_blocks_to_allocate(
                rid, full, hits, total_computed, full, apply_admission_cap=True
            )
            if needed + watermark_blocks > free():
                return None
        num_main = total_computed + num_new_tokens
        num_slots = min(num_main + num_lookahead_tokens, self.max_model_len)
        self.remove_skipped_blocks(rid, max(0, total_computed - num_in_flight_tokens))
        needed = self.get_num_blocks_to_allocate(rid, num_slots, hits, total_computed, num_main)
        if needed + watermark_blocks > free():
            return None
        self.allocate_new_computed_blocks(rid, hits, total_computed)
        new_blocks = self.allocate_new_blocks(rid, num_slots, num_main)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(num_main, request.num_tokens))
        return new_blocks

    def uncache_blocks_past(self, request: Request, num_tokens: int) -> None:
        """Take back every group's prefix-cache registrations past num_tokens tokens."""
        for manager in self.managers:
            manager.uncache_blocks_past(request.request_id, num_tokens)

    def free(self, request: Request) -> None:
        """Preemption and finishing alike release every group's blocks (nulls are no
        one's); a finished request's hashes go too, a preempted one keeps them."""
        for manager in self.managers:
            manager.free(request.request_id)
        if request.is_finished:
            self._block_hashes.pop(request.request_id, None)
            self._untagged.pop(request.request_id, None)

    def new_step_starts(self) -> None:
        """A schedule() begins (vLLM's KVCacheCoordinator.new_step_starts)."""
        for manager in self.managers:
            if isinstance(manager, MambaManager):
                manager.new_step_starts()

    def take_state_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """Every Mamba group's (source, destination) state copies owed since the last call."""
        return [
            copy
            for manager in self.managers
            if isinstance(manager, MambaManager)
            for copy in manager.take_state_copies()
        ]

    def get_block_ids(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        return tuple(m.get_block_ids(request_id) for m in self.managers)
