"""gpu_impl's rules on worked examples, and B instances stepping exactly as each would alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import schedspec.gpu_impl.hashing as hashing
from schedspec.adapters.gpu import GpuEngine
from schedspec.adapters.kit import HashCollisionError
from schedspec.adapters.reference import ReferenceEngine
from schedspec.gpu_impl import prefix_index
from schedspec.gpu_impl.admission import longest_cached_prefix
from schedspec.gpu_impl.batch_state import BIG, EMPTY
from schedspec.gpu_impl.block_ops import release_tables
from schedspec.gpu_impl.engine import BatchedScheduler, NewRequests
from schedspec.gpu_impl.hashing import extend_hashes
from schedspec.gpu_impl.swarm_workload import SwarmWorkload, WorkloadShape
from schedspec.spec import ModelRunnerOutput, Request, RequestError, SchedulerConfig
from tests.gpu_helpers import busy_swarm

CACHED = SchedulerConfig(
    block_size=2,
    num_blocks=8,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=16,
    enable_prefix_caching=True,
)


def _prefill(engine: GpuEngine, request: Request) -> None:
    engine.add_request(request)
    output = engine.schedule()
    engine.update_from_output(output, ModelRunnerOutput({request.request_id: [7]}))


class TestBlockPool:
    def test_a_freed_table_goes_tail_first_unhashed_to_the_front_hashed_to_the_back(
        self,
    ) -> None:
        engine = GpuEngine(CACHED, device="cpu")
        _prefill(engine, Request("a", (1, 2, 3, 4, 5), max_tokens=4))
        state = engine.snapshot()
        # Five prompt tokens and one sampled: blocks 0, 1 full and cached, 2 half.
        assert state.requests["a"].block_ids == (0, 1, 2)
        assert state.kv.block_hashes[:3] == (*state.kv.block_hashes[:2], None)
        engine.finish_requests(["a"])
        assert engine.snapshot().kv.free_block_ids == (2, 3, 4, 5, 6, 7, 1, 0)

    def test_new_blocks_come_from_the_front_and_hits_leave_the_queue(self) -> None:
        engine = GpuEngine(CACHED, device="cpu")
        _prefill(engine, Request("a", (1, 2, 3, 4, 5), max_tokens=4))
        engine.finish_requests(["a"])
        engine.add_request(Request("b", (1, 2, 3, 4, 9, 9), max_tokens=4))
        output = engine.schedule()
        # Two cached blocks hit (0 and 1, pulled out of the queue), the rest from the front.
        assert output.scheduled_new_reqs[0].block_ids == (0, 1, 2)
        assert output.scheduled_new_reqs[0].num_computed_tokens == 4
        assert engine.snapshot().kv.free_block_ids == (3, 4, 5, 6, 7)

    def test_the_same_moves_as_the_reference(self) -> None:
        # The worked example above, step for step beside the reference.
        engines: list[GpuEngine | ReferenceEngine] = [
            GpuEngine(CACHED, device="cpu"),
            ReferenceEngine(CACHED),
        ]
        for engine in engines:
            engine.add_request(Request("a", (1, 2, 3, 4, 5), max_tokens=4))
            output = engine.schedule()
            engine.update_from_output(output, ModelRunnerOutput({"a": [7]}))
            engine.finish_requests(["a"])
            engine.add_request(Request("b", (1, 2, 3, 4, 9, 9), max_tokens=4))
            engine.schedule()
        gpu, ref = (e.snapshot() for e in engines)
        assert gpu.kv == ref.kv
        assert gpu.requests == ref.requests


class TestContentIds:
    def test_equal_prefixes_share_ids_and_a_changed_token_changes_every_later_one(self) -> None:
        tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 5, 6]])
        zero = torch.zeros(2, dtype=torch.int64)
        _, done = extend_hashes(zero, zero, tokens, torch.tensor([6, 6]), 2, 16)
        ids = done.ids.view(2, 3)
        assert ids[0, 0] == ids[1, 0]  # (1, 2) in both
        assert (ids[0, 1:] != ids[1, 1:]).all()  # the chain differs from block 1 on
        assert done.index.tolist() == [0, 1, 2, 0, 1, 2]

    def test_hashing_in_pieces_equals_hashing_at_once(self) -> None:
        whole = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
        zero = torch.zeros(1, dtype=torch.int64)
        acc_all, all_at_once = extend_hashes(zero, zero, whole, torch.tensor([7]), 3, 16)
        acc, first = extend_hashes(zero, zero, whole[:, :4], torch.tensor([4]), 3, 16)
        acc, second = extend_hashes(acc, torch.tensor([4]), whole[:, 4:], torch.tensor([3]), 3, 16)
        assert torch.equal(torch.cat([first.ids, second.ids]), all_at_once.ids)
        assert torch.equal(acc, acc_all)

    def test_a_shared_int_start_hashes_as_a_start_per_row(self) -> None:
        # Fresh prompts pass start 0 for every row; padding may run past max_positions.
        tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])
        zero, count = torch.zeros(2, dtype=torch.int64), torch.tensor([7, 3])
        acc_int, by_int = extend_hashes(zero, 0, tokens, count, 3, 7)
        acc_rows, by_rows = extend_hashes(zero, zero, tokens, count, 3, 7)
        assert torch.equal(acc_int, acc_rows)
        assert by_int.row.tolist() == by_rows.row.tolist() == [0, 0, 1]
        assert by_int.index.tolist() == by_rows.index.tolist() == [0, 1, 0]
        assert torch.equal(by_int.ids, by_rows.ids)

    def test_one_prompt_expanded_hashes_as_its_copies(self) -> None:
        # A stride-0 batch (one row expanded) is mixed once; every row reads that row.
        row = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
        zero, count = torch.zeros(3, dtype=torch.int64), torch.tensor([8, 2, 5])
        acc_once, once = extend_hashes(zero, 0, row.expand(3, 8), count, 2, 16)
        acc_copies, copies = extend_hashes(zero, 0, row.repeat(3, 1), count, 2, 16)
        assert torch.equal(acc_once, acc_copies)
        assert once.row.tolist() == copies.row.tolist() == [0, 0, 0, 0, 1, 2, 2]
        assert torch.equal(once.index, copies.index) and torch.equal(once.ids, copies.ids)

    def test_prompts_of_power_of_two_tokens_sum_apart_as_chance_predicts(self) -> None:
        # 65,536 random prompts of 16 tokens from {0, 2**8, 2**16, 2**40} (tokens that
        # differ by powers of two). Their sums' low and high 24 bits collide about 128
        # times by chance (mix64's and this mix's, over five position salts: 105-158);
        # a token mix that is linear under a sum (one multiply and one fold) collides
        # about 12 million times in the high bits.
        generator = torch.Generator().manual_seed(0)
        digits = torch.randint(0, 4, (1 << 16, 16), generator=generator)
        tokens = torch.tensor([0, 1 << 8, 1 << 16, 1 << 40])[digits]
        zero = torch.zeros(tokens.shape[0], dtype=torch.int64)
        acc, _ = extend_hashes(zero, 0, tokens, torch.full_like(zero, 16), 4, 32)
        for window in (acc & (2**24 - 1), (acc >> 40) & (2**24 - 1)):
            _, counts = torch.unique(window, return_counts=True)
            assert int((counts * (counts - 1) // 2).sum()) < 2 * 128

    def test_a_device_id_collision_is_refused_not_trusted(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(
            hashing, "prefix_id", lambda acc, length: torch.zeros_like(acc)
        )  # every block gets id 0
        engine = GpuEngine(CACHED, device="cpu")
        engine.add_request(Request("a", (1, 2), max_tokens=2))
        with pytest.raises(HashCollisionError, match="the hash of other content"):
            engine.add_request(Request("b", (3, 4), max_tokens=2))


class TestDoor:
    def test_a_priority_past_the_packed_key_is_refused_naming_the_field(self) -> None:
        engine = GpuEngine(CACHED, device="cpu")
        with pytest.raises(RequestError, match="priority") as refused:
            engine.add_request(Request("a", (1,), max_tokens=1, priority=2**40))
        assert refused.value.field == "priority"
        assert engine.snapshot().requests == {}

    def test_slots_grow_past_the_first_eight(self) -> None:
        engine = GpuEngine(dataclasses.replace(CACHED, max_num_seqs=16), device="cpu")
        for i in range(20):
            engine.add_request(Request(f"r{i}", (i, 1), max_tokens=2, stop_token_ids=(1, 2, 3)))
        state = engine.snapshot()
        assert list(state.waiting) == [f"r{i}" for i in range(20)]
        assert engine.engine.state.slots == 32


# Both policies, synchronous, and with async scheduling and spec-decode padding (each
# instance's steps then land a tick late through the device's batch queue).
MODES = [
    pytest.param("fcfs", False, id="fcfs"),
    pytest.param("priority", False, id="priority"),
    pytest.param("fcfs", True, id="fcfs-async-padded"),
    pytest.param("priority", True, id="priority-async-padded"),
]


def _swarm_config(policy: str, pipelined: bool) -> tuple[SchedulerConfig, WorkloadShape]:
    config, shape = busy_swarm(policy)
    if pipelined:
        config = dataclasses.replace(config, async_scheduling=True, pad_spec_decode=True)
    return config, shape


@pytest.mark.parametrize(("policy", "pipelined"), MODES)
def test_an_instance_steps_the_same_in_a_batch_as_alone(policy: str, pipelined: bool) -> None:
    """Instances share tensors, never state: instance 5 of 8 ends exactly as it does alone."""
    config, shape = _swarm_config(policy, pipelined)
    batch = BatchedScheduler(config, batch=8, slots=10, device="cpu")
    alone = BatchedScheduler(config, batch=1, slots=10, device="cpu")
    workloads = [
        SwarmWorkload(batch, 1, torch.arange(8), shape),
        SwarmWorkload(alone, 1, torch.tensor([5]), shape),
    ]
    preempted = 0
    for _ in range(40):
        ticks = [w.tick() for w in workloads]
        preempted += int(ticks[1].plan.preempted.sum())
        assert torch.equal(ticks[0].plan.scheduled[5], ticks[1].plan.scheduled[0])
    for field in dataclasses.fields(batch.state):
        assert torch.equal(getattr(batch.state, field.name)[5], getattr(alone.state, field.name)[0])
    assert preempted > 0  # the example reached the sequential corner


@pytest.mark.parametrize(("policy", "pipelined"), MODES)
def test_narrow_tensors_widen_on_demand_and_step_like_full_ones(
    policy: str, pipelined: bool
) -> None:
    """An engine whose per-slot tensors start one slot wide (start_width=1) and widen as
    higher slots are used makes every decision the full-width engine makes: plans and
    state agree on the narrow engine's columns, the full engine's other columns stay
    empty, and the per-block state is equal throughout (a step in flight across a
    widening included)."""
    config, shape = _swarm_config(policy, pipelined)
    full = BatchedScheduler(config, batch=8, slots=32, device="cpu")
    narrow = BatchedScheduler(config, batch=8, slots=32, device="cpu", start_width=1)
    workloads = [SwarmWorkload(engine, 11, torch.arange(8), shape) for engine in (full, narrow)]
    widths = set()
    for _ in range(40):
        ticks = [w.tick() for w in workloads]
        width = narrow.state.slots
        widths.add(width)
        for name in ("scheduled", "rank", "kind", "num_drafts", "preempted"):
            wide, thin = (getattr(tick.plan, name) for tick in ticks)
            assert torch.equal(wide[:, :width], thin), name
        assert torch.equal(ticks[0].result.finish[:, :width], ticks[1].result.finish)
        assert (full.state.status[:, width:] == EMPTY).all()
        for field in dataclasses.fields(full.state):
            wide, thin = getattr(full.state, field.name), getattr(narrow.state, field.name)
            if wide.dim() >= 2 and wide.shape[1] == full.capacity and thin.shape[1] == width:
                wide = wide[:, :width]
            assert torch.equal(wide, thin), field.name
    assert len(widths) > 1 and max(widths) < full.capacity  # it widened, never to all 32


def test_a_slot_past_the_capacity_is_refused() -> None:
    engine = BatchedScheduler(CACHED, batch=1, slots=2, device="cpu", start_width=1)
    one = torch.ones(1, dtype=torch.int64)
    with pytest.raises(RequestError, match="slot"):
        engine.add_requests(
            NewRequests(one * 0, one * 2, one.view(1, 1), one, one, -one, -one.view(1, 1), one * 0)
        )
    assert engine.state.slots == 1


def test_the_lookup_takes_the_oldest_holder_and_stops_at_the_first_miss() -> None:
    """A 7-token prompt has three full blocks (content ids h0, h1, h2). Instance 0 holds
    h0 twice (block 5 registered 9th, block 2 registered 4th) and h1 in block 6: the hit
    is [2, 6], the oldest holder as the reference's insertion-ordered map keeps it.
    Instance 1 holds h1 but not h0: chained content ids make that a miss from block 0."""
    engine = BatchedScheduler(CACHED, batch=2, slots=2, device="cpu")
    both = torch.tensor([0, 1])
    engine.add_requests(
        NewRequests(
            inst=both,
            slot=torch.tensor([0, 0]),
            prompt=torch.arange(7).expand(2, -1),
            prompt_len=torch.tensor([7, 7]),
            max_tokens=torch.tensor([4, 4]),
            eos=torch.tensor([-1, -1]),
            stops=torch.full((2, 1), -1),
            priority=torch.tensor([0, 0]),
        )
    )
    st = engine.state
    h0, h1, h2 = st.req_hash[0, 0, :3].tolist()
    assert min(h0, h1, h2) >= 0 and st.req_hash[0, 0, 3] == -1
    for block, content, seq in ((5, h0, 9), (2, h0, 4), (6, h1, 1)):
        st.block_hash[0, block], st.reg_seq[0, block] = content, seq
    st.block_hash[1, 3], st.reg_seq[1, 3] = h1, 0
    prefix_index.rebuild(st, both)
    hits, count = longest_cached_prefix(st, CACHED, both, torch.tensor([0, 0]))
    assert count.tolist() == [2, 0]
    assert hits[:, :3].tolist() == [[2, 6, -1], [-1, -1, -1]]
    st.reg_seq[0, 5] = 3  # now block 5 is the older holder of h0 (the index keeps ages out)
    hits, count = longest_cached_prefix(st, CACHED, both, torch.tensor([0, 0]))
    assert hits[0, :2].tolist() == [5, 6]


def test_a_content_id_sharing_only_its_low_32_bits_is_no_hit() -> None:
    """The prefix index files content ids by their low bits. A 5-token prompt has two
    full blocks (h0, h1). Block 1 holds h0; block 4, registered earlier, holds h1 with
    its high bits changed (same home bucket, another id): the hit stops after block 1.
    Then block 3, registered first, holds such an impostor of h0: the two entries in
    h0's run are compared in full and the hit is still block 1, not the older block 3."""
    engine = BatchedScheduler(CACHED, batch=1, slots=1, device="cpu")
    engine.add_requests(
        NewRequests(
            inst=torch.tensor([0]),
            slot=torch.tensor([0]),
            prompt=torch.arange(5).unsqueeze(0),
            prompt_len=torch.tensor([5]),
            max_tokens=torch.tensor([4]),
            eos=torch.tensor([-1]),
            stops=torch.full((1, 1), -1),
            priority=torch.tensor([0]),
        )
    )
    st = engine.state
    h0, h1 = st.req_hash[0, 0, :2].tolist()
    impostor_h0, impostor_h1 = h0 ^ (1 << 40), h1 ^ (1 << 40)
    assert min(impostor_h0, impostor_h1) >= 0 and (impostor_h1 - h1) % 2**32 == 0
    st.block_hash[0, 1], st.reg_seq[0, 1] = h0, 5
    st.block_hash[0, 4], st.reg_seq[0, 4] = impostor_h1, 2
    zero = torch.tensor([0])
    prefix_index.rebuild(st, zero)
    hits, count = longest_cached_prefix(st, CACHED, zero, zero)
    assert count.tolist() == [1] and hits[0, :2].tolist() == [1, -1]
    st.block_hash[0, 3], st.reg_seq[0, 3] = impostor_h0, 0
    prefix_index.rebuild(st, zero)
    hits, count = longest_cached_prefix(st, CACHED, zero, zero)
    assert count.tolist() == [1] and hits[0, :2].tolist() == [1, -1]


def test_freeing_two_requests_that_share_a_block_queues_it_behind_the_later_one() -> None:
    """Requests A (rank 0, table [0, 1]) and B (rank 1, table [0, 2]) share cached block 0
    and finish in one step. Freed one by one, tail first: A drops block 1 (to the back)
    and one of block 0's references; B drops block 2, then block 0's last reference. The
    free queue ends 3, 4, 5 (free before), 1, 2, 0, as the reference's free() leaves it."""
    config = SchedulerConfig(
        block_size=2,
        num_blocks=6,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=8,
        enable_prefix_caching=True,
    )
    engine = BatchedScheduler(config, batch=1, slots=2, device="cpu")
    st = engine.state
    st.table[0, 0, :2] = torch.tensor([0, 1])
    st.table[0, 1, :2] = torch.tensor([0, 2])
    st.num_held[0] = 2
    st.ref_cnt[0, :3] = torch.tensor([2, 1, 1])
    st.block_hash[0, :3] = torch.tensor([10, 11, 12])
    st.free_key[0, :3] = BIG
    st.num_free[0] = 3
    release_tables(st, torch.tensor([0]), torch.tensor([[True, True]]), torch.tensor([[0, 1]]))
    free = (st.ref_cnt[0] == 0).nonzero().squeeze(1)
    queue = free[torch.argsort(st.free_key[0, free])].tolist()
    assert queue == [3, 4, 5, 1, 2, 0]
    assert st.num_free.tolist() == [6]
    assert st.table[0, :, :2].tolist() == [[-1, -1], [-1, -1]]
