"""The free-block queue: a doubly linked list with O(1) removal from the middle.

A prefix-cache hit on a free block must pull that block out of the queue
wherever it sits; a deque would make that O(num_blocks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from schedspec.spec import BlockHash


class KVCacheBlock:
    """One physical KV block: its id, how many block tables hold it, its cached content."""

    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None  # set while registered in the prefix cache
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt})"


class FreeBlockQueue:
    """Free blocks in reuse order: the front is handed out first."""

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        # Sentinels keep every link operation free of end-of-list cases.
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        # block_ids()' answer while the queue has not changed since (None: changed).
        self._ids: tuple[int, ...] | None = None
        self.append_n(blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next_free

    def block_ids(self) -> tuple[int, ...]:
        """The free blocks' ids, front first. A snapshot takes them twice a checked step
        and most steps leave the queue as it was: the walk is kept until the queue
        changes (every change goes through the methods below, which drop it)."""
        if self._ids is not None:
            return self._ids
        ids: list[int] = []
        node = self._head.next_free
        tail = self._tail
        while node is not tail:
            assert node is not None
            ids.append(node.block_id)
            node = node.next_free
        self._ids = tuple(ids)
        return self._ids

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise RuntimeError(f"asked for {n} free blocks, only {self.num_free_blocks} free")
        self._ids = None
        taken: list[KVCacheBlock] = []
        node = self._head.next_free
        for _ in range(n):
            assert node is not None
            taken.append(node)
            node = node.next_free
            taken[-1].prev_free = taken[-1].next_free = None
        self._head.next_free = node
        assert node is not None
        node.prev_free = self._head
        self.num_free_blocks -= n
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise RuntimeError(f"block {block.block_id} is not in the free queue")
        self._ids = None
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Put blocks at the back, in the given order (reused last)."""
        self._ids = None
        for block in blocks:
            last = self._tail.prev_free
            assert last is not None
            last.next_free = block
            block.prev_free = last
            block.next_free = self._tail
            self._tail.prev_free = block
            self.num_free_blocks += 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put blocks at the front, keeping their order (blocks[0] is reused first)."""
        self._ids = None
        for block in reversed(blocks):
            first = self._head.next_free
            assert first is not None
            block.prev_free = self._head
            block.next_free = first
            first.prev_free = block
            self._head.next_free = block
            self.num_free_blocks += 1
