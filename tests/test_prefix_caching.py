"""Prefix caching: chained hashes, the lookup, the last-token rule, sharing, eviction order,
schedule-time hashing, statistics, and block conservation over long random runs.

All examples use block_size 4. A, B, C, D name one block's worth of distinct
tokens; H_A, H_AB, H_ABC the chained hashes of A, A B, A B C.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from schedspec.engines.fake_model import FakeModel
from schedspec.engines.pipeline import run_step
from schedspec.reference import Scheduler
from schedspec.spec import (
    BlockHash,
    ModelRunnerOutput,
    Request,
    SchedulerOutput,
    extend_block_hashes,
    hash_block_tokens,
)
from tests.kv_helpers import (
    admit,
    cache_map,
    finish,
    free_ids,
    ids,
    kv_config,
    make_kv,
    make_request,
    refs,
    toks,
)
from tests.sched_helpers import single_group_kv

A, B, C, D = toks(100, 4), toks(200, 4), toks(300, 4), toks(400, 4)
H_A = hash_block_tokens(None, A)
H_AB = hash_block_tokens(H_A, B)
H_ABC = hash_block_tokens(H_AB, C)


def chain(*blocks: Sequence[int]) -> list[BlockHash]:
    return extend_block_hashes([], [t for block in blocks for t in block], 4)


# ------------------------------------------------------------- scheduler-level helpers


def make_scheduler(**overrides: Any) -> Scheduler:
    return Scheduler(kv_config(**overrides))


def answer(
    scheduler: Scheduler, output: SchedulerOutput, sampled: Mapping[str, Sequence[int]]
) -> None:
    scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids=sampled))


def block_hashes_now(scheduler: Scheduler) -> tuple[BlockHash | None, ...]:
    return single_group_kv(scheduler).snapshot().block_hashes


class TestChainedHashes:
    def test_equal_content_after_a_different_prefix_hashes_differently(self) -> None:
        assert chain(A, B) == [H_A, H_AB]
        assert chain(C, B)[1] != H_AB
        assert chain(B)[0] != H_AB  # same content at position 0
        assert chain(A, B, C)[:2] == chain(A, B)  # a longer sequence extends the chain

    def test_partial_block_is_not_hashed(self) -> None:
        assert chain(A, B[:3]) == [H_A]
        assert chain(A[:3]) == []

    def test_same_block_elsewhere_does_not_hit(self) -> None:
        kv = make_kv()
        r1 = make_request("r1", [*A, *B, *C, 1])
        assert admit(kv, r1) == [0, 1, 2, 3]
        assert cache_map(kv) == {H_A: [0], H_AB: [1], H_ABC: [2]}
        finish(kv, r1)
        # B and C behind a different first block: nothing hits.
        assert kv.get_computed_blocks(make_request("x", [*D, *B, *C, 1])) == ([], 0)
        # B and C at the front: nothing hits.
        assert kv.get_computed_blocks(make_request("y", [*B, *C, 1])) == ([], 0)
        # The same A and B, then something else: exactly A and B hit.
        hits, num_hit = kv.get_computed_blocks(make_request("z", [*A, *B, *D, 1]))
        assert (ids(hits), num_hit) == ([0, 1], 8)


class TestLookup:
    def test_stops_at_the_first_miss(self) -> None:
        kv = make_kv(num_blocks=6, max_model_len=24)
        r1 = make_request("r1", [*A, *B, *C, 1])
        assert admit(kv, r1) == [0, 1, 2, 3]
        finish(kv, r1)
        assert free_ids(kv) == [3, 4, 5, 2, 1, 0]
        # Evict B alone: hold A's and C's blocks aside, take every other block.
        pool, blocks = kv.block_pool, kv.block_pool.blocks
        pool.touch([blocks[0], blocks[2]])
        held = pool.get_new_blocks(4)
        assert ids(held) == [3, 4, 5, 1]
        pool.free_blocks(held)
        pool.free_blocks([blocks[2], blocks[0]])
        assert cache_map(kv) == {H_A: [0], H_ABC: [2]}

        # A hits; B misses; C's block is still cached under H_ABC but is not reached.
        hits, num_hit = kv.get_computed_blocks(make_request("r2", [*A, *B, *C, 1]))
        assert (ids(hits), num_hit) == ([0], 4)

    @pytest.mark.parametrize(
        ("prompt", "hit_blocks"),
        [
            ([*A[:3]], []),  # shorter than a block: no hash at all
            ([*A], []),  # exactly 1 block: hits 0 (the last token is recomputed)
            ([*A, 1], [0]),  # 1 block + 1 token: hits 1
            ([*A, *B], [0]),  # exactly 2 blocks: hits 1
            ([*A, *B, 1], [0, 1]),  # 2 blocks + 1 token: hits 2
            ([*A, *B, *C], [0, 1]),  # exactly 3 blocks: hits 2
            ([*A, *B, *C, 1, 2, 3], [0, 1, 2]),  # 3 blocks + 3 tokens: hits 3
        ],
    )
    def test_last_token_is_always_recomputed(
        self, prompt: list[int], hit_blocks: list[int]
    ) -> None:
        kv = make_kv()
        admit(kv, make_request("r1", [*A, *B, *C, *D]))  # blocks 0..3, all cached
        hits, num_hit = kv.get_computed_blocks(make_request("r2", prompt))
        assert ids(hits) == hit_blocks
        assert num_hit == 4 * len(hit_blocks) <= len(prompt) - 1


class TestRecomputedLastBlock:
    def test_exact_blocks_prompt_hits_k_minus_1_and_duplicates_the_last_hash(self) -> None:
        kv = make_kv()
        r1 = make_request("r1", [*A, *B])
        assert admit(kv, r1) == [0, 1]
        assert cache_map(kv) == {H_A: [0], H_AB: [1]}

        r2 = make_request("r2", [*A, *B])
        hits, num_hit = kv.get_computed_blocks(r2)
        assert (ids(hits), num_hit) == ([0], 4)
        # B is recomputed into a NEW block (2) that carries the same hash.
        assert admit(kv, r2) == [0, 2]
        assert r2.num_computed_tokens == 8
        assert cache_map(kv) == {H_A: [0], H_AB: [1, 2]}
        assert kv.snapshot().prefix_cache == ((H_A, (0,)), (H_AB, (1, 2)))
        assert kv.block_pool.get_cached_block(H_AB) is kv.block_pool.blocks[1]  # the oldest
        assert refs(kv)[:3] == [2, 1, 1]

    def test_k_blocks_plus_a_token_hits_all_k(self) -> None:
        kv = make_kv()
        admit(kv, make_request("r1", [*A, *B]))
        r2 = make_request("r2", [*A, *B, 9])
        assert admit(kv, r2) == [0, 1, 2]
        assert r2.num_computed_tokens == 9
        assert refs(kv)[:3] == [2, 2, 1]
        assert cache_map(kv) == {H_A: [0], H_AB: [1]}  # block 2 is partial: not cached

    def test_scheduler_schedules_the_whole_last_block_again(self) -> None:
        # Step 1: r1 (A B) prefills into [0, 1]. Step 2: r1 decodes into new
        # block 2; r2 (A B) is admitted with A hit, B recomputed into block 3.
        scheduler = make_scheduler()
        scheduler.add_request(Request("r1", [*A, *B], max_tokens=5))
        out = scheduler.schedule()
        assert out.scheduled_new_reqs[0].block_ids == (0, 1)
        answer(scheduler, out, {"r1": [7]})

        scheduler.add_request(Request("r2", [*A, *B], max_tokens=5))
        out = scheduler.schedule()
        assert dict(out.num_scheduled_tokens) == {"r1": 1, "r2": 4}
        assert out.scheduled_cached_reqs[0].new_block_ids == (2,)
        (new,) = out.scheduled_new_reqs
        assert (new.request_id, new.block_ids, new.num_computed_tokens) == ("r2", (0, 3), 4)
        kv = single_group_kv(scheduler)
        assert cache_map(kv) == {H_A: [0], H_AB: [1, 3]}
        assert refs(kv)[:4] == [2, 1, 1, 1]


class TestSharing:
    def test_hits_take_a_reference_per_live_table(self) -> None:
        kv = make_kv()
        r1 = make_request("r1", [*A, *B, 1])
        r2 = make_request("r2", [*A, *B, 2])
        r3 = make_request("r3", [*A, *C, 3])
        assert admit(kv, r1) == [0, 1, 2]
        assert admit(kv, r2) == [0, 1, 3]
        assert admit(kv, r3) == [0, 4, 5]
        assert refs(kv) == [3, 2, 1, 1, 1, 1, 0, 0]
        finish(kv, r2)
        assert refs(kv) == [2, 1, 1, 0, 1, 1, 0, 0]
        assert free_ids(kv) == [3, 6, 7]  # shared blocks stay out of the queue

    def test_hit_on_a_free_cached_block_pulls_it_from_the_queue(self) -> None:
        kv = make_kv()
        r1 = make_request("r1", [*A, *B, 1])
        admit(kv, r1)
        finish(kv, r1)
        assert free_ids(kv) == [2, 3, 4, 5, 6, 7, 1, 0]
        r2 = make_request("r2", [*A, 2])
        assert admit(kv, r2) == [0, 2]
        assert free_ids(kv) == [3, 4, 5, 6, 7, 1]
        assert refs(kv)[:3] == [1, 0, 1]


class TestFreeOrder:
    def test_tail_first_so_the_shared_head_is_evicted_last(self) -> None:
        kv = make_kv()
        r1 = make_request("r1", [*A, *B, *C, 1])
        r2 = make_request("r2", [*A, *B, *D, 1])
        assert admit(kv, r1) == [0, 1, 2, 3]
        assert admit(kv, r2) == [0, 1, 4, 5]  # block 4 caches A B D
        assert free_ids(kv) == [6, 7]
        finish(kv, r1)
        # 3 (partial) to the front, 2 (C) to the back; 1 and 0 are still held by r2.
        assert free_ids(kv) == [3, 6, 7, 2]
        finish(kv, r2)
        assert free_ids(kv) == [5, 3, 6, 7, 2, 4, 1, 0]

        # Reuse evicts from the tail of the chains first: take 5 blocks and C goes.
        kv.block_pool.get_new_blocks(5)
        assert cache_map(kv) == {H_A: [0], H_AB: [1], hash_block_tokens(H_AB, D): [4]}
        hits, _ = kv.get_computed_blocks(make_request("r3", [*A, *B, *C, 1]))
        assert ids(hits) == [0, 1]

    def test_cached_free_blocks_count_as_free(self) -> None:
        kv = make_kv()
        r1 = make_request("r1", [*A, *B, *C, 1])
        admit(kv, r1)
        finish(kv, r1)
        assert kv.block_pool.get_num_free_blocks() == 8
        assert kv.block_pool.get_usage() == 0.0
        assert sorted(kv.snapshot().free_block_ids) == list(range(8))
        assert len(cache_map(kv)) == 3
        # A prompt needing all 8 blocks gets them, evicting the cached content.
        table = [3, 4, 5, 6, 7, 2, 1, 0]
        assert admit(kv, make_request("big", toks(900, 31))) == table
        # A, AB, ABC are gone; the 7 full blocks of the new prompt are cached.
        assert cache_map(kv) == {h: [b] for h, b in zip(chain(toks(900, 28)), table, strict=False)}


class TestScheduleTimeHashing:
    def test_prefill_chunks_hash_the_blocks_they_fill_before_the_model_runs(self) -> None:
        prompt = [*A, *B, 1, 2]
        scheduler = make_scheduler(max_num_batched_tokens=6, max_num_seqs=2)
        scheduler.add_request(Request("r", prompt, max_tokens=3))
        out = scheduler.schedule()
        assert dict(out.num_scheduled_tokens) == {"r": 6}
        assert block_hashes_now(scheduler)[:2] == (H_A, None)  # 6 tokens fill 1 block
        answer(scheduler, out, {})
        out = scheduler.schedule()
        assert dict(out.num_scheduled_tokens) == {"r": 4}
        assert block_hashes_now(scheduler)[:3] == (H_A, H_AB, None)  # tokens 8, 9 are partial

    @staticmethod
    def _decoding_with_drafts() -> tuple[Scheduler, SchedulerOutput]:
        # r: prompt A + [5, 6] (6 tokens). Step 1 prefills into [0, 1] and
        # samples 50. Step 2 verifies drafts [51, 52]: 6 + 3 = 9 slots, block 2
        # added. Block 1 would hold [5, 6, 50, 51] but 51 is only a draft.
        scheduler = make_scheduler(num_speculative_tokens=2, num_lookahead_tokens=0)
        scheduler.add_request(Request("r", [*A, 5, 6], max_tokens=10))
        out = scheduler.schedule()
        answer(scheduler, out, {"r": [50]})
        scheduler.update_draft_token_ids({"r": [51, 52]})
        out = scheduler.schedule()
        assert dict(out.num_scheduled_tokens) == {"r": 3}
        assert dict(out.scheduled_spec_decode_tokens) == {"r": (51, 52)}
        assert out.scheduled_cached_reqs[0].new_block_ids == (2,)
        assert block_hashes_now(scheduler)[:3] == (H_A, None, None)
        return scheduler, out

    def test_drafts_are_not_hashed_at_schedule_time_accepted_ones_are_after(self) -> None:
        scheduler, out = self._decoding_with_drafts()
        answer(scheduler, out, {"r": [51, 52, 53]})  # both drafts accepted
        request = scheduler.requests["r"]
        assert (request.num_tokens, request.num_computed_tokens) == (10, 9)
        assert block_hashes_now(scheduler)[:3] == (
            H_A,
            hash_block_tokens(H_A, [5, 6, 50, 51]),
            None,
        )

    def test_a_rejected_draft_never_reaches_the_cache(self) -> None:
        scheduler, out = self._decoding_with_drafts()
        answer(scheduler, out, {"r": [60]})  # both drafts rejected, 60 sampled
        request = scheduler.requests["r"]
        assert (request.num_tokens, request.num_computed_tokens) == (8, 7)
        assert block_hashes_now(scheduler)[:3] == (H_A, None, None)
        out = scheduler.schedule()  # decode 60 alone: the table already covers it
        assert dict(out.num_scheduled_tokens) == {"r": 1}
        assert out.scheduled_cached_reqs[0].new_block_ids == ()
        assert block_hashes_now(scheduler)[:3] == (
            H_A,
            hash_block_tokens(H_A, [5, 6, 50, 60]),
            None,
        )


def test_unscheduled_priority_victim_leaves_no_uncomputed_block_in_the_cache() -> None:
    # 6 blocks; budget 8; cap 6 once two requests exist. v (priority 9, 18
    # tokens) is admitted first, so it sits before h (priority 0) in running.
    scheduler = make_scheduler(
        num_blocks=6,
        max_model_len=20,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        policy="priority",
        long_prefill_token_threshold=6,
    )
    kv = single_group_kv(scheduler)
    v = Request("v", toks(200, 18), max_tokens=10, priority=9)
    scheduler.add_request(v)
    out = scheduler.schedule()  # v alone: 8 tokens into [0, 1]
    assert dict(out.num_scheduled_tokens) == {"v": 8}
    answer(scheduler, out, {})
    scheduler.add_request(Request("h", toks(300, 8), max_tokens=10, priority=0))
    out = scheduler.schedule()  # v 8 -> 14 into [2, 3]; h 2 tokens into [4]
    assert dict(out.num_scheduled_tokens) == {"v": 6, "h": 2}
    answer(scheduler, out, {})
    assert v.num_computed_tokens == 14  # KV of tokens 0..13 is written
    assert kv.get_block_ids("v") == (0, 1, 2, 3)
    # v schedules 14 -> 18: block 3 (tokens 12..15) is hashed now, block 5 is
    # added. h then needs a block, none is free, and the victim is v, which
    # is unscheduled and preempted: tokens 14 and 15 are never computed.
    out = scheduler.schedule()
    assert dict(out.num_scheduled_tokens) == {"h": 4}
    assert out.preempted_req_ids == frozenset({"v"})
    assert free_ids(kv) == [3, 2, 1, 0]
    # Only blocks 0..2 hold computed KV, so v may hit at most 12 tokens.
    # vLLM 0.33.0 leaves block 3 registered and would hit 16 (a latent bug,
    # vllm-project/vllm#43569); the reference deliberately does not.
    _, num_hit = kv.get_computed_blocks(v)
    assert num_hit == 12


class TestHitStatistics:
    def test_queries_and_hits_count_on_admission(self) -> None:
        scheduler = make_scheduler()
        kv = single_group_kv(scheduler)
        scheduler.add_request(Request("r1", [*A, *B, 1], max_tokens=1))
        out = scheduler.schedule()
        assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (9, 0)
        answer(scheduler, out, {"r1": [7]})  # max_tokens 1: r1 finishes, A B stay cached
        scheduler.add_request(Request("r2", [*A, *B, 2, 3], max_tokens=1))
        out = scheduler.schedule()
        assert out.scheduled_new_reqs[0].num_computed_tokens == 8
        assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (19, 8)

    def test_a_lookup_that_is_not_admitted_is_not_counted(self) -> None:
        # 4 blocks: big (10 tokens) takes 3, small (8 tokens) needs 2 and waits.
        scheduler = make_scheduler(num_blocks=4, max_model_len=16)
        kv = single_group_kv(scheduler)
        scheduler.add_request(Request("big", toks(500, 10), max_tokens=5))
        scheduler.add_request(Request("small", toks(600, 8), max_tokens=5))
        for sampled in ([7], [8]):
            out = scheduler.schedule()
            assert set(out.num_scheduled_tokens) == {"big"}
            answer(scheduler, out, {"big": sampled})
            assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (10, 0)
        scheduler.finish_requests("big")
        out = scheduler.schedule()
        assert set(out.num_scheduled_tokens) == {"small"}
        assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (18, 0)

    def test_nothing_is_counted_with_caching_off(self) -> None:
        scheduler = make_scheduler(enable_prefix_caching=False)
        scheduler.add_request(Request("r1", [*A, *B, 1], max_tokens=1))
        scheduler.schedule()
        kv = single_group_kv(scheduler)
        assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)


# ------------------------------------------------------------ conservation over random runs
# Small assertion helpers over the abstract state; the invariant suite will
# turn them into the official predicates.


def assert_ref_counts_match_tables(scheduler: Scheduler) -> None:
    """Every block's ref count equals the number of live block tables holding it."""
    state = scheduler.snapshot()
    holders: Counter[int] = Counter()
    for rid, request in state.requests.items():
        assert len(set(request.block_ids)) == len(request.block_ids), f"{rid} holds a block twice"
        holders.update(request.block_ids)
    assert set(single_group_kv(scheduler).req_to_blocks) <= set(state.requests), "table leaked"
    for block_id, ref_cnt in enumerate(state.kv.ref_counts):
        assert ref_cnt == holders[block_id], (
            f"block {block_id}: ref {ref_cnt}, held by {holders[block_id]}"
        )


def assert_free_blocks_queued_once(scheduler: Scheduler) -> None:
    """A block is in the free queue exactly once iff its ref count is 0."""
    kv = scheduler.snapshot().kv
    queued = Counter(kv.free_block_ids)
    assert all(n == 1 for n in queued.values()), f"queued twice: {queued}"
    for block_id, ref_cnt in enumerate(kv.ref_counts):
        assert (ref_cnt == 0) == (block_id in queued), f"block {block_id}: ref {ref_cnt}"
    assert single_group_kv(scheduler).block_pool.get_num_free_blocks() == len(kv.free_block_ids)


def assert_blocks_conserved(scheduler: Scheduler) -> None:
    """free + referenced == num_blocks."""
    kv = scheduler.snapshot().kv
    referenced = sum(1 for ref_cnt in kv.ref_counts if ref_cnt > 0)
    assert len(kv.free_block_ids) + referenced == kv.num_blocks


def assert_prefix_cache_consistent(scheduler: Scheduler) -> None:
    """Every block in the prefix-cache map carries the hash it is filed under, and back."""
    kv = scheduler.snapshot().kv
    filed = {b: h for h, holders in kv.prefix_cache for b in holders}
    assert filed == {b: h for b, h in enumerate(kv.block_hashes) if h is not None}


def assert_all_blocks_free(scheduler: Scheduler) -> None:
    kv = scheduler.snapshot().kv
    assert kv.ref_counts == (0,) * kv.num_blocks
    assert sorted(kv.free_block_ids) == list(range(kv.num_blocks))
    assert single_group_kv(scheduler).req_to_blocks == {}


def check_kv(scheduler: Scheduler) -> None:
    assert_ref_counts_match_tables(scheduler)
    assert_free_blocks_queued_once(scheduler)
    assert_blocks_conserved(scheduler)
    assert_prefix_cache_consistent(scheduler)


class CheckedScheduler:
    """A StepEngine that checks the KV invariants after every call run_step makes."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def schedule(self) -> SchedulerOutput:
        output = self.scheduler.schedule()
        check_kv(self.scheduler)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> None:
        self.scheduler.update_from_output(scheduler_output, model_runner_output)
        check_kv(self.scheduler)

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        self.scheduler.update_draft_token_ids(draft_token_ids)
        check_kv(self.scheduler)


def test_the_checks_catch_a_corrupted_pool() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(Request("r", [*A, *B, 1], max_tokens=3))
    scheduler.schedule()
    check_kv(scheduler)
    blocks = single_group_kv(scheduler).block_pool.blocks
    blocks[0].ref_cnt += 1  # a reference no table accounts for
    with pytest.raises(AssertionError, match="block 0: ref 2, held by 1"):
        assert_ref_counts_match_tables(scheduler)
    blocks[0].ref_cnt -= 1
    single_group_kv(scheduler).block_pool.free_block_queue.append_n([blocks[1]])  # held + free
    with pytest.raises(AssertionError, match="block 1: ref 1"):
        assert_free_blocks_queued_once(scheduler)
    with pytest.raises(AssertionError):
        assert_blocks_conserved(scheduler)


@pytest.mark.parametrize("seed", range(8))
def test_random_run_conserves_blocks_with_shared_prefixes_and_preemption(seed: int) -> None:
    rng = random.Random(seed)
    num_spec = rng.choice([0, 2])
    # 10 blocks of 4 for up to 4 requests of up to 31 tokens: preemption is routine.
    scheduler = make_scheduler(
        num_blocks=10,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        long_prefill_token_threshold=rng.choice([0, 8]),
        watermark=rng.choice([0.0, 0.1]),
        policy=rng.choice(["fcfs", "priority"]),
        num_speculative_tokens=num_spec,
        num_lookahead_tokens=rng.choice([None, 0]),
    )
    checked = CheckedScheduler(scheduler)
    model = FakeModel(seed=seed, vocab_size=64, num_speculative_tokens=num_spec)
    prefixes = [toks(1000 * (k + 1), rng.choice([4, 8, 12])) for k in range(3)]
    num_requests, num_added, num_preempted = 30, 0, 0
    for _ in range(3000):
        if num_added == num_requests and not scheduler.has_unfinished_requests():
            break
        for _ in range(rng.choice([0, 0, 1, 2])):
            if num_added < num_requests:
                prefix = rng.choice(prefixes)
                suffix = [rng.randrange(8) for _ in range(rng.randint(0, 30 - len(prefix)))]
                scheduler.add_request(
                    Request(
                        f"r{num_added}",
                        [*prefix, *suffix],
                        max_tokens=rng.randint(1, 12),
                        eos_token_id=0,
                        priority=rng.randint(0, 2),
                    )
                )
                num_added += 1
        if scheduler.requests and rng.random() < 0.03:
            scheduler.finish_requests(rng.choice(sorted(scheduler.requests)))
        check_kv(scheduler)
        output, _ = run_step(checked, model)
        num_preempted += len(output.preempted_req_ids)
    else:
        pytest.fail("the run did not drain")
    assert num_added == num_requests
    assert num_preempted > 0, "the cache was meant to force preemption"
    assert single_group_kv(scheduler).prefix_cache_hits > 0, "the prefixes were meant to hit"
    assert_all_blocks_free(scheduler)
