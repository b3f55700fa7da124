"""The block pool: ref counts, the free queue and the prefix-cache map."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from operator import attrgetter

from schedspec.reference.vllm.free_block_queue import FreeBlockQueue, KVCacheBlock
from schedspec.spec import BlockHash, KVState

# Field readers for snapshot(): map() over them walks the blocks in C, and a snapshot is
# taken twice a checked step.
_REF_CNT = attrgetter("ref_cnt")
_BLOCK_HASH = attrgetter("block_hash")


class BlockPool:
    """All KV blocks of one cache; block ids are 0..num_blocks-1, all usable."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeBlockQueue(self.blocks)
        # hash -> {block_id: block}, in insertion order. A fully cached prompt
        # recomputes its last block into a fresh block with the same hash, so
        # one hash can name several blocks; lookups take the oldest.
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        self._last_snapshot: KVState | None = None

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / self.num_blocks

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take n blocks from the front of the free queue, evicting their cached content."""
        blocks = self.free_block_queue.popleft_n(n)
        for block in blocks:
            if block.block_hash is not None:
                self.uncache_block(block)
            block.ref_cnt = 1
        return blocks

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Drop the block from the prefix cache (its id only, under its hash)."""
        assert block.block_hash is not None
        holders = self.cached_block_hash_to_block[block.block_hash]
        del holders[block.block_id]
        if not holders:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        holders = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(holders.values())) if holders else None

    def longest_cached_prefix(
        self, block_hashes: Iterable[BlockHash], max_blocks: int
    ) -> list[KVCacheBlock]:
        """The cached blocks of the longest run of hashes from the first, at most max_blocks:
        hashes are chained, so nothing after a miss can hit."""
        hits: list[KVCacheBlock] = []
        for block_hash in islice(block_hashes, max_blocks):
            block = self.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits, pulling free ones out of the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[BlockHash],
        num_cached: int,
        num_full: int,
    ) -> None:
        """Register blocks[num_cached:num_full] (all full) in the prefix cache."""
        for i in range(num_cached, num_full):
            block = blocks[i]
            assert block.block_hash is None, f"block {block.block_id} is already cached"
            block.block_hash = block_hashes[i]
            self.cached_block_hash_to_block.setdefault(block_hashes[i], {})[block.block_id] = block

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block, in eviction order (first evicted first).

        A block nobody holds goes to the front of the free queue if it has no
        cached content (reuse it first) or to the back if it has (keep it for
        hits as long as possible: LRU).
        """
        evict_first: list[KVCacheBlock] = []
        evict_last: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed more often than held"
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    evict_first.append(block)
                else:
                    evict_last.append(block)
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def snapshot(self) -> KVState:
        """The pool's KVState. Most steps leave the pool as it was: where every part
        equals the last snapshot's, that very KVState is returned again, so that the
        checks' fast paths can tell an unchanged pool by its identity."""
        cached = self.cached_block_hash_to_block
        free = self.free_block_queue.block_ids()
        ref_counts = tuple(map(_REF_CNT, self.blocks))
        hashes = tuple(map(_BLOCK_HASH, self.blocks))
        # (hash, holder ids) pairs in the map's order, zipped in C.
        prefix_cache = tuple(zip(cached.keys(), map(tuple, cached.values()), strict=True))
        last = self._last_snapshot
        if (
            last is not None
            and last.free_block_ids == free
            and last.ref_counts == ref_counts
            and last.block_hashes == hashes
            and last.prefix_cache == prefix_cache
        ):
            return last
        self._last_snapshot = KVState(self.num_blocks, free, ref_counts, hashes, prefix_cache)
        return self._last_snapshot
