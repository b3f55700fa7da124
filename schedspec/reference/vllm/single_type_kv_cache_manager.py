"""One KV cache group's block tables over the shared pool: the rules every kind shares, and
the attention kinds' own (full attention, sliding window, chunked local). Mamba's are in
mamba_manager.py. vLLM's names (vLLM 0.34.0 v1/core/single_type_kv_cache_manager.py);
docs/SPEC.md, "Hybrid KV cache groups", states each rule.

A block table is positional: entry i holds tokens [i * block_size, (i + 1) * block_size)
of the group. A block a group no longer needs is replaced by the null block, which stands
for "nothing here": it is never freed, cached, touched or handed out, and it is not one of
the pool's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedspec.reference.sizing import cdiv
from schedspec.reference.vllm.block_pool import BlockPool
from schedspec.reference.vllm.free_block_queue import KVCacheBlock
from schedspec.spec import BlockHash
from schedspec.spec.kv_groups import (
    NULL_BLOCK_ID,
    ChunkedLocalGroup,
    KVCacheGroupSpec,
    SlidingWindowGroup,
    window_block_reachable,
)


def make_null_block() -> KVCacheBlock:
    return KVCacheBlock(NULL_BLOCK_ID)


class SingleTypeKVCacheManager:
    """The block tables of one group; a subclass per kind says which tokens the group's
    layers still read (get_num_skipped_tokens) and how a prefix-cache hit looks."""

    def __init__(
        self,
        spec: KVCacheGroupSpec,
        block_pool: BlockPool,
        null_block: KVCacheBlock,
        enable_caching: bool,
        alignment_tokens: int,
    ) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.block_pool = block_pool
        self.null_block = null_block
        self.enable_caching = enable_caching
        # Hits end on a multiple of this (the scheduler block size): every group's hit
        # must then land on a boundary all groups share.
        self.alignment_tokens = alignment_tokens
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Leading table entries already registered in the prefix cache (or null). A
        # request with an entry here has been allocated: it gets no new hits.
        self.num_cached_block: dict[str, int] = {}

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens the group's layers will never read again once num_computed_tokens are
        computed. Full attention reads them all."""
        return 0

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """The group's cached blocks for the longest hit of at most max_length tokens
        ending on an alignment boundary, positional (nulls where the group needs
        nothing); its length in tokens is len(result) * block_size."""
        hits = self.block_pool.longest_cached_prefix(block_hashes, max_length // self.block_size)
        return self._aligned(hits)

    def _aligned(self, blocks: list[KVCacheBlock]) -> list[KVCacheBlock]:
        # Drop whole blocks from the tail until the hit ends on an alignment boundary.
        while len(blocks) * self.block_size % self.alignment_tokens:
            blocks.pop()
        return blocks

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
    ) -> int:
        """Free-pool blocks that allocating slots for num_tokens tokens would consume
        (num_tokens_main_model: the same less the lookahead slots of drafts).

        An allocated request gets no new hits: it needs what its table lacks. A new one
        needs no block for a skipped prefix (the null block stands there), and a hit
        on a free block (ref 0) consumes it too: touching takes it out of the queue.
        """
        num_required = cdiv(num_tokens, self.block_size)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            # Rejected drafts can leave a table longer than it needs to be.
            return max(num_required - num_held, 0)
        num_skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(num_required - max(num_skipped, len(new_computed_blocks) + num_held), 0)
        kept_hits = new_computed_blocks[max(0, num_skipped - num_held) :]
        return num_new + self._get_num_evictable_blocks(kept_hits)

    def _get_num_evictable_blocks(self, hits: Sequence[KVCacheBlock]) -> int:
        # A free hit (ref 0) leaves the free queue when touched: it counts as taken.
        return sum(1 for b in hits if b.ref_cnt == 0 and b is not self.null_block)

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock], num_computed: int
    ) -> None:
        """Phase one of an admission: take the hit blocks the group still needs (touching
        them, so no allocation can evict them), nulls for the skipped prefix."""
        table = self.req_to_blocks.setdefault(request_id, [])
        assert not table, f"{request_id} already holds blocks: it gets no new hits"
        num_skipped = self.get_num_skipped_tokens(num_computed) // self.block_size
        kept = [b for b in new_computed_blocks[num_skipped:] if b is not self.null_block]
        self.block_pool.touch(kept)
        table.extend([self.null_block] * num_skipped)
        table.extend(new_computed_blocks[num_skipped:])
        # Hits are cached already (nulls have nothing to cache).
        self.num_cached_block[request_id] = len(table)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        """Phase two: fresh blocks until the table covers num_tokens slots."""
        table = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(table)
        if num_new <= 0:
            return []
        blocks = self.block_pool.get_new_blocks(num_new)
        table.extend(blocks)
        return blocks

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        """Free the blocks wholly before what the layers still read, counting only
        processed tokens (computed less those in flight: a step still running reads its
        window, and rejected drafts roll the count back), nulls in their place."""
        num_skipped = self.get_num_skipped_tokens(processed_computed_tokens) // self.block_size
        table = self.req_to_blocks.get(request_id)
        if table is None or num_skipped <= 0:
            return
        self._remove_blocks_in_range(request_id, 0, min(num_skipped, len(table)))

    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        # Back to front, stopping at the first null: everything before it was freed by an
        # earlier call, since the skipped prefix only grows. Freed tail first, so the
        # later (longer-prefix) blocks are evicted before the earlier ones.
        table = self.req_to_blocks[request_id]
        freed: list[KVCacheBlock] = []
        for i in range(last - 1, first - 1, -1):
            if table[i] is self.null_block:
                break
            freed.append(table[i])
            table[i] = self.null_block
        self.block_pool.free_blocks(freed)

    def cache_blocks(
        self, request_id: str, block_hashes: Sequence[BlockHash], num_tokens: int
    ) -> None:
        """Register the table's full blocks among the first num_tokens tokens, but for
        nulls (they hold nothing) and blocks no hit can reach (`reachable`). Those stay
        uncached, so when freed they go to the front of the free queue."""
        if not self.enable_caching:
            return
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = min(num_tokens // self.block_size, len(block_hashes))
        table = self.req_to_blocks[request_id]
        for i in range(num_cached, num_full):
            if table[i] is not self.null_block and self.reachable(i):
                self.block_pool.cache_full_blocks(table, block_hashes, i, i + 1)
        self.num_cached_block[request_id] = max(num_cached, num_full)

    def reachable(self, index: int) -> bool:
        """Whether some aligned prefix-cache hit can use table entry `index`
        (`window_block_reachable`: only a sliding window leaves blocks out)."""
        return window_block_reachable(self.spec, index, self.alignment_tokens)

    def uncache_blocks_past(self, request_id: str, num_tokens: int) -> None:
        """Take back registrations past num_tokens tokens: blocks registered when scheduled
        whose step will not compute them (a priority victim unscheduled in the same step),
        so no later hit reads them. Nulls were never registered."""
        keep = num_tokens // self.block_size
        num_cached = self.num_cached_block.get(request_id, 0)
        if num_cached <= keep:
            return
        for block in self.req_to_blocks.get(request_id, [])[keep:num_cached]:
            if block is not self.null_block and block.block_hash is not None:
                self.block_pool.uncache_block(block)
        self.num_cached_block[request_id] = keep

    def free(self, request_id: str) -> None:
        """Release the request's blocks (preempted or finished alike), tail first; its
        nulls were never the pool's."""
        table = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(b for b in reversed(table) if b is not self.null_block)

    def get_block_ids(self, request_id: str) -> tuple[int, ...]:
        return tuple(b.block_id for b in self.req_to_blocks.get(request_id, ()))


class FullAttentionManager(SingleTypeKVCacheManager):
    """Every token is read by every later one: nothing is freed before the request ends,
    and a hit is the longest cached run from the first block (the base class's rules)."""


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A token reads the sliding_window tokens ending at itself."""

    @property
    def sliding_window(self) -> int:
        assert isinstance(self.spec, SlidingWindowGroup)
        return self.spec.sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The next token (index num_computed_tokens) reads back to
        # num_computed_tokens - sliding_window + 1.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """The rightmost run of cached blocks ending on an alignment boundary and long
        enough for a window (the blocks before it are nulls); failing that, the cached
        run from the first block.

        Hashes are chained, so a block's hash names its whole prefix: a cached block
        deep in the prompt is a hit even when the blocks before it were evicted.
        """
        needed = cdiv(self.sliding_window - 1, self.block_size)
        run: list[KVCacheBlock] = []  # the current run of hits, last block first
        for i in range(max_length // self.block_size - 1, -1, -1):
            block = self.block_pool.get_cached_block(block_hashes[i])
            if block is None:
                run = []
                continue
            if not run and (i + 1) * self.block_size % self.alignment_tokens:
                continue  # a run must end on an alignment boundary
            run.append(block)
            if len(run) >= needed:
                return [self.null_block] * i + run[::-1]
        # No run covers a window: the run left is the one that starts at block 0.
        return self._aligned(run[::-1])


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Tokens are read within chunks of attention_chunk_size: a token reads its own chunk
    up to itself."""

    @property
    def attention_chunk_size(self) -> int:
        assert isinstance(self.spec, ChunkedLocalGroup)
        return self.spec.attention_chunk_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Every chunk before the next token's.
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """Nulls for the chunks before the one max_length falls in, then the cached run
        from that chunk's first block (its block size is the alignment: no rounding)."""
        chunk = self.attention_chunk_size
        first = max_length // chunk * chunk // self.block_size
        hits = self.block_pool.longest_cached_prefix(
            block_hashes[first:], max(max_length // self.block_size - first, 0)
        )
        return [self.null_block] * first + hits
