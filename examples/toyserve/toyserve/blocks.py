"""Paged KV blocks with reference counts and a prefix cache keyed by a content hash.

A full block's key is the SHA-1 of its parent's key and its tokens, so equal keys mean
equal prefixes. A freed block keeps its key (and its place in the cache) until the block
is handed out again: a later request with the same prefix reuses it.
"""

from __future__ import annotations

import hashlib
from collections import deque


def block_key(parent: str | None, tokens: list[int]) -> str:
    digest = hashlib.sha1((parent or "").encode())
    digest.update(",".join(map(str, tokens)).encode())
    return digest.hexdigest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.refs = [0] * num_blocks
        self.keys: list[str | None] = [None] * num_blocks  # the content key of a cached block
        self.free: deque[int] = deque(range(num_blocks))  # handed out from the left
        self.cache: dict[str, int] = {}  # content key -> block
        self.tables: dict[str, list[int]] = {}  # seq_id -> its blocks
        self.seq_keys: dict[str, list[str]] = {}  # seq_id -> keys of its full blocks

    def num_free(self) -> int:
        return len(self.free)

    def table(self, seq_id: str) -> list[int]:
        return self.tables.get(seq_id, [])

    def cached_prefix(self, seq_id: str, tokens: list[int]) -> list[int]:
        """The cached blocks of the longest prefix of `tokens` (never its last token)."""
        if not self.prefix_caching:
            return []
        hits: list[int] = []
        parent = None
        for i in range((len(tokens) - 1) // self.block_size):
            parent = block_key(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            block = self.cache.get(parent)
            if block is None:
                break
            hits.append(block)
        return hits

    def take_cached(self, seq_id: str, blocks: list[int]) -> None:
        for block in blocks:
            if self.refs[block] == 0:
                self.free.remove(block)
            self.refs[block] += 1
        self.tables[seq_id] = list(blocks)

    def grow(self, seq_id: str, num_tokens: int) -> bool:
        """Give the sequence blocks for `num_tokens` tokens; False (nothing changed) if short."""
        table = self.tables.setdefault(seq_id, [])
        needed = -(-num_tokens // self.block_size) - len(table)
        if needed > len(self.free):
            return False
        for _ in range(max(0, needed)):
            block = self.free.popleft()
            old = self.keys[block]
            if old is not None:  # evict its old content
                del self.cache[old]
                self.keys[block] = None
            self.refs[block] = 1
            table.append(block)
        return True

    def remember(self, seq_id: str, tokens: list[int], num_computed: int) -> None:
        """Cache the sequence's blocks that `num_computed` tokens fill."""
        if not self.prefix_caching:
            return
        keys = self.seq_keys.setdefault(seq_id, [])
        table = self.tables[seq_id]
        for i in range(len(keys), num_computed // self.block_size):
            parent = keys[-1] if keys else None
            key = block_key(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            keys.append(key)
            if key not in self.cache and self.keys[table[i]] is None:
                self.cache[key] = table[i]
                self.keys[table[i]] = key

    def release(self, seq_id: str) -> None:
        for block in reversed(self.tables.pop(seq_id, [])):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        self.seq_keys.pop(seq_id, None)
