"""SGLang's token-slot pool and radix cache seen as the spec's blocks (docs/SPEC.md, "Two
families"): block ids, tables, the free queue, what each cached block holds, and the
KVState they make (`kv_state`).

Nothing here imports SGLang: the functions read SGLang's objects (typed Any) that the
adapter (adapters/sglang/engine.py) hands them.

Block ids. SGLang's token slot 0 is its padding slot, and with page_size > 1 its page 0
is reserved, so slot s (page_size 1) or page p (page_size > 1) is spec block s - 1 or
p - 1. A request's block table is its req_to_token row, one block per page its
allocated tokens touch.

Content. SGLang's radix tree (the Rust tree core, SGLang's default) does not expose its
keys. It does list every slot it holds with that slot's position in its sequence and the
slot before it (walk_for_kv_canary). Every slot enters the tree from a request's table,
so SlotContents records, each time the adapter looks, where each table holds each slot
and the chain hash of the table's own tokens through each full block; a cached block
carries the hash recorded for it. The tree's structure is held to those records
(`TreeWalk.check`): a tree slot sits at the position a table last held it at, right after
a slot held at the position before, so a tree whose chain of slots disagrees with what
the requests wrote is refused instead of mapped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schedspec.adapters.kit import OwnHashes
from schedspec.spec import BlockHash, KVState, RequestState


def slot_block(slot: int, page_size: int) -> int:
    """The spec block id of a token slot: its page, minus the reserved slot or page 0."""
    return slot // page_size - 1


def table_blocks(row: Sequence[int], page_size: int) -> tuple[int, ...]:
    """A request's allocated slots (its req_to_token row, cut at its allocated length)
    as a block table: one block per page (slot_block of each page's first slot, written
    out: this runs per running request per read)."""
    return tuple([slot // page_size - 1 for slot in row[::page_size]])


def _ints(values: Any) -> list[int]:
    """A tensor's or a sequence's values as ints (a tensor's in one call, not per item:
    an integer tensor's tolist() gives ints)."""
    if hasattr(values, "tolist"):
        found: list[int] = values.tolist()
        return found
    return [int(v) for v in values]


@dataclass
class SlotContents:
    """Where tables held each slot, and what each block holds: the chain hash of its
    holder's tokens through it, once all of the block's tokens are known."""

    page_size: int
    _position: dict[int, int] = field(default_factory=dict)  # slot -> position last held at
    _content: dict[int, BlockHash] = field(default_factory=dict)  # block -> hash
    # Per live request (SGLang rid): the chain hashes of its own full blocks so far.
    _own: OwnHashes = field(init=False)
    # Per live request: its row, its table (table_blocks of the row) and how many of its
    # full blocks were recorded when last observed; a row that only grew since is
    # recorded from where it left off, and an unchanged row keeps its table.
    _seen: dict[str, tuple[list[int], tuple[int, ...], int]] = field(default_factory=dict)
    # Bumped whenever a slot's position or a block's content changes: what was read
    # from these records (TreeWalk.check's verdict, the cached blocks' hashes) holds
    # while it is unchanged.
    version: int = 0

    def __post_init__(self) -> None:
        self._own = OwnHashes(self.page_size)

    def observe(self, rid: str, tokens: Sequence[int], row: Sequence[int]) -> tuple[int, ...]:
        """Record a live request's table: its slots' positions, its full blocks' content.
        Returns the table (table_blocks of the row)."""
        own = self._own.of(rid, tokens)
        row = list(row)
        seen_row, table, seen_blocks = self._seen.get(rid, ([], (), 0))
        if row != seen_row:
            if row[: len(seen_row)] != seen_row:  # retracted and given new slots: all anew
                seen_row, seen_blocks = [], 0
            positions = self._position
            for position in range(len(seen_row), len(row)):
                if positions.get(row[position]) != position:
                    positions[row[position]] = position
                    self.version += 1
            table = table_blocks(row, self.page_size)
        full = min(len(table), len(own))
        for index in range(seen_blocks, full):
            if self._content.get(table[index]) != own[index]:
                self._content[table[index]] = own[index]
                self.version += 1
        self._seen[rid] = (row, table, full)
        return table

    def forget(self, live: Iterable[str]) -> None:
        """Drop the per-request hashes of requests no longer live."""
        keep = set(live)
        self._own.keep_only(keep)
        for rid in [r for r in self._seen if r not in keep]:
            del self._seen[rid]

    def position_of(self, slot: int) -> int | None:
        return self._position.get(slot)

    def content_of(self, block: int) -> BlockHash:
        found = self._content.get(block)
        if found is None:
            raise RuntimeError(
                f"SGLang's radix cache holds block {block}, which no request's table held "
                "as a full block: its content is unknown"
            )
        return found


@dataclass(frozen=True)
class TreeWalk:
    """The radix tree's slots as walk_for_kv_canary lists them: each slot, its position
    in its sequence, and the slot before it."""

    slots: tuple[int, ...]
    positions: tuple[int, ...]
    previous: tuple[int, ...]

    @staticmethod
    def of(tree_core: Any, unlocked_only: bool) -> TreeWalk:
        walked = tree_core.walk_for_kv_canary(unlocked_only, False)
        return TreeWalk(
            tuple(_ints(walked.slot_indices)),
            tuple(_ints(walked.positions)),
            tuple(_ints(walked.prev_slot_indices)),
        )

    def blocks(self, page_size: int) -> tuple[int, ...]:
        """The blocks these slots fill (walk_blocks)."""
        return walk_blocks(self.slots, page_size)

    def check(self, contents: SlotContents) -> None:
        """Refuse a tree whose chain of slots disagrees with where tables held them."""
        for slot, position, previous in zip(self.slots, self.positions, self.previous, strict=True):
            held_at = contents.position_of(slot)
            if held_at != position:
                raise RuntimeError(
                    f"SGLang's radix cache holds slot {slot} at position {position}, but "
                    f"the last table that held it had it at position {held_at}"
                )
            if position > 0 and contents.position_of(previous) != position - 1:
                raise RuntimeError(
                    f"SGLang's radix cache chains slot {slot} (position {position}) after "
                    f"slot {previous}, which the last table that held it had at position "
                    f"{contents.position_of(previous)}"
                )


def walk_blocks(slots: Iterable[int], page_size: int) -> tuple[int, ...]:
    """The blocks a tree walk's slots fill, each once, by block id: the walk's own order
    follows the Rust tree core's maps of children, which is not the eviction order and
    differs from one run to the next."""
    return tuple(sorted({slot_block(s, page_size) for s in slots}))


def evictable_blocks(tree_core: Any, page_size: int) -> tuple[int, ...]:
    """The blocks of the tree's unlocked slots (walk_blocks), from the walk's slots
    alone: their positions and chain are TreeWalk.check's, on the whole tree."""
    walked = tree_core.walk_for_kv_canary(True, False)
    return walk_blocks(_ints(walked.slot_indices), page_size)


def free_block_order(allocator: Any, evictable: Sequence[int]) -> tuple[int, ...]:
    """The spec's free queue: the allocator's free pages in the order it hands them out
    (free_pages front first, then pages held back for sorting, if any; slot ids when
    page_size is 1), then the radix cache's evictable blocks (by block id: SGLang's Rust
    tree core does not expose its least-recently-used order; docs/ENGINES.md, "SGLang under the
    spec")."""
    return (*_allocator_free_blocks(allocator), *evictable)


def _allocator_free_blocks(allocator: Any) -> tuple[int, ...]:
    """The allocator's part of free_block_order: free_pages, then release_pages."""
    blocks = [page - 1 for page in _ints(allocator.free_pages)]
    released = getattr(allocator, "release_pages", None)
    if released is not None:
        blocks += [page - 1 for page in _ints(released)]
    return tuple(blocks)


@dataclass
class _FreePages:
    """_allocator_free_blocks, read again only when the allocator's free-page tensors
    changed: SGLang's allocator puts new tensors in place on every allocation and free
    (a slice, a cat, a sort), and torch counts every in-place write to a tensor (or a
    view sharing its storage) in its _version, so the same tensor objects at the same
    versions hold the same pages. The tensors are held, so their ids are not reused."""

    _tensors: tuple[Any, Any] = (None, None)
    _versions: tuple[int, int] = (-1, -1)
    _blocks: tuple[int, ...] = ()

    def of(self, allocator: Any) -> tuple[int, ...]:
        free = allocator.free_pages
        released = getattr(allocator, "release_pages", None)
        versions = (_version(free), _version(released))
        if (
            free is self._tensors[0]
            and released is self._tensors[1]
            and versions == self._versions
            and -1 not in versions[: 1 if released is None else 2]
        ):
            return self._blocks
        self._blocks = _allocator_free_blocks(allocator)
        self._tensors, self._versions = (free, released), versions
        return self._blocks


def _version(values: Any) -> int:
    """A tensor's in-place write count; -1 for anything else (never taken as unchanged)."""
    found = getattr(values, "_version", -1)
    return found if isinstance(found, int) else -1


@dataclass
class KVReads:
    """The spec's KVState of SGLang's pool and radix cache (`read`), with what did not
    change since the last read kept: the allocator's free pages (_FreePages), and the
    radix cache's block hashes while its walk and the slot records it is checked
    against (SlotContents.version) are the same."""

    contents: SlotContents
    num_blocks: int
    _free: _FreePages = field(default_factory=_FreePages)
    _walked: tuple[TreeWalk, int] | None = None  # the last walk checked, at this version
    _hashes: tuple[BlockHash | None, ...] = ()
    _prefix_cache: tuple[tuple[BlockHash, tuple[int, ...]], ...] = ()

    def read(self, scheduler: Any, requests: Mapping[str, RequestState]) -> KVState:
        """Each block's holders counted from the requests' tables, the radix cache's
        blocks with the content their holders wrote (the tree held to it first:
        TreeWalk.check), the free queue (free_block_order)."""
        num_blocks, page_size = self.num_blocks, self.contents.page_size
        held = [0] * num_blocks
        for request in requests.values():
            for block in request.block_ids:
                if 0 <= block < num_blocks:
                    held[block] += 1
        evictable: tuple[int, ...] = ()
        if scheduler.tree_cache.disable:
            hashes: tuple[BlockHash | None, ...] = (None,) * num_blocks
            prefix_cache: tuple[tuple[BlockHash, tuple[int, ...]], ...] = ()
        else:
            core = scheduler.tree_cache.tree_core
            hashes, prefix_cache = self._tree(TreeWalk.of(core, unlocked_only=False))
            evictable = evictable_blocks(core, page_size)
        return KVState(
            num_blocks=num_blocks,
            free_block_ids=(*self._free.of(scheduler.token_to_kv_pool_allocator), *evictable),
            ref_counts=tuple(held),
            block_hashes=hashes,
            prefix_cache=prefix_cache,
        )

    def _tree(
        self, walk: TreeWalk
    ) -> tuple[tuple[BlockHash | None, ...], tuple[tuple[BlockHash, tuple[int, ...]], ...]]:
        """The block hashes and prefix cache of the tree `walk` walked, checked."""
        walked = (walk, self.contents.version)
        if walked == self._walked:
            return self._hashes, self._prefix_cache
        contents = self.contents
        walk.check(contents)
        hashes: list[BlockHash | None] = [None] * self.num_blocks
        cached: dict[BlockHash, list[int]] = {}
        for block in walk.blocks(contents.page_size):
            content = contents.content_of(block)
            hashes[block] = content
            cached.setdefault(content, []).append(block)
        self._hashes = tuple(hashes)
        self._prefix_cache = tuple((h, tuple(blocks)) for h, blocks in cached.items())
        self._walked = walked
        return self._hashes, self._prefix_cache
