"""The prefix-cache index (gpu_impl/prefix_index.py), by worked examples on one small pool.

The pool has 8 blocks, so each instance has 16 buckets and an id's home bucket is its
low 4 bits: `_id(home, tag)` makes ids with a chosen home that differ in their high bits.
After every example the index must agree with block_hash (the CACHE-INDEX device check).
"""

from __future__ import annotations

import pytest
import torch

from schedspec.gpu_impl import prefix_index
from schedspec.gpu_impl.batch_state import (
    EMPTY_BUCKET,
    NO_BUCKET,
    NO_HASH,
    TOMBSTONE,
    BatchState,
    empty_state,
    index_size,
)
from schedspec.gpu_impl.device_checks import cache_index
from schedspec.gpu_impl.engine import BatchedScheduler
from schedspec.gpu_impl.swarm_workload import SwarmWorkload
from schedspec.spec import SchedulerConfig

CONFIG = SchedulerConfig(
    block_size=2,
    num_blocks=8,
    max_num_batched_tokens=8,
    max_num_seqs=2,
    max_model_len=8,
    enable_prefix_caching=True,
)
H = index_size(CONFIG.num_blocks)
N = CONFIG.num_blocks


def _id(home: int, tag: int) -> int:
    """A content id whose home bucket is `home`; tags set high bits (bit 40 and up)."""
    return home + (tag << 40)


def _state(batch: int = 1) -> BatchState:
    return empty_state(CONFIG, batch, 1, 1, torch.device("cpu"))


def _register(state: BatchState, inst: int, holders: dict[int, int], first_seq: int = 0) -> None:
    """Blocks get content ids in one insert call ({block: id}), registered in that order."""
    for seq, (block, content) in enumerate(holders.items(), start=first_seq):
        state.block_hash[inst, block] = content
        state.reg_seq[inst, block] = seq
    prefix_index.insert(
        state, torch.tensor([inst * N + b for b in holders]), torch.tensor(list(holders.values()))
    )


def _evict(state: BatchState, inst: int, blocks: list[int]) -> None:
    """Blocks lose their ids, as take_free_blocks and uncache_uncomputed do it (forget
    clears their block_hash itself)."""
    prefix_index.forget(state, torch.tensor([inst * N + b for b in blocks]))
    assert (state.block_hash[inst, blocks] == NO_HASH).all()


def _find(state: BatchState, inst: int, ids: list[int]) -> list[int]:
    """The oldest holder of each id, -1 where none."""
    query = torch.tensor([ids])
    found, holder = prefix_index.find(
        state, torch.tensor([inst]), query, torch.ones_like(query, dtype=torch.bool)
    )
    return torch.where(found, holder, -1)[0].tolist()


def _assert_consistent(state: BatchState) -> None:
    assert not cache_index(state, CONFIG).any()


def test_index_size_is_a_power_of_two_at_least_twice_the_blocks() -> None:
    assert [index_size(n) for n in (1, 2, 3, 8, 9, 256)] == [2, 4, 8, 16, 32, 512]


def test_an_inserted_block_sits_at_its_home_and_is_found() -> None:
    st = _state()
    a = _id(5, 7)
    _register(st, 0, {3: a})
    assert st.cache_index[0, 5] == 3 and st.cache_bucket[0, 3] == 5
    assert st.cache_reach.tolist() == [1]
    assert _find(st, 0, [a, _id(6, 7)]) == [3, -1]
    _assert_consistent(st)


def test_a_deleted_entry_leaves_a_tombstone_that_the_next_insert_reuses() -> None:
    st = _state()
    a, b = _id(5, 1), _id(5, 2)
    _register(st, 0, {3: a})
    _evict(st, 0, [3])
    assert st.cache_index[0, 5] == TOMBSTONE and st.cache_bucket[0, 3] == NO_BUCKET
    assert st.cache_deleted.tolist() == [1]
    assert _find(st, 0, [a]) == [-1]
    _assert_consistent(st)
    _register(st, 0, {6: b})
    assert st.cache_index[0, 5] == 6
    _assert_consistent(st)


def test_forgetting_a_block_without_an_id_changes_nothing() -> None:
    st = _state()
    _register(st, 0, {3: _id(5, 1)})
    before = st.cache_index.clone()
    _evict(st, 0, [4])
    assert torch.equal(st.cache_index, before) and st.cache_deleted.tolist() == [0]


def test_two_ids_with_one_home_in_one_call_both_get_in() -> None:
    """Blocks 2 and 1 propose bucket 4 in the same round: the larger block id takes it,
    the other goes on to bucket 5 (a reach of 2); both are found."""
    st = _state()
    a, b = _id(4, 1), _id(4, 2)
    _register(st, 0, {2: a, 1: b})
    assert st.cache_index[0, 4:6].tolist() == [2, 1]
    assert st.cache_reach.tolist() == [2]
    assert _find(st, 0, [a, b]) == [2, 1]
    _assert_consistent(st)


def test_ids_sharing_their_low_bits_are_told_apart_in_full() -> None:
    """Same home, high bits differ: holding one is no hit for the other."""
    st = _state()
    a, impostor = _id(9, 3), _id(9, 4)
    assert a % 2**32 == impostor % 2**32
    _register(st, 0, {0: impostor})
    assert _find(st, 0, [a, impostor]) == [-1, 0]


def test_among_many_holders_of_one_id_the_oldest_wins() -> None:
    """Blocks 6, 2, 4 hold id x (registered 9th, 4th, 7th), another id sits between them
    in the run: the lookup takes block 2; once block 2 is evicted, block 4."""
    st = _state()
    x, y = _id(1, 1), _id(1, 2)
    _register(st, 0, {6: x}, first_seq=9)
    _register(st, 0, {5: y}, first_seq=5)
    _register(st, 0, {2: x}, first_seq=4)
    _register(st, 0, {4: x}, first_seq=7)
    assert st.cache_index[0, 1:5].tolist() == [6, 5, 2, 4]
    assert _find(st, 0, [x, y]) == [2, 5]
    _evict(st, 0, [2])
    assert _find(st, 0, [x]) == [4]
    _assert_consistent(st)


def test_the_run_goes_on_past_a_tombstone() -> None:
    """a at bucket 3, b (same home) pushed to 4; a is evicted. Emptying bucket 3 would hide
    b from a lookup that stops at the first empty bucket; the tombstone does not."""
    st = _state()
    a, b = _id(3, 1), _id(3, 2)
    _register(st, 0, {0: a})
    _register(st, 0, {1: b})
    _evict(st, 0, [0])
    assert st.cache_index[0, 3:5].tolist() == [TOMBSTONE, 1]
    assert _find(st, 0, [b]) == [1]
    _assert_consistent(st)
    st.cache_index[0, 3] = EMPTY_BUCKET  # what deleting without a tombstone would leave
    assert cache_index(st, CONFIG).tolist() == [True]


def test_probes_wrap_around_the_end_of_the_row() -> None:
    st = _state()
    a, b = _id(H - 1, 1), _id(H - 1, 2)
    _register(st, 0, {4: a, 5: b})
    assert st.cache_index[0, H - 1] == 5 and st.cache_index[0, 0] == 4
    assert _find(st, 0, [a, b]) == [4, 5]
    _assert_consistent(st)


def test_a_lookup_reads_past_its_first_window_only_up_to_the_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six ids share home 0: they fill buckets 0-5 (reach 6). An id found at bucket 5 lies
    past the first window (_FIRST_WIDTH, under six); the second pass reads exactly the
    buckets left up to the reach.
    An id whose window ends on an empty bucket needs no second pass."""
    st = _state()
    ids = [_id(0, tag) for tag in range(1, 7)]
    _register(st, 0, dict(enumerate(ids)))
    assert st.cache_reach.tolist() == [6]
    widths: list[tuple[int, int]] = []
    probe = prefix_index._probe

    def recording(
        state: BatchState, rows: torch.Tensor, query: torch.Tensor, start: int, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        widths.append((start, width))
        return probe(state, rows, query, start, width)

    monkeypatch.setattr(prefix_index, "_probe", recording)
    assert _find(st, 0, [ids[5]]) == [5]
    first = prefix_index._FIRST_WIDTH
    assert widths == [(0, first), (first, 6 - first)]
    widths.clear()
    assert _find(st, 0, [_id(8, 1)]) == [-1]
    assert widths == [(0, first)]


def test_a_row_worn_by_deletions_is_rebuilt_by_the_forget_that_wears_it() -> None:
    """Six ids with home 0 fill buckets 0-5 (block 5 at 0, block 0 at 5: the larger
    block wins a bucket). Four evictions (H / 4 = 4) leave tombstones; the fifth wears
    the row, and that forget rebuilds it from block_hash without the evicted blocks:
    the survivor moves home, the tombstones go, and the reach drops back to 1.
    Instance 1, holding the same ids, is left alone."""
    st = _state(batch=2)
    ids = [_id(0, tag) for tag in range(1, 7)]
    _register(st, 0, dict(enumerate(ids)))
    _register(st, 1, dict(enumerate(ids)))
    assert st.cache_index[0, :6].tolist() == [5, 4, 3, 2, 1, 0]
    _evict(st, 0, [2, 3, 4, 5])
    assert st.cache_deleted.tolist() == [4, 0]
    assert st.cache_index[0, :4].tolist() == [TOMBSTONE] * 4
    _assert_consistent(st)
    _evict(st, 0, [1])
    assert st.cache_deleted.tolist() == [0, 0]
    assert st.cache_index[0].tolist() == [0] + [EMPTY_BUCKET] * 15
    assert st.cache_reach.tolist() == [1, 6]
    assert _find(st, 0, [ids[0], ids[1]]) == [0, -1]
    _assert_consistent(st)
    _register(st, 0, {6: _id(9, 1)})
    assert st.cache_index[0, 9] == 6 and st.cache_deleted.tolist() == [0, 0]
    _assert_consistent(st)


def test_forget_over_blocks_with_and_without_ids_clears_only_the_ids() -> None:
    """One call over blocks of two instances, some holding ids and some not (eviction
    as take_free_blocks meets it): the holders' entries become tombstones and their
    block_hash NO_HASH; the others and the other blocks stay as they were."""
    st = _state(batch=2)
    _register(st, 0, {1: _id(3, 1), 2: _id(4, 1)})
    _register(st, 1, {5: _id(3, 1)})
    before = st.block_hash.clone()
    prefix_index.forget(st, torch.tensor([0 * N + 1, 0 * N + 6, 1 * N + 5, 1 * N + 0]))
    expected = before.clone()
    expected[0, 1] = expected[1, 5] = NO_HASH
    assert torch.equal(st.block_hash, expected)
    assert st.cache_index[0, 3] == TOMBSTONE and st.cache_index[0, 4] == 2
    assert st.cache_index[1, 3] == TOMBSTONE
    assert st.cache_deleted.tolist() == [1, 1]
    assert _find(st, 0, [_id(3, 1), _id(4, 1)]) == [-1, 2]
    _assert_consistent(st)


def test_instances_of_one_call_never_meet() -> None:
    """The same ids inserted into two instances in one call land in the same buckets of
    each: an instance's layout depends on its own history only."""
    st = _state(batch=2)
    ids = {1: _id(2, 1), 3: _id(2, 2), 0: _id(7, 1)}
    for inst in (0, 1):
        for block, content in ids.items():
            st.block_hash[inst, block] = content
    prefix_index.insert(
        st,
        torch.tensor([i * N + b for i in (0, 1) for b in ids]),
        torch.tensor([content for _ in (0, 1) for content in ids.values()]),
    )
    assert torch.equal(st.cache_index[0], st.cache_index[1])
    assert st.cache_index[0, 2:4].tolist() == [3, 1]
    _assert_consistent(st)


def test_a_busy_engine_keeps_the_index_in_step_with_block_hash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small pool under the swarm workload evicts cached blocks, reuses tombstones and
    rebuilds rows: after every tick the index agrees with block_hash."""
    config = SchedulerConfig(
        block_size=2,
        num_blocks=16,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        max_model_len=16,
        enable_prefix_caching=True,
    )
    engine = BatchedScheduler(config, batch=32, slots=6, device="cpu")
    workload = SwarmWorkload(engine, 3, torch.arange(32))
    rebuilt: list[int] = []
    rebuild = prefix_index.rebuild

    def counting(state: BatchState, inst: torch.Tensor) -> None:
        rebuilt.append(inst.numel())
        rebuild(state, inst)

    monkeypatch.setattr(prefix_index, "rebuild", counting)
    deleted = 0
    for _ in range(60):
        workload.tick()
        assert not cache_index(engine.state, config).any()
        deleted += int(engine.state.cache_deleted.sum())
    assert deleted > 0 and sum(rebuilt) > 0
