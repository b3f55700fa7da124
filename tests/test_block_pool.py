"""BlockPool: ref counts, the free queue's front/back discipline and the prefix-cache map.

Hashes here are small made-up ints; only their identity matters to the pool.
"""

from __future__ import annotations

import pytest

from schedspec.reference import BlockPool
from tests.kv_helpers import cache_map, free_ids, ids

HA, HB, HC, HD = 0xA, 0xB, 0xC, 0xD


def pool_refs(pool: BlockPool) -> list[int]:
    return [b.ref_cnt for b in pool.blocks]


class TestGetNewBlocks:
    def test_takes_from_the_front_and_sets_ref_one(self) -> None:
        pool = BlockPool(6, enable_caching=True)
        assert ids(pool.get_new_blocks(2)) == [0, 1]
        assert pool_refs(pool) == [1, 1, 0, 0, 0, 0]
        assert free_ids(pool) == [2, 3, 4, 5]
        assert ids(pool.get_new_blocks(3)) == [2, 3, 4]
        assert free_ids(pool) == [5]
        assert pool.get_num_free_blocks() == 1

    def test_takes_the_front_even_after_reordering(self) -> None:
        pool = BlockPool(6, enable_caching=False)
        first = pool.get_new_blocks(3)  # [0, 1, 2]; free [3, 4, 5]
        pool.free_blocks([first[1]])  # unhashed -> front: [1, 3, 4, 5]
        assert ids(pool.get_new_blocks(2)) == [1, 3]
        assert free_ids(pool) == [4, 5]

    def test_too_many_raises_and_changes_nothing(self) -> None:
        pool = BlockPool(4, enable_caching=True)
        pool.get_new_blocks(3)
        with pytest.raises(RuntimeError):
            pool.get_new_blocks(2)
        assert free_ids(pool) == [3]
        assert pool_refs(pool) == [1, 1, 1, 0]

    def test_usage(self) -> None:
        pool = BlockPool(8, enable_caching=True)
        assert pool.get_usage() == 0.0
        pool.get_new_blocks(2)
        assert pool.get_usage() == 0.25


class TestTouch:
    def test_free_cached_block_leaves_the_queue_and_gains_a_reference(self) -> None:
        pool = BlockPool(6, enable_caching=True)
        a = pool.get_new_blocks(3)  # [0, 1, 2]
        pool.cache_full_blocks(a, [HA, HB], num_cached=0, num_full=2)  # 0:HA 1:HB, 2 partial
        pool.free_blocks([a[2], a[1], a[0]])  # tail first
        # 2 is unhashed -> front; 1 then 0 are hashed -> back.
        assert free_ids(pool) == [2, 3, 4, 5, 1, 0]

        pool.touch([a[1]])
        assert a[1].ref_cnt == 1
        assert free_ids(pool) == [2, 3, 4, 5, 0]
        assert pool.get_num_free_blocks() == 5
        # A touched block keeps its cached content.
        assert a[1].block_hash == HB
        assert pool.get_cached_block(HB) is a[1]

        pool.touch([a[1]])  # now held: just another reference
        assert a[1].ref_cnt == 2
        assert free_ids(pool) == [2, 3, 4, 5, 0]

    def test_held_block_just_increments(self) -> None:
        pool = BlockPool(4, enable_caching=True)
        (b0,) = pool.get_new_blocks(1)
        pool.touch([b0])
        pool.touch([b0])
        assert b0.ref_cnt == 3
        assert free_ids(pool) == [1, 2, 3]

    def test_several_blocks_at_once(self) -> None:
        pool = BlockPool(5, enable_caching=True)
        a = pool.get_new_blocks(3)
        pool.cache_full_blocks(a, [HA, HB, HC], 0, 3)
        pool.free_blocks([a[2], a[1], a[0]])  # [3, 4, 2, 1, 0]
        pool.touch([a[0], a[1]])
        assert free_ids(pool) == [3, 4, 2]
        assert pool_refs(pool) == [1, 1, 0, 0, 0]


class TestFreeBlocks:
    def test_unhashed_blocks_go_to_the_front_in_the_order_given(self) -> None:
        pool = BlockPool(6, enable_caching=True)
        b = pool.get_new_blocks(4)  # free [4, 5]
        pool.free_blocks([b[3], b[1], b[2]])
        assert free_ids(pool) == [3, 1, 2, 4, 5]
        assert pool_refs(pool) == [1, 0, 0, 0, 0, 0]

    def test_hashed_blocks_go_to_the_back_oldest_freed_first(self) -> None:
        pool = BlockPool(6, enable_caching=True)
        b = pool.get_new_blocks(4)
        pool.cache_full_blocks(b, [HA, HB, HC, HD], 0, 4)
        pool.free_blocks([b[3], b[1]])
        assert free_ids(pool) == [4, 5, 3, 1]
        pool.free_blocks([b[2], b[0]])
        assert free_ids(pool) == [4, 5, 3, 1, 2, 0]
        # LRU: the never-used blocks go first, then the earliest-freed cached one.
        assert ids(pool.get_new_blocks(3)) == [4, 5, 3]
        assert cache_map(pool) == {HA: [0], HB: [1], HC: [2]}

    def test_mixed_call_splits_front_and_back(self) -> None:
        pool = BlockPool(6, enable_caching=True)
        b = pool.get_new_blocks(4)
        pool.cache_full_blocks([b[0], b[2]], [HA, HC], 0, 2)  # 0 and 2 cached
        pool.free_blocks([b[3], b[2], b[1], b[0]])
        # Unhashed [3, 1] before everything, hashed [2, 0] after everything.
        assert free_ids(pool) == [3, 1, 4, 5, 2, 0]

    def test_only_a_ref_count_reaching_zero_frees(self) -> None:
        pool = BlockPool(4, enable_caching=True)
        b = pool.get_new_blocks(2)
        pool.touch([b[0]])  # ref 2: held by two tables
        pool.free_blocks([b[1], b[0]])
        assert pool_refs(pool) == [1, 0, 0, 0]
        assert free_ids(pool) == [1, 2, 3]
        pool.free_blocks([b[0]])
        assert free_ids(pool) == [0, 1, 2, 3]

    def test_caching_disabled_puts_every_freed_block_at_the_front(self) -> None:
        pool = BlockPool(6, enable_caching=False)
        b = pool.get_new_blocks(3)
        # Even a block carrying a hash is not worth keeping without caching.
        pool.cache_full_blocks(b, [HA], 0, 1)
        pool.free_blocks([b[2], b[1], b[0]])
        assert free_ids(pool) == [2, 1, 0, 3, 4, 5]

    def test_freeing_more_often_than_held_is_refused(self) -> None:
        pool = BlockPool(2, enable_caching=True)
        (b0,) = pool.get_new_blocks(1)
        pool.free_blocks([b0])
        with pytest.raises(AssertionError, match="freed more often than held"):
            pool.free_blocks([b0])


class TestPrefixCacheMap:
    def test_cache_full_blocks_registers_only_the_given_range(self) -> None:
        pool = BlockPool(4, enable_caching=True)
        b = pool.get_new_blocks(4)
        pool.cache_full_blocks(b, [HA, HB, HC, HD], num_cached=1, num_full=3)
        assert [x.block_hash for x in b] == [None, HB, HC, None]
        assert cache_map(pool) == {HB: [1], HC: [2]}

    def test_a_block_cannot_be_registered_twice(self) -> None:
        pool = BlockPool(2, enable_caching=True)
        b = pool.get_new_blocks(1)
        pool.cache_full_blocks(b, [HA], 0, 1)
        with pytest.raises(AssertionError, match="already cached"):
            pool.cache_full_blocks(b, [HB], 0, 1)

    def test_get_cached_block_returns_the_oldest_holder(self) -> None:
        pool = BlockPool(4, enable_caching=True)
        b = pool.get_new_blocks(3)
        # Block 2 gets HA first, block 0 later (a recomputed duplicate).
        pool.cache_full_blocks([b[2]], [HA], 0, 1)
        pool.cache_full_blocks([b[0]], [HA], 0, 1)
        assert cache_map(pool) == {HA: [2, 0]}
        assert pool.get_cached_block(HA) is b[2]  # insertion order, not id order
        assert pool.get_cached_block(HB) is None

    def test_reusing_a_cached_free_block_evicts_only_that_block(self) -> None:
        pool = BlockPool(4, enable_caching=True)
        b = pool.get_new_blocks(3)  # [0, 1, 2]; free [3]
        pool.cache_full_blocks([b[2]], [HA], 0, 1)
        pool.cache_full_blocks([b[0]], [HA], 0, 1)
        pool.cache_full_blocks([b[1]], [HB], 0, 1)
        pool.free_blocks([b[2], b[1], b[0]])  # all hashed -> back
        assert free_ids(pool) == [3, 2, 1, 0]

        # Block 2 is handed out again: its entry under HA goes, block 0's stays.
        assert ids(pool.get_new_blocks(2)) == [3, 2]
        assert b[2].block_hash is None
        assert b[2].ref_cnt == 1
        assert cache_map(pool) == {HA: [0], HB: [1]}
        assert pool.get_cached_block(HA) is b[0]

        # The last holders go: the hashes disappear from the map entirely.
        assert ids(pool.get_new_blocks(2)) == [1, 0]
        assert cache_map(pool) == {}
        assert pool.get_cached_block(HA) is None
        assert pool.get_cached_block(HB) is None
        assert [x.block_hash for x in pool.blocks] == [None] * 4

    def test_held_cached_block_is_never_evicted(self) -> None:
        pool = BlockPool(3, enable_caching=True)
        b = pool.get_new_blocks(1)
        pool.cache_full_blocks(b, [HA], 0, 1)
        assert ids(pool.get_new_blocks(2)) == [1, 2]
        assert cache_map(pool) == {HA: [0]}
        assert pool.get_cached_block(HA) is b[0]
