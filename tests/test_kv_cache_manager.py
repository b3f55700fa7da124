"""KVCacheManager.allocate_slots: how many blocks, when it refuses, and that a refusal is pure.

All examples use block_size 4. A request is driven by hand the way the
scheduler drives it: status and num_computed_tokens are set after each call.
"""

from __future__ import annotations

import pytest

from schedspec.reference import KVCacheManager
from schedspec.spec import Request, RequestStatus
from tests.kv_helpers import admit, finish, free_ids, ids, make_kv, make_request, refs, toks


def run_as_scheduled(request: Request, num_computed: int) -> None:
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = num_computed


class TestBlockCount:
    """ceil((computed + hits + new + lookahead) / block_size) blocks, capped at max_model_len."""

    @pytest.mark.parametrize(
        ("prompt_len", "expected"),
        [(1, [0]), (4, [0]), (5, [0, 1]), (8, [0, 1]), (9, [0, 1, 2]), (10, [0, 1, 2])],
    )
    def test_whole_prompt(self, prompt_len: int, expected: list[int]) -> None:
        kv = make_kv()
        r = make_request("r", toks(100, prompt_len))
        assert ids(kv.allocate_slots(r, prompt_len)) == expected
        assert list(kv.get_block_ids("r")) == expected
        assert free_ids(kv) == list(range(len(expected), 8))

    def test_chunks_add_only_the_missing_blocks(self) -> None:
        kv = make_kv()
        r = make_request("r", toks(100, 10))
        assert ids(kv.allocate_slots(r, 6)) == [0, 1]  # slots 6 -> 2 blocks
        run_as_scheduled(r, 6)
        assert ids(kv.allocate_slots(r, 4)) == [2]  # slots 10 -> 3 blocks
        assert kv.get_block_ids("r") == (0, 1, 2)

    def test_decode_grows_a_block_only_when_crossing_a_boundary(self) -> None:
        kv = make_kv()
        r = make_request("r", toks(100, 8))
        assert ids(kv.allocate_slots(r, 8)) == [0, 1]
        run_as_scheduled(r, 8)
        r.append_output_token_id(7)  # 9 tokens, 8 computed
        assert ids(kv.allocate_slots(r, 1)) == [2]  # slots 9 -> 3 blocks
        run_as_scheduled(r, 9)
        r.append_output_token_id(7)
        assert ids(kv.allocate_slots(r, 1)) == []  # slots 10 still fit 3 blocks
        assert kv.get_block_ids("r") == (0, 1, 2)

    def test_lookahead_slots_are_allocated_too(self) -> None:
        kv = make_kv()
        r = make_request("r", toks(100, 8))
        # 8 + 3 lookahead = 11 slots -> 3 blocks.
        assert ids(kv.allocate_slots(r, 8, num_lookahead_tokens=3)) == [0, 1, 2]

    def test_slots_are_capped_at_max_model_len(self) -> None:
        kv = make_kv(max_model_len=12)
        r = make_request("r", toks(100, 10))
        # 10 + 4 lookahead = 14 slots, capped at 12 -> 3 blocks, not 4.
        assert ids(kv.allocate_slots(r, 10, num_lookahead_tokens=4)) == [0, 1, 2]
        run_as_scheduled(r, 10)
        r.append_output_token_id(7)
        # 10 + 1 + 4 = 15, capped at 12: still 3 blocks.
        assert ids(kv.allocate_slots(r, 1, num_lookahead_tokens=4)) == []

    def test_nothing_to_allocate_is_an_error(self) -> None:
        kv = make_kv()
        with pytest.raises(ValueError, match="needs new tokens"):
            kv.allocate_slots(make_request("r", toks(100, 4)), 0)

    def test_rejected_draft_table_longer_than_needed_allocates_nothing(self) -> None:
        # 4 blocks; a 9-token prompt takes 3 of them.
        kv = make_kv(num_blocks=4, max_model_len=16)
        r = make_request("r", toks(100, 9))
        assert admit(kv, r) == [0, 1, 2]
        r.append_output_token_id(7)  # 10 tokens, 9 computed
        # 1 token + 4 drafts: 9 + 5 = 14 slots -> block 3, the last free one.
        assert ids(kv.allocate_slots(r, 5)) == [3]
        run_as_scheduled(r, 14)
        # Every draft is rejected: back to 10 computed, one new token (11 total).
        r.num_computed_tokens = 10
        r.append_output_token_id(8)
        # 10 + 1 = 11 slots need 3 blocks; the table holds 4: max(3 - 4, 0) = 0.
        # Nothing is free, yet this is not a failure.
        assert free_ids(kv) == []
        assert ids(kv.allocate_slots(r, 1)) == []
        assert kv.get_block_ids("r") == (0, 1, 2, 3)


class TestFailureChangesNothing:
    def test_not_enough_free_blocks(self) -> None:
        kv = make_kv(num_blocks=4, max_model_len=16)
        assert admit(kv, make_request("r1", toks(100, 10))) == [0, 1, 2]
        before = kv.snapshot()
        r2 = make_request("r2", toks(200, 8))  # needs 2 blocks, 1 free
        assert kv.allocate_slots(r2, 8) is None
        assert kv.snapshot() == before
        assert "r2" not in kv.req_to_blocks
        assert "r2" not in kv.num_cached_block

    @pytest.mark.parametrize("full_sequence_must_fit", [False, True])
    def test_with_evictable_prefix_hits(self, full_sequence_must_fit: bool) -> None:
        kv = make_kv(num_blocks=4, max_model_len=16)
        # r1 = A B + 1 token: blocks [0, 1, 2], A and B cached in 0 and 1.
        a_b = toks(100, 8)
        r1 = make_request("r1", [*a_b, 1])
        assert admit(kv, r1) == [0, 1, 2]
        finish(kv, r1)
        assert free_ids(kv) == [2, 3, 1, 0]  # unhashed 2 in front, cached 1, 0 behind
        hog = make_request("hog", toks(500, 8))
        assert admit(kv, hog) == [2, 3]
        assert free_ids(kv) == [1, 0]

        # r2 = A B + 1 token hits blocks 0 and 1, which are the only free ones:
        # 1 new block + 2 evictable hits = 3 > 2 free.
        r2 = make_request("r2", [*a_b, 2])
        hits, num_hit = kv.get_computed_blocks(r2)
        assert (ids(hits), num_hit) == ([0, 1], 8)
        before = kv.snapshot()
        new = kv.allocate_slots(r2, 1, num_hit, hits, full_sequence_must_fit=full_sequence_must_fit)
        assert new is None
        assert kv.snapshot() == before  # free order [1, 0] and ref counts 0 kept
        assert refs(kv)[:2] == [0, 0]
        assert kv.get_block_ids("r2") == ()


class TestPrefixHitsAndCapacity:
    def test_evictable_hits_consume_free_capacity(self) -> None:
        kv = make_kv(num_blocks=4, max_model_len=16)
        a_b = toks(100, 8)
        r1 = make_request("r1", [*a_b, 1])
        admit(kv, r1)
        finish(kv, r1)
        assert free_ids(kv) == [2, 3, 1, 0]
        r2 = make_request("r2", [*a_b, 2])
        # Hits 0, 1 leave the queue (touch); the new block comes off the front.
        assert admit(kv, r2) == [0, 1, 2]
        assert r2.num_computed_tokens == 9
        assert free_ids(kv) == [3]
        assert refs(kv) == [1, 1, 1, 0]

    def test_held_hits_cost_nothing(self) -> None:
        kv = make_kv(num_blocks=4, max_model_len=16)
        a_b = toks(100, 8)
        assert admit(kv, make_request("r1", [*a_b, 1])) == [0, 1, 2]
        assert free_ids(kv) == [3]
        # Same prefix while r1 still holds it: only 1 new block is needed.
        r2 = make_request("r2", [*a_b, 2])
        assert admit(kv, r2) == [0, 1, 3]
        assert refs(kv) == [2, 2, 1, 1]
        assert free_ids(kv) == []


class TestFullSequenceMustFit:
    def test_refuses_an_admission_whose_first_chunk_would_fit(self) -> None:
        kv = make_kv(num_blocks=4, max_model_len=16)
        assert admit(kv, make_request("hog", toks(500, 8))) == [0, 1]
        r = make_request("r", toks(100, 12))  # whole prompt: 3 blocks, 2 free
        before = kv.snapshot()
        assert kv.allocate_slots(r, 4, full_sequence_must_fit=True) is None
        assert kv.snapshot() == before
        # The first chunk alone (1 block) would have fitted.
        assert ids(kv.allocate_slots(r, 4)) == [2]

    def test_hits_count_towards_the_whole_sequence(self) -> None:
        kv = make_kv(num_blocks=4, max_model_len=16)
        a = toks(100, 4)
        r1 = make_request("r1", [*a, 1])
        assert admit(kv, r1) == [0, 1]
        # r2 = A + 7 tokens (11): whole sequence 3 blocks, A is held by r1, so
        # 2 new blocks are needed and 2 are free.
        r2 = make_request("r2", [*a, *toks(200, 7)])
        assert admit(kv, r2, num_new_tokens=4, has_running_requests=True) == [0, 2]
        assert r2.num_computed_tokens == 8


class TestWatermark:
    @pytest.mark.parametrize(
        ("watermark", "blocks"), [(0.0, 0), (0.1, 1), (0.25, 2), (0.29, 2), (0.35, 3)]
    )
    def test_watermark_blocks_is_int_of_fraction(self, watermark: float, blocks: int) -> None:
        assert make_kv(num_blocks=10, max_model_len=40, watermark=watermark).watermark_blocks == (
            blocks
        )

    @staticmethod
    def _half_full() -> KVCacheManager:
        # 10 blocks, watermark 2; a running request holds 5, so 5 are free.
        kv = make_kv(num_blocks=10, max_model_len=40, watermark=0.2)
        assert admit(kv, make_request("run", toks(500, 20))) == [0, 1, 2, 3, 4]
        return kv

    def test_admission_while_something_runs_leaves_the_watermark_spare(self) -> None:
        kv = self._half_full()
        r = make_request("r", toks(100, 13))  # 4 blocks: 4 + 2 > 5
        before = kv.snapshot()
        assert kv.allocate_slots(r, 13, has_running_requests=True) is None
        assert kv.snapshot() == before
        # 3 blocks: 3 + 2 = 5 fits exactly.
        assert ids(
            kv.allocate_slots(make_request("s", toks(200, 12)), 12, has_running_requests=True)
        ) == [5, 6, 7]

    def test_no_watermark_when_nothing_runs(self) -> None:
        kv = self._half_full()
        r = make_request("r", toks(100, 13))
        assert ids(kv.allocate_slots(r, 13, has_running_requests=False)) == [5, 6, 7, 8]

    def test_preempted_request_pays_it_too(self) -> None:
        kv = self._half_full()
        r = make_request("r", toks(100, 13))
        r.status = RequestStatus.PREEMPTED
        assert kv.allocate_slots(r, 13, has_running_requests=True) is None

    def test_running_request_never_pays_it(self) -> None:
        kv = make_kv(num_blocks=10, max_model_len=40, watermark=0.2)
        run = make_request("run", toks(500, 36))
        assert admit(kv, run) == list(range(9))  # empty cache: no watermark
        assert free_ids(kv) == [9]
        waiting = make_request("w", toks(100, 3))  # 1 block: 1 + 2 > 1
        assert kv.allocate_slots(waiting, 3, has_running_requests=True) is None
        run.append_output_token_id(7)  # 37 tokens: the running request needs block 9
        assert ids(kv.allocate_slots(run, 1, has_running_requests=True)) == [9]


class TestFree:
    def test_tail_first_unhashed_front_hashed_back(self) -> None:
        kv = make_kv()
        r = make_request("r", toks(100, 14))  # blocks 0, 1, 2 full; 3 partial
        assert admit(kv, r) == [0, 1, 2, 3]
        finish(kv, r)
        assert free_ids(kv) == [3, 4, 5, 6, 7, 2, 1, 0]
        assert refs(kv) == [0] * 8
        assert kv.get_block_ids("r") == ()
        assert "r" not in kv.num_cached_block

    def test_freeing_an_unknown_request_is_a_no_op(self) -> None:
        kv = make_kv()
        before = kv.snapshot()
        finish(kv, make_request("ghost", toks(100, 4)))
        assert kv.snapshot() == before

    def test_caching_disabled_reuses_freed_blocks_first_and_never_hits(self) -> None:
        kv = make_kv(enable_prefix_caching=False)
        prompt = toks(100, 12)
        r1 = make_request("r1", prompt)
        assert admit(kv, r1) == [0, 1, 2]
        assert kv.snapshot().block_hashes == (None,) * 8
        finish(kv, r1)
        assert free_ids(kv) == [2, 1, 0, 3, 4, 5, 6, 7]
        r2 = make_request("r2", prompt)
        assert kv.get_computed_blocks(r2) == ([], 0)
        assert admit(kv, r2) == [2, 1, 0]
        assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)
