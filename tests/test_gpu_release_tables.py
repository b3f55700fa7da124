"""release_tables frees many requests at once exactly as freeing them one by one would.

The batched release orders each instance's freed requests by rank (ties in slot
order) with two stable sorts of the freed requests and packs their blocks; here
it is compared, on states a swarm workload left behind, with release_tables
called once per request in that order. Ranks are drawn with ties, negative
values and values far apart, as the public finish_requests allows. The packed
release of update_from_output's finished rows (release_rows) is compared with
release_tables given the same requests as a mask.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from schedspec.gpu_impl.batch_state import BIG, BatchState
from schedspec.gpu_impl.block_ops import release_rows, release_tables
from schedspec.gpu_impl.engine import BatchedScheduler
from schedspec.gpu_impl.swarm_workload import SwarmWorkload
from schedspec.spec import SchedulerConfig

CONFIG = SchedulerConfig(
    block_size=2,
    num_blocks=32,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=16,
    enable_prefix_caching=True,
)


def _busy_state(seed: int) -> BatchState:
    engine = BatchedScheduler(CONFIG, batch=12, slots=6, device="cpu")
    workload = SwarmWorkload(engine, seed, torch.arange(12))
    for _ in range(12):
        workload.tick()
    return engine.state


def _copy(state: BatchState) -> BatchState:
    return dataclasses.replace(
        state, **{f.name: getattr(state, f.name).clone() for f in dataclasses.fields(state)}
    )


def _queues(state: BatchState) -> list[list[int]]:
    """Each instance's free queue in order (keys may be renumbered; the order may not)."""
    queues = []
    for keys in state.free_key:
        free = torch.nonzero(keys < BIG).squeeze(1)
        queues.append(free[torch.argsort(keys[free])].tolist())
    return queues


def _one_by_one(state: BatchState, mask: torch.Tensor, rank: torch.Tensor) -> None:
    for i in range(mask.shape[0]):
        slots = torch.nonzero(mask[i]).squeeze(1).tolist()
        for slot in sorted(slots, key=lambda s: (int(rank[i, s]), s)):
            alone = torch.zeros((1, mask.shape[1]), dtype=torch.bool)
            alone[0, slot] = True
            release_tables(state, torch.tensor([i]), alone, rank[i : i + 1])


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_a_batched_release_matches_one_request_at_a_time(seed: int) -> None:
    state = _busy_state(seed)
    draw = torch.Generator().manual_seed(seed)
    held = state.num_held > 0
    mask = held & (torch.rand(held.shape, generator=draw) < 0.7)
    # Few distinct values (ties), negatives, and values far apart.
    choices = torch.tensor([-(2**40), -3, 0, 0, 1, 2, 5, 2**40])
    rank = choices[torch.randint(0, len(choices), held.shape, generator=draw)]
    assert int(mask.sum()) > mask.shape[0]  # several requests per instance on average
    batched, single = _copy(state), _copy(state)
    release_tables(batched, torch.arange(mask.shape[0]), mask, rank)
    _one_by_one(single, mask, rank)
    for field in ("table", "num_held", "num_cached_block", "ref_cnt", "block_hash", "num_free"):
        assert torch.equal(getattr(batched, field), getattr(single, field)), field
    assert _queues(batched) == _queues(single)


def test_a_subset_of_instances_is_released_in_rank_order_within_each() -> None:
    state = _busy_state(7)
    inst = torch.tensor([9, 2, 5])  # any order: the rows follow inst
    held = state.num_held.index_select(0, inst) > 0
    rank = torch.arange(held.shape[1]).flip(0).expand_as(held).contiguous()
    batched, single = _copy(state), _copy(state)
    release_tables(batched, inst, held, rank)
    for k, i in enumerate(inst.tolist()):
        for slot in sorted(torch.nonzero(held[k]).squeeze(1).tolist(), reverse=True):
            alone = torch.zeros((1, held.shape[1]), dtype=torch.bool)
            alone[0, slot] = True
            release_tables(single, torch.tensor([i]), alone, rank[k : k + 1])
    for field in ("table", "num_held", "ref_cnt", "block_hash", "num_free"):
        assert torch.equal(getattr(batched, field), getattr(single, field)), field
    assert _queues(batched) == _queues(single)


@pytest.mark.parametrize("seed", [0, 3, 6])
def test_the_packed_release_of_finished_rows_matches_release_tables(seed: int) -> None:
    """release_rows (update_from_output's finished requests, given as ascending flat rows
    with a plan's ranks: distinct within an instance, in [0, S)) frees what
    release_tables frees for the same requests as a mask, in the same order."""
    state = _busy_state(seed)
    draw = torch.Generator().manual_seed(seed)
    held = state.num_held > 0
    mask = held & (torch.rand(held.shape, generator=draw) < 0.7)
    # A permutation of 0..S-1 per instance: the ranks a step gives its requests.
    rank = torch.argsort(torch.rand(held.shape, generator=draw), dim=1)
    assert int(mask.sum()) > mask.shape[0]
    packed, masked = _copy(state), _copy(state)
    rows = torch.nonzero(mask.reshape(-1)).squeeze(1)
    release_rows(packed, rows, rank.reshape(-1)[rows])
    release_tables(masked, torch.arange(mask.shape[0]), mask, rank)
    for field in ("table", "num_held", "num_cached_block", "ref_cnt", "block_hash", "num_free"):
        assert torch.equal(getattr(packed, field), getattr(masked, field)), field
    assert _queues(packed) == _queues(masked)
