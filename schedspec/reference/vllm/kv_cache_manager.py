"""Block tables, prefix-cache lookup and allocate_slots for one full-attention group (the
default, an empty kv_cache_groups; hybrid_kv_cache_manager.py serves the others)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from schedspec.reference.sizing import (
    blocks_to_allocate,
    cdiv,
    max_prefix_hit_blocks,
    num_slots,
)
from schedspec.reference.vllm.block_pool import BlockPool
from schedspec.reference.vllm.free_block_queue import KVCacheBlock
from schedspec.spec import (
    BlockHash,
    KVState,
    Request,
    RequestStatus,
    SchedulerConfig,
    extend_block_hashes,
)

# The scheduler's field reader for its snapshot: map() over it walks the blocks in C.
BLOCK_ID = attrgetter("block_id")
# Read per running request per step: an enum member read off its class goes through
# EnumType's __getattr__ hook (Python 3.11), several times the cost of a global.
RUNNING = RequestStatus.RUNNING


def admission_watermark(request: Request, has_running_requests: bool, watermark_blocks: int) -> int:
    """Blocks an allocation must leave free: the watermark is charged only to admissions
    (waiting or preempted requests) while something is running."""
    if has_running_requests and request.status in (
        RequestStatus.WAITING,
        RequestStatus.PREEMPTED,
    ):
        return watermark_blocks
    return 0


class KVCacheManagerBase:
    """What the scheduler reads of any KV cache manager, single group or hybrid: the pool,
    its usage and snapshot, and the prefix-cache statistics over admissions."""

    def __init__(self, config: SchedulerConfig, block_pool: BlockPool) -> None:
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len
        self.enable_caching = config.enable_prefix_caching
        self.watermark_blocks = config.watermark_blocks
        self.block_pool = block_pool
        # Prefix-cache statistics over admissions: tokens looked up and tokens hit.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def usage(self) -> float:
        """The fraction of blocks held by some request (free cached blocks count as free).

        vLLM 0.34.0's BlockPool.get_usage divides by its blocks less the null block,
        which is num_blocks here; the same expression, so a threshold compares alike.
        """
        return self.block_pool.get_usage()

    def record_prefix_cache_lookup(self, request: Request, num_hit_tokens: int) -> None:
        if self.enable_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def snapshot(self) -> KVState:
        return self.block_pool.snapshot()


class KVCacheManager(KVCacheManagerBase):
    def __init__(self, config: SchedulerConfig) -> None:
        if config.kv_cache_groups:
            # HybridKVCacheManager serves those (make_kv_cache_manager picks it).
            raise ValueError("KVCacheManager serves the single group: no kv_cache_groups")
        super().__init__(config, BlockPool(config.num_blocks, config.enable_prefix_caching))
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each table are registered in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        # Chained hashes of each live request's full blocks, grown as tokens arrive;
        # kept across preemption (the tokens stay), dropped when the request ends.
        self._block_hashes: dict[str, list[BlockHash]] = {}

    def block_hashes(self, request: Request) -> list[BlockHash]:
        hashes = self._block_hashes.setdefault(request.request_id, [])
        return extend_block_hashes(hashes, request.all_token_ids, self.block_size)

    def hash_prompt(self, request: Request) -> None:
        """Hash a new request's full prompt blocks on arrival, off the scheduling path."""
        if self.enable_caching:
            self.block_hashes(request)

    def get_block_ids(self, request_id: str) -> tuple[int, ...]:
        return tuple(b.block_id for b in self.req_to_blocks.get(request_id, ()))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of whole blocks, never covering the last token.

        The last token is always recomputed: its logits are what the step is for.
        So a prompt of exactly k full blocks hits at most k-1 of them.
        """
        if not self.enable_caching:
            return [], 0
        hits = self._longest_cache_hit(request)
        return hits, len(hits) * self.block_size

    def get_num_cached_tokens(self, request: Request) -> int:
        """How many tokens get_computed_blocks would hit now, as a pure probe: no block
        is touched, so cache-aware admission can rank requests it may not admit (vLLM
        0.34.0's KVCacheManager.get_num_cached_tokens: the same lookup, capped at
        num_tokens - 1 the same way)."""
        if not self.enable_caching:
            return 0
        return len(self._longest_cache_hit(request)) * self.block_size

    def _longest_cache_hit(self, request: Request) -> list[KVCacheBlock]:
        max_hit_blocks = max_prefix_hit_blocks(request.num_tokens, self.block_size)
        return self.block_pool.longest_cached_prefix(self.block_hashes(request), max_hit_blocks)

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
        """Give the request KV slots for its new tokens; None (and no change) if they don't fit.

        Slots cover computed + hit + new + lookahead tokens, capped at
        max_model_len. An admission (full_sequence_must_fit) must also fit
        the request's whole known sequence in today's free blocks, so a lone
        chunked prefill is not admitted on its first chunk only to preempt
        itself on a later one. Like vLLM, nothing is reserved for it: other
        admissions and decodes may still take those blocks, and then the
        running loop preempts. The watermark is charged only to admissions
        while something is running.
        """
        if (
            num_new_tokens <= 0
            and num_new_computed_tokens <= 0
            and num_external_computed_tokens <= 0
        ):
            raise ValueError("allocate_slots needs new tokens or new computed tokens")
        rid = request.request_id
        max_model_len = self.max_model_len
        total_computed = (
            request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        )
        # Not min(): this runs per running request per step, and the builtin's call
        # costs more than the test.
        if total_computed > max_model_len:
            total_computed = max_model_len
        slots = num_slots(total_computed, num_new_tokens, num_lookahead_tokens, max_model_len)
        table = self.req_to_blocks.get(rid)
        num_held = len(table) if table is not None else 0
        # The decode fast path: a running request whose table already covers
        # its slots consumes no block, and running requests pay no watermark.
        if (
            table is not None
            and not new_computed_blocks
            and not full_sequence_must_fit
            and slots <= num_held * self.block_size
            and request.status is RUNNING
        ):
            if self.enable_caching:
                self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
            return []

        watermark = admission_watermark(request, has_running_requests, self.watermark_blocks)
        free = self.block_pool.get_num_free_blocks()
        # A hit on a free (ref 0) cached block takes it out of the free queue.
        evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        num_hit_blocks = len(new_computed_blocks)
        if full_sequence_must_fit:
            full_tokens = min(request.num_tokens, max_model_len)
            needed = blocks_to_allocate(
                num_held, full_tokens, num_hit_blocks, evictable, self.block_size
            )
            if needed + watermark > free:
                return None
        needed = blocks_to_allocate(num_held, slots, num_hit_blocks, evictable, self.block_size)
        if needed + watermark > free - reserved_blocks:
            return None

        # Commit: nothing above changed any state.
        if table is None:
            table = self.req_to_blocks[rid] = []
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            table.extend(new_computed_blocks)
            self.num_cached_block[rid] = len(table)
        new_blocks = self.block_pool.get_new_blocks(
            max(cdiv(slots, self.block_size) - len(table), 0)
        )
        table.extend(new_blocks)
        if delay_cache_blocks:
            return new_blocks
        # Blocks are registered at schedule time; drafts are not known tokens
        # yet, so the count stops at num_tokens.
        self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's full blocks among its first num_tokens tokens."""
        if not self.enable_caching:
            return
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_full <= num_cached:
            return
        self.block_pool.cache_full_blocks(
            self.req_to_blocks[rid], self.block_hashes(request), num_cached, num_full
        )
        self.num_cached_block[rid] = num_full

    def uncache_uncomputed_blocks(self, request: Request) -> None:
        """Take back prefix-cache registrations past the request's computed tokens.

        Blocks are registered when they are scheduled. A request unscheduled
        in the same step (a priority victim) never computes them, so they
        must not outlive it in the cache: a later hit would read garbage.
        """
        rid = request.request_id
        keep = request.num_computed_tokens // self.block_size
        num_cached = self.num_cached_block.get(rid, 0)
        for block in self.req_to_blocks.get(rid, [])[keep:num_cached]:
            self.block_pool.uncache_block(block)
        if num_cached > keep:
            self.num_cached_block[rid] = keep

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so a chain's head stays cached longest."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        self.block_pool.free_blocks(reversed(blocks))
        if request.is_finished:
            self._block_hashes.pop(rid, None)
