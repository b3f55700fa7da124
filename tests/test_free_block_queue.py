"""FreeBlockQueue: the doubly linked free list, front = reused first."""

from __future__ import annotations

import pytest

from schedspec.reference import FreeBlockQueue, KVCacheBlock
from tests.kv_helpers import ids, queue_ids


def make_queue(n: int) -> tuple[list[KVCacheBlock], FreeBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeBlockQueue(blocks)


def assert_linked(queue: FreeBlockQueue) -> None:
    """Forward and backward links agree and the count matches the walk."""
    walked = list(queue)
    assert len(walked) == len(queue) == queue.num_free_blocks
    # The snapshot's ids, kept between changes: called after each change, this also
    # shows that every change drops the kept answer.
    assert queue.block_ids() == tuple(block.block_id for block in walked)
    for block in walked:
        assert block.prev_free is not None and block.next_free is not None
        assert block.prev_free.next_free is block
        assert block.next_free.prev_free is block


def assert_unlinked(*blocks: KVCacheBlock) -> None:
    for block in blocks:
        assert block.prev_free is None and block.next_free is None


class TestInitialOrder:
    def test_blocks_are_queued_in_the_order_given(self) -> None:
        _, queue = make_queue(5)
        assert queue_ids(queue) == [0, 1, 2, 3, 4]
        assert len(queue) == 5
        assert_linked(queue)

    def test_an_arbitrary_order_is_kept(self) -> None:
        blocks = [KVCacheBlock(i) for i in (3, 0, 4)]
        assert queue_ids(FreeBlockQueue(blocks)) == [3, 0, 4]

    def test_empty_queue(self) -> None:
        _, queue = make_queue(0)
        assert queue_ids(queue) == []
        assert len(queue) == 0


class TestPopleftN:
    def test_takes_from_the_front_in_order(self) -> None:
        _, queue = make_queue(5)
        taken = queue.popleft_n(2)
        assert ids(taken) == [0, 1]
        assert queue_ids(queue) == [2, 3, 4]
        assert len(queue) == 3
        assert_unlinked(*taken)
        assert_linked(queue)

    def test_zero_takes_nothing(self) -> None:
        _, queue = make_queue(3)
        assert queue.popleft_n(0) == []
        assert queue_ids(queue) == [0, 1, 2]
        assert_linked(queue)

    def test_all_empties_the_queue_and_it_can_refill(self) -> None:
        blocks, queue = make_queue(3)
        assert ids(queue.popleft_n(3)) == [0, 1, 2]
        assert queue_ids(queue) == []
        assert len(queue) == 0
        queue.append_n([blocks[2], blocks[0]])
        assert queue_ids(queue) == [2, 0]
        assert_linked(queue)

    def test_too_many_raises_and_changes_nothing(self) -> None:
        blocks, queue = make_queue(5)
        queue.remove(blocks[1])  # [0, 2, 3, 4]
        with pytest.raises(RuntimeError, match="asked for 5 free blocks, only 4 free"):
            queue.popleft_n(5)
        assert queue_ids(queue) == [0, 2, 3, 4]
        assert len(queue) == 4
        assert_linked(queue)
        assert_unlinked(blocks[1])


class TestRemove:
    def test_from_the_middle_relinks_the_neighbours(self) -> None:
        blocks, queue = make_queue(5)
        queue.remove(blocks[2])
        assert queue_ids(queue) == [0, 1, 3, 4]
        assert len(queue) == 4
        # O(1): the neighbours now point at each other directly.
        assert blocks[1].next_free is blocks[3]
        assert blocks[3].prev_free is blocks[1]
        assert_unlinked(blocks[2])
        assert_linked(queue)

    def test_first_and_last(self) -> None:
        blocks, queue = make_queue(5)
        queue.remove(blocks[0])
        queue.remove(blocks[4])
        assert queue_ids(queue) == [1, 2, 3]
        assert ids(queue.popleft_n(1)) == [1]  # the front moved to block 1
        assert_linked(queue)

    def test_removing_a_block_not_in_the_queue_raises_and_changes_nothing(self) -> None:
        blocks, queue = make_queue(4)
        queue.remove(blocks[2])
        with pytest.raises(RuntimeError, match="block 2 is not in the free queue"):
            queue.remove(blocks[2])
        taken = queue.popleft_n(1)
        with pytest.raises(RuntimeError, match="block 0 is not in the free queue"):
            queue.remove(taken[0])
        assert queue_ids(queue) == [1, 3]
        assert len(queue) == 2
        assert_linked(queue)


class TestPrependAndAppend:
    def test_prepend_n_keeps_the_given_order_at_the_front(self) -> None:
        _, queue = make_queue(5)
        taken = queue.popleft_n(3)  # [0, 1, 2]; queue [3, 4]
        queue.prepend_n([taken[2], taken[0], taken[1]])
        assert queue_ids(queue) == [2, 0, 1, 3, 4]
        assert ids(queue.popleft_n(1)) == [2]  # the first block given is reused first
        assert_linked(queue)

    def test_prepend_n_onto_an_empty_queue(self) -> None:
        blocks, queue = make_queue(2)
        queue.popleft_n(2)
        queue.prepend_n([blocks[1], blocks[0]])
        assert queue_ids(queue) == [1, 0]
        assert_linked(queue)

    def test_append_n_puts_blocks_at_the_back_in_order(self) -> None:
        _, queue = make_queue(5)
        taken = queue.popleft_n(2)  # [0, 1]; queue [2, 3, 4]
        queue.append_n([taken[1], taken[0]])
        assert queue_ids(queue) == [2, 3, 4, 1, 0]
        assert len(queue) == 5
        assert_linked(queue)

    def test_prepend_and_append_together(self) -> None:
        # Pop everything, then rebuild [4, 1 | 0, 3, 2]: prepends go before
        # anything already queued, appends after.
        blocks, queue = make_queue(5)
        queue.popleft_n(5)
        queue.append_n([blocks[0], blocks[3]])
        queue.prepend_n([blocks[4], blocks[1]])
        queue.append_n([blocks[2]])
        assert queue_ids(queue) == [4, 1, 0, 3, 2]
        assert_linked(queue)

    def test_empty_lists_are_no_ops(self) -> None:
        _, queue = make_queue(3)
        queue.prepend_n([])
        queue.append_n([])
        assert queue_ids(queue) == [0, 1, 2]
        assert len(queue) == 3
        assert_linked(queue)


class TestKeptBlockIds:
    """block_ids() keeps its answer until the queue changes: each change drops it."""

    @pytest.mark.parametrize("change", ["popleft_n", "remove", "append_n", "prepend_n"])
    def test_every_change_is_seen(self, change: str) -> None:
        blocks, queue = make_queue(4)
        taken = queue.popleft_n(1)
        assert queue.block_ids() == (1, 2, 3)  # kept from here
        if change == "popleft_n":
            queue.popleft_n(1)
        elif change == "remove":
            queue.remove(blocks[2])
        elif change == "append_n":
            queue.append_n(taken)
        else:
            queue.prepend_n(taken)
        assert queue.block_ids() == tuple(queue_ids(queue))
        assert_linked(queue)
