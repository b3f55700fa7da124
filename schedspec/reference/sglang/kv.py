"""SGLang's KV bookkeeping for requests: rows of pages over the pool and the radix tree.

Each running request holds a row (SGLang's ReqToTokenPool, one row per running
request, max_running_requests rows) listing the pages of its tokens: first the
radix tree's pages of its cached prefix (locked), then its own. The functions
here are SGLang 0.5.23's allocation and release paths (mem_cache/allocation.py,
mem_cache/common.py, UnifiedRadixCache.checkpoint_into_tree), each with the
eviction that precedes it, since when and how much the tree evicts decides
which prefixes stay cached.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedspec.reference.sglang.radix_tree import RadixTree
from schedspec.reference.sglang.req import SGLangReq
from schedspec.reference.sglang.slot_pool import SlotPool
from schedspec.reference.sizing import cdiv
from schedspec.spec.sglang_arithmetic import RETRACT_DECODE_STEPS


class SGLangKV:
    def __init__(self, num_pages: int, page_size: int, radix: bool, num_rows: int) -> None:
        self.page_size = page_size
        self.pool = SlotPool(num_pages, page_size)
        self.tree = RadixTree(self.pool, radix)
        self.num_rows = num_rows
        self.rows_in_use = 0

    # ------------------------------------------------------------------ capacity

    def rows_available(self) -> int:
        return self.num_rows - self.rows_in_use

    def available_and_evictable(self) -> int:
        """Tokens admission may count on: free slots plus evictable cache."""
        return self.pool.available_tokens() + self.tree.evictable_size

    def _pages(self, tokens: int) -> int:
        return cdiv(tokens, self.page_size)

    # ------------------------------------------------------------------ prefix match

    def match_prefix(self, req: SGLangReq) -> None:
        """init_next_round_input: the longest cached prefix, never the last token."""
        fill = req.fill_ids
        req.prefix_len, req.last_node = self.tree.match_prefix(fill, max(len(fill) - 1, 0))
        req.cache_protected_len = req.prefix_len

    def touch_prefix(self, req: SGLangReq) -> None:
        """touch_waiting_prefix: refresh the recency of the request's cached path."""
        self.tree.match_prefix(req.fill_ids)

    # ------------------------------------------------------------------ allocation

    def alloc_for_extend(self, reqs: Sequence[SGLangReq]) -> None:
        """alloc_for_extend: a row for each request without one, then pages for every
        extend in batch order, after evicting enough of the tree (page_size 1: the
        extend tokens; paged: one more page per request, an over-estimate)."""
        p = self.page_size
        for req in reqs:
            if req.row is None:
                if self.rows_in_use >= self.num_rows:
                    raise RuntimeError("alloc_req_slots runs out of memory (SGLang raises here)")
                self.rows_in_use += 1
                req.row = self._prefix_pages(req)
        extend_tokens = sum(r.extend_len for r in reqs)
        self.tree.evict_to(extend_tokens + (0 if p == 1 else len(reqs) * p))
        needed = [self._pages(r.extend_end) - self._pages(r.prefix_len) for r in reqs]
        if sum(needed) > self.pool.available_pages():
            raise RuntimeError("Prefill out of memory (SGLang raises here)")
        for req, count in zip(reqs, needed, strict=True):
            assert req.row is not None
            del req.row[self._pages(req.prefix_len) :]
            req.row.extend(self.pool.alloc(count))
            req.kv_allocated_len = req.kv_committed_len = req.extend_end

    def extend_room(self, req: SGLangReq) -> int:
        """Tokens the request's next extend can get slots for now: the rest of its last
        page, then every free and evictable page (what alloc_for_extend can reach)."""
        p = self.page_size
        return (
            self._pages(req.prefix_len) * p
            - req.prefix_len
            + (self.available_and_evictable() // p * p)
        )

    def _prefix_pages(self, req: SGLangReq) -> list[int]:
        """A new row starts with the tree's pages of the matched prefix."""
        if req.prefix_len == 0 or req.last_node is None:
            return []
        return self.tree.path_pages(req.last_node)[: req.prefix_len // self.page_size]

    def new_tokens_next_decode(self, reqs: Sequence[SGLangReq]) -> int:
        """Slots the next decode needs: a page for each request whose KV fills its last page."""
        p = self.page_size
        return sum(p for r in reqs if r.kv_committed_len % p == 0)

    def check_decode_mem(self, reqs: Sequence[SGLangReq]) -> bool:
        """Does a decode of reqs fit, after evicting what the tree can give?"""
        needed = self.new_tokens_next_decode(reqs)
        self.tree.evict_to(needed)
        return self.pool.available_tokens() >= needed

    def alloc_for_decode(self, reqs: Sequence[SGLangReq]) -> None:
        """prepare_for_decode's allocation: one slot per request (a new page when its
        last is full), after evicting (paged: a page per request, an over-estimate)."""
        p = self.page_size
        self.tree.evict_to(len(reqs) * p)
        if self.new_tokens_next_decode(reqs) > self.pool.available_tokens():
            raise RuntimeError("Decode out of memory (SGLang raises here)")
        for req in reqs:
            assert req.row is not None
            if req.kv_committed_len % p == 0:
                req.row.extend(self.pool.alloc(1))
            req.kv_committed_len += 1
            req.kv_allocated_len += 1

    # ------------------------------------------------------------------ the tree

    def lock(self, req: SGLangReq) -> None:
        """Admission locks the matched prefix for the request."""
        assert req.last_node is not None
        req.lock = req.last_node
        self.tree.lock(req.lock)

    def checkpoint(self, req: SGLangReq, up_to: int) -> None:
        """checkpoint_into_tree: cache the row's tokens [0, up_to) (whole pages),
        free the request's pages the tree already had, point its row at the tree's
        pages and move its lock to the node the insert ended on. After outputs,
        the node is split at the prompt's end so the outputs can be evicted alone."""
        tree = self.tree
        if not tree.enabled:
            return
        assert req.row is not None
        p = self.page_size
        tokens = req.fill_ids[:up_to]
        aligned = tree.page_aligned(len(tokens))
        if aligned == 0:
            return
        pages = req.row[: aligned // p]
        _, node = tree.insert(tokens, pages, req.cache_protected_len)
        req.cache_inserted_len = max(req.cache_inserted_len, aligned)
        prompt = req.request.prompt_token_ids
        prompt_aligned = tree.page_aligned(len(prompt))
        if 0 < prompt_aligned < aligned:
            tree.insert(prompt, pages[: prompt_aligned // p], prompt_aligned)
        path = tree.path_pages(node)
        start = req.cache_protected_len // p
        req.row[start : len(path)] = path[start:]
        if req.lock is not None:
            tree.unlock(req.lock)
        req.lock = node
        tree.lock(node)
        req.cache_protected_len = len(path) * p
        req.last_node = node

    # ------------------------------------------------------------------ release

    def release(self, req: SGLangReq, checkpoint: bool) -> None:
        """release_kv_cache: optionally cache the request's KV, then give back its
        pages past what the tree owns, its lock and its row."""
        assert req.row is not None
        p = self.page_size
        owned = req.owned_kv_len
        if checkpoint:
            self.checkpoint(req, owned)
        row = req.row
        self.pool.free(row[req.cache_protected_len // p : self._pages(owned)])
        if req.lock is not None:
            self.tree.unlock(req.lock)
            req.lock = None
        over_start = owned if p == 1 else self._pages(owned) * p
        if over_start < req.kv_allocated_len:
            self.pool.free(row[over_start // p : self._pages(req.kv_allocated_len)])
        req.row = None
        self.rows_in_use -= 1

    def retract(self, req: SGLangReq, num_left: int) -> None:
        """release_req: free everything without caching it (the space is needed now),
        evict for the requests left to decode a while, and forget the KV."""
        self.release(req, checkpoint=False)
        # After a retraction SGLang evicts until the survivors can decode a while.
        self.tree.evict_to(num_left * RETRACT_DECODE_STEPS)
        req.reset_for_retract()
