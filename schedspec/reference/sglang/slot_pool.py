"""SGLang's KV pool allocator: free token slots (pages, when page_size > 1).

SGLang 0.5.23's TokenToKVPoolAllocator (page_size 1) and
PagedTokenToKVPoolAllocator hand out slots from the front of one free list. They
differ in where a freed slot goes: the token allocator appends freed slots at the
back, in the order they are freed; the paged allocator puts freed pages at the
front (reused first). While the result of a step is processed, frees are held in
a group and released together when it ends (free_group_begin / free_group_end).

Block ids are SGLang's page indices minus one: SGLang reserves slot (page) 0
for padding, so its pages 1..num_pages are our blocks 0..num_pages-1.
"""

from __future__ import annotations

from collections.abc import Iterable


class SlotPool:
    """The allocator's free list of pages, front handed out first."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.free_pages: list[int] = list(range(num_pages))
        # Pages freed inside a free group, released when the group ends.
        self._group: list[int] | None = None

    def available_pages(self) -> int:
        """Free pages; those held in an open free group are not available yet."""
        return len(self.free_pages)

    def available_tokens(self) -> int:
        """SGLang's available_size(): free slots, counted in tokens."""
        return self.available_pages() * self.page_size

    def alloc(self, num_pages: int) -> list[int]:
        """The first num_pages free pages; the caller has checked that they are there."""
        if num_pages > len(self.free_pages):
            raise RuntimeError(
                f"asked for {num_pages} free pages, only {len(self.free_pages)} free "
                "(SGLang raises 'out of memory' here)"
            )
        taken = self.free_pages[:num_pages]
        del self.free_pages[:num_pages]
        return taken

    def free(self, pages: Iterable[int]) -> None:
        """Give pages back: held while a free group is open, else released now."""
        freed = list(pages)
        if not freed:
            return
        if self._group is not None:
            self._group.extend(freed)
        else:
            self._release(freed)

    def begin_group(self) -> None:
        assert self._group is None, "free groups do not nest"
        self._group = []

    def end_group(self) -> None:
        pending, self._group = self._group, None
        if pending:
            self._release(pending)

    def _release(self, pages: list[int]) -> None:
        if self.page_size == 1:
            self.free_pages.extend(pages)
        else:
            self.free_pages[:0] = pages
