"""SGLang's radix cache: computed prefixes as a tree of pages, evicted leaf by leaf (LRU).

What SGLang 0.5.23's UnifiedRadixCache does for full attention, as far as its
decisions and its slot accounting go:

- A node holds a run of whole pages of one token sequence (keys are cut to
  whole pages); its children are keyed by their first page of tokens.
- `match_prefix` walks down as far as whole pages match and splits a node where
  the match stops inside it; the node it ends on and every ancestor get fresh
  access times (deepest newest).
- `insert` walks the same way (touching each node it passes), frees the
  caller's pages that duplicate pages already in the tree, and hangs what is
  left as a new leaf.
- A request locks the path to its last node; a node with a lock is protected,
  one without is evictable. Eviction removes evictable leaves, least recently
  used first, each one whole (all its pages), and gives their pages to the
  pool, until the pool has the slots asked for or nothing is evictable.

Access times come from one counter (SGLang's get_and_increase_time_counter); a
match stamps its path counter - k * 1e-5 for the k-th ancestor, as SGLang does.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

from schedspec.reference.sglang.slot_pool import SlotPool
from schedspec.spec import BlockHash, hash_block_tokens

# A match stamps each ancestor this much older than its child (SGLang's step).
_ANCESTOR_STEP = 0.00001


class RadixNode:
    __slots__ = (
        "children",
        "hashes",
        "id",
        "key",
        "last_access_time",
        "lock_ref",
        "pages",
        "parent",
    )

    def __init__(
        self,
        node_id: int,
        key: tuple[int, ...],
        pages: list[int],
        parent: RadixNode | None,
        now: float,
    ) -> None:
        self.id = node_id
        self.key = key  # tokens, a whole number of pages
        self.pages = pages  # one block id per page of key
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.lock_ref = 0
        self.last_access_time = now
        # The chain hash of each page's prefix (page_hashes), computed when first asked
        # for: a node's prefix never changes (a split divides the hashes with the key).
        self.hashes: tuple[BlockHash, ...] | None = None

    def __repr__(self) -> str:
        return f"RadixNode({self.id}, {len(self.key)} tokens, lock {self.lock_ref})"


class RadixTree:
    def __init__(self, pool: SlotPool, enabled: bool) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.enabled = enabled
        self._clock = 0.0
        self._ids = itertools.count()
        self.root = RadixNode(next(self._ids), (), [], None, self._tick())
        # Tokens in unlocked and locked nodes (SGLang's evictable_size / protected_size).
        self.evictable_size = 0
        self.protected_size = 0
        # Bumped by every change to the tree's shape, locks or access times: the
        # snapshot's views (page_hashes, eviction_order) are computed once per change,
        # not once per snapshot (most steps are decodes, which change none of them).
        self._changes = 0
        self._hashes_seen: tuple[int, tuple[tuple[int, BlockHash], ...]] | None = None
        self._order_seen: tuple[int, tuple[int, ...]] | None = None

    # ------------------------------------------------------------------ clock

    def _tick(self) -> float:
        now = self._clock
        self._clock += 1.0
        return now

    def _child_key(self, tokens: Sequence[int], offset: int) -> tuple[int, ...]:
        return tuple(tokens[offset : offset + self.page_size])

    def page_aligned(self, length: int) -> int:
        return length // self.page_size * self.page_size

    def _match_len(self, key: tuple[int, ...], tokens: Sequence[int], offset: int) -> int:
        """Tokens of `key` that `tokens[offset:]` matches, in whole pages: up to the
        first token that differs or is missing on either side, rounded down to a page."""
        n = min(len(key), len(tokens) - offset)
        theirs = tuple(tokens[offset : offset + n])
        # Compared whole first, in C: a node's key most often matches to its end; else
        # the first difference, one token at a time (a page at a time cost a slice each).
        if key[:n] == theirs:
            same = n
        else:
            same = next(i for i, (a, b) in enumerate(zip(key, theirs, strict=False)) if a != b)
        return same // self.page_size * self.page_size

    # ------------------------------------------------------------------ structure

    def _split(self, child: RadixNode, split_len: int) -> RadixNode:
        """Cut child after split_len tokens; the new node (the head) takes child's
        place and its lock count; child keeps the tail and gets a fresh time."""
        parent = child.parent
        assert parent is not None
        self._changes += 1
        head = RadixNode(
            next(self._ids),
            child.key[:split_len],
            child.pages[: split_len // self.page_size],
            parent,
            self._tick(),
        )
        head.lock_ref = child.lock_ref
        if child.hashes is not None:
            head.hashes = child.hashes[: split_len // self.page_size]
            child.hashes = child.hashes[split_len // self.page_size :]
        head.children = {self._child_key(child.key, split_len): child}
        parent.children[self._child_key(child.key, 0)] = head
        child.key = child.key[split_len:]
        child.pages = child.pages[split_len // self.page_size :]
        child.parent = head
        child.last_access_time = self._tick()
        return head

    def _stamp_path(self, node: RadixNode) -> None:
        """A match's access times: the node newest, each ancestor a little older."""
        self._changes += 1
        now = self._tick()
        walker: RadixNode | None = node
        while walker is not None:
            walker.last_access_time = now
            now -= _ANCESTOR_STEP
            walker = walker.parent

    def path_pages(self, node: RadixNode) -> list[int]:
        """The pages from the root down to node, in order."""
        chunks: list[list[int]] = []
        walker: RadixNode | None = node
        while walker is not None:
            chunks.append(walker.pages)
            walker = walker.parent
        return [page for chunk in reversed(chunks) for page in chunk]

    # ------------------------------------------------------------------ match

    def match_prefix(
        self, tokens: Sequence[int], limit: int | None = None
    ) -> tuple[int, RadixNode]:
        """The longest cached prefix of tokens[:limit] in whole pages: its length in
        tokens and the node it ends on (the root for none). Splits the node the
        match stops inside, and stamps the path."""
        if not self.enabled:
            return 0, self.root
        end = len(tokens) if limit is None else min(limit, len(tokens))
        key = tokens[: self.page_aligned(end)]
        if not key:
            return 0, self.root
        node = self.root
        offset = 0
        while offset < len(key):
            child = node.children.get(self._child_key(key, offset))
            if child is None:
                break
            matched = self._match_len(child.key, key, offset)
            offset += matched
            if matched < len(child.key):
                node = self._split(child, matched)
                break
            node = child
        self._stamp_path(node)
        return offset, node

    # ------------------------------------------------------------------ insert

    def insert(
        self, tokens: Sequence[int], pages: Sequence[int], prev_prefix_len: int
    ) -> tuple[int, RadixNode]:
        """Cache tokens (cut to whole pages), computed into pages. Pages past
        prev_prefix_len that duplicate pages already in the tree go back to the
        pool. Returns the tokens that were already cached and the node the
        insert ends on."""
        self._changes += 1
        self.root.last_access_time = self._tick()
        key = tuple(tokens[: self.page_aligned(len(tokens))])
        values = list(pages[: len(key) // self.page_size])
        node = self.root
        offset = 0
        duplicates: list[int] = []
        while offset < len(key):
            child = node.children.get(self._child_key(key, offset))
            if child is None:
                break
            child.last_access_time = self._tick()
            matched = self._match_len(child.key, key, offset)
            if matched < len(child.key):
                child = self._split(child, matched)
            dup_start = max(offset, prev_prefix_len)
            if dup_start < offset + matched:
                p = self.page_size
                duplicates.extend(values[dup_start // p : (offset + matched) // p])
            offset += matched
            node = child
        if offset < len(key):
            leaf = RadixNode(
                next(self._ids),
                key[offset:],
                values[offset // self.page_size :],
                node,
                self._tick(),
            )
            node.children[self._child_key(key, offset)] = leaf
            self.evictable_size += len(leaf.key)
            node = leaf
        self.pool.free(duplicates)
        return offset, node

    # ------------------------------------------------------------------ locks

    def lock(self, node: RadixNode) -> None:
        """A request takes the path to node: unlocked nodes on it become protected."""
        self._changes += 1
        walker: RadixNode | None = node
        while walker is not None and walker is not self.root:
            if walker.lock_ref == 0:
                self.evictable_size -= len(walker.key)
                self.protected_size += len(walker.key)
            walker.lock_ref += 1
            walker = walker.parent

    def unlock(self, node: RadixNode) -> None:
        self._changes += 1
        walker: RadixNode | None = node
        while walker is not None and walker is not self.root:
            walker.lock_ref -= 1
            assert walker.lock_ref >= 0, f"{walker} unlocked more often than locked"
            if walker.lock_ref == 0:
                self.evictable_size += len(walker.key)
                self.protected_size -= len(walker.key)
            walker = walker.parent

    # ------------------------------------------------------------------ eviction

    def _is_evictable_leaf(self, node: RadixNode) -> bool:
        return node is not self.root and node.lock_ref == 0 and not node.children

    def _nodes(self) -> Iterator[RadixNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _leaf_heap(self) -> list[tuple[float, int, RadixNode]]:
        heap = [(n.last_access_time, n.id, n) for n in self._nodes() if self._is_evictable_leaf(n)]
        heapq.heapify(heap)
        return heap

    def _drop_leaf(self, leaf: RadixNode) -> list[int]:
        parent = leaf.parent
        assert parent is not None
        self._changes += 1
        del parent.children[self._child_key(leaf.key, 0)]
        self.evictable_size -= len(leaf.key)
        return leaf.pages

    def evict_to(self, num_tokens: int) -> None:
        """SGLang's evict_to_free_tokens: evict least recently used leaves until the
        pool has num_tokens free slots, or nothing is left to evict."""
        if not self.enabled or self.pool.available_tokens() >= num_tokens:
            return
        heap = self._leaf_heap()
        while heap and self.pool.available_tokens() < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            self.pool.free(self._drop_leaf(leaf))
            parent = leaf.parent
            if parent is not None and self._is_evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))

    def eviction_order(self) -> tuple[int, ...]:
        """Every evictable page, in the order evicting everything would free them."""
        if self._order_seen is None or self._order_seen[0] != self._changes:
            self._order_seen = (self._changes, tuple(self._eviction_order()))
        return self._order_seen[1]

    def _eviction_order(self) -> list[int]:
        order: list[int] = []
        heap = self._leaf_heap()
        removed: set[int] = set()
        while heap:
            _, _, leaf = heapq.heappop(heap)
            order.extend(leaf.pages)
            removed.add(leaf.id)
            parent = leaf.parent
            if (
                parent is not None
                and parent is not self.root
                and parent.lock_ref == 0
                and all(c.id in removed for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        return order

    def page_hashes(self) -> tuple[tuple[int, BlockHash], ...]:
        """Every page in the tree with the chain hash of the prefix it ends (the hash
        the abstract state gives a cached block: spec.block_hash)."""
        if self._hashes_seen is None or self._hashes_seen[0] != self._changes:
            self._hashes_seen = (self._changes, tuple(self._page_hashes()))
        return self._hashes_seen[1]

    def _page_hashes(self) -> list[tuple[int, BlockHash]]:
        out: list[tuple[int, BlockHash]] = []
        stack: list[tuple[RadixNode, BlockHash | None]] = [(self.root, None)]
        while stack:
            node, parent_hash = stack.pop()
            hashes = self._node_hashes(node, parent_hash)
            out.extend(zip(node.pages, hashes, strict=True))
            last = hashes[-1] if hashes else parent_hash
            stack.extend((child, last) for child in node.children.values())
        return out

    def _node_hashes(self, node: RadixNode, parent_hash: BlockHash | None) -> tuple[BlockHash, ...]:
        """node's page hashes, chained from parent_hash (the hash of the page above it)."""
        if node.hashes is None:
            p = self.page_size
            hashes: list[BlockHash] = []
            for index in range(len(node.pages)):
                parent_hash = hash_block_tokens(parent_hash, node.key[index * p : (index + 1) * p])
                hashes.append(parent_hash)
            node.hashes = tuple(hashes)
        return node.hashes
