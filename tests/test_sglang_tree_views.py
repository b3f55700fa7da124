"""The SGLang reference's radix tree computes its snapshot views (every page's chain
hash, the eviction order) once per change to the tree, not once per snapshot
(reference/sglang/radix_tree.py). The cache must never be stale: on the suite's own
workloads, every snapshot's views equal the ones computed afresh."""

from __future__ import annotations

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.properties.strategies.configs import family_configs
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.reference.sglang.radix_tree import RadixTree
from schedspec.reference.sglang.scheduler import SGLangScheduler
from schedspec.reference.sglang.slot_pool import SlotPool
from schedspec.spec import State


def test_the_cached_views_are_the_fresh_ones_at_every_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[tuple[int, int]] = []  # (pages hashed, pages evictable) per snapshot
    snapshot = SGLangScheduler.snapshot

    def checked_snapshot(self: SGLangScheduler) -> State:
        tree: RadixTree = self.kv.tree
        assert tree.page_hashes() == tuple(tree._page_hashes())
        assert tree.eviction_order() == tuple(tree._eviction_order())
        compared.append((len(tree.page_hashes()), len(tree.eviction_order())))
        return snapshot(self)

    monkeypatch.setattr(SGLangScheduler, "snapshot", checked_snapshot)
    result = run_suite(
        reference_engine,
        "sglang",
        SuiteSettings(examples=25, seed=7),
        family_configs("sglang"),
    )
    assert result.passed
    # Not vacuous: trees with cached and with evictable pages were compared.
    assert sum(hashed > 0 for hashed, _ in compared) > 100
    assert sum(evictable > 0 for _, evictable in compared) > 100


def test_a_change_to_the_tree_is_seen_by_the_next_view() -> None:
    """A worked example: insert, then lock, then unlock; each view follows."""
    pool = SlotPool(num_pages=8, page_size=2)
    tree = RadixTree(pool, enabled=True)
    pages = pool.alloc(2)
    _, node = tree.insert([1, 2, 3, 4], pages, 0)
    assert [page for page, _ in tree.page_hashes()] == list(pages)
    assert tree.eviction_order() == tuple(pages)
    tree.lock(node)
    assert tree.eviction_order() == ()
    tree.unlock(node)
    assert tree.eviction_order() == tuple(pages)


def test_a_match_that_only_stamps_reorders_the_next_eviction_view() -> None:
    """Two leaves, the older first to go; a match of the older (no lock, no insert: the
    waiting queue's prefix refresh does this) makes it the newer."""
    pool = SlotPool(num_pages=8, page_size=2)
    tree = RadixTree(pool, enabled=True)
    first, second = pool.alloc(1), pool.alloc(1)
    tree.insert([1, 2], first, 0)
    tree.insert([3, 4], second, 0)
    assert tree.eviction_order() == (*first, *second)
    tree.match_prefix([1, 2])
    assert tree.eviction_order() == (*second, *first)
