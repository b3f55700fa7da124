"""The invariants of the engine-neutral split and of the `sglang` profile are not vacuous:
each fires on a corrupted real transition of the reference (vLLM's family or SGLang's),
and holds on what it was corrupted from. The restated safety invariants also hold on
what SGLang does and vLLM does not (a deferred abort, dropped stale output, a block
swapped for the tree's copy), and still fire when that goes wrong.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.properties.checked_engine import replay
from schedspec.spec import SGLangState, State
from schedspec.spec.invariants import (
    CATALOGUE,
    CHECKS,
    AbortTransition,
    ScheduleTransition,
    UpdateTransition,
)
from schedspec.spec.invariants.sglang.policy import refreshed_pages
from tests import test_invariants_sglang_lifecycle
from tests.invariant_builders import (
    SGLANG_CHUNKED,
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    evictable_blocks,
    sglang_refresh_of_deeper_pages,
    sglang_refresh_pass_admits_the_head,
    sglang_waiting_prefix_refresh,
    with_kv,
    with_output,
    with_request,
    with_scheduled,
)
from tests.regression_trace import regression_trace

cases = CaseRegistry()

# The worked examples' configs (tests/test_sglang_reference.py), token slots as blocks.
RETRACT = {
    "family": "sglang",
    "block_size": 1,
    "num_blocks": 24,
    "max_num_batched_tokens": 24,
    "max_num_seqs": 4,
    "max_model_len": 24,
    "schedule_conservativeness": 0.1,
}
CHUNKED = SGLANG_CHUNKED


def with_policy(state: State, **changes: Any) -> State:
    assert state.sglang is not None
    return dataclasses.replace(state, sglang=dataclasses.replace(state.sglang, **changes))


def sglang_retraction() -> tuple[Driver, ScheduleTransition]:
    """a (prompt 6), b (prompt 4), c (prompt 5), 12 tokens each, in 24 slots: after 9
    steps a and b hold 8 outputs each and their decode no longer fits; the tenth
    schedule retracts a (tie on outputs, longer prompt) behind the waiting c."""
    driver = Driver(**RETRACT)
    driver.add("a", 6, max_tokens=12)
    driver.add("b", 4, max_tokens=12)
    driver.add("c", 5, max_tokens=12)
    driver.steps(9)
    t = driver.schedule()
    assert t.output.preempted_req_ids == {"a"} and t.post.waiting == ("c", "a")
    return driver, t


def sglang_decode() -> ScheduleTransition:
    driver = Driver(**RETRACT)
    driver.add("a", 6, max_tokens=12)
    driver.step()
    t = driver.schedule()
    assert t.post.sglang is not None and t.post.sglang.last_batch_kind == "decode"
    return t


def sglang_chunk() -> Driver:
    """a (20 tokens) after its first chunk of 8: the chunked request."""
    driver = Driver(**CHUNKED)
    driver.add("a", 20, max_tokens=2)
    driver.step()
    assert driver.state.sglang is not None and driver.state.sglang.chunked_request_id == "a"
    return driver


def sglang_latch_admission() -> ScheduleTransition:
    """The LATCH example: b and c wait behind a's reservation with the latch closed; the
    step after a finishes admits both."""
    driver = Driver(
        family="sglang",
        block_size=1,
        num_blocks=40,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=40,
    )
    driver.add("a", 10, max_tokens=20)
    driver.step()
    driver.add("b", 10, max_tokens=20)
    driver.steps(2)
    driver.add("c", 4, max_tokens=2)
    driver.steps(17)
    t = driver.schedule()
    assert t.pre.sglang is not None and t.pre.sglang.batch_is_full
    assert dict(t.output.num_scheduled_tokens) == {"b": 10, "c": 4}
    assert t.finished_since_last_schedule == {"a"}
    return t


# ------------------------------------------------------------ vLLM's side of the split


@cases("ABORT-AT-ONCE")
def case_vllm_defers_an_abort() -> Case:
    driver = Driver()
    driver.add("A", 8)
    driver.step()
    good = driver.abort("A")
    deferred = with_request(good.pre, "A", abort_pending=True)
    bad = AbortTransition(good.pre, ("A",), deferred)
    return Case("ABORT-AT-ONCE", good, bad, "still live (abort deferred)", "A")


@cases("STALE-KEPT")
def case_vllm_drops_stale_output() -> Case:
    driver = Driver()
    driver.add("A", 8)
    driver.step()
    good = driver.state
    bad = with_request(good, "A", drop_stale_output=True, num_stale_output_tokens=1)
    return Case("STALE-KEPT", good, bad, "stale output marked to be dropped", "A")


@cases("TABLE-GROWS")
def case_vllm_moves_a_held_block() -> Case:
    driver = Driver(max_model_len=64)
    driver.add("A", 8)
    driver.step()
    good = driver.schedule()
    a = good.post.requests["A"]
    spare = good.post.kv.free_block_ids[0]
    bad = dataclasses.replace(
        good, post=with_request(good.post, "A", block_ids=(spare, *a.block_ids[1:]))
    )
    return Case("TABLE-GROWS", good, bad, "a block the request held changed place", "A")


# ------------------------------------------------------------ safety, SGLang's way


@cases("ABORT")
def case_sglang_deferred_abort_changes_more() -> Case:
    driver = Driver(**RETRACT)
    driver.add("a", 6, max_tokens=12)
    driver.step()
    good = driver.abort("a")
    assert good.post.requests["a"].abort_pending and good.post.running == ("a",)
    changed = with_request(good.post, "a", num_computed_tokens=0)
    bad = dataclasses.replace(good, post=changed)
    return Case("ABORT", good, bad, "not only marked abort_pending", "a")


@cases("NO-EMPTY-STEP")
def case_sglang_idle_without_a_pending_abort() -> Case:
    # The chunked a, aborted, leaves inside the next schedule(), which runs nothing.
    driver = sglang_chunk()
    driver.abort("a")
    good = driver.schedule()
    assert not good.output.num_scheduled_tokens and "a" not in good.post.requests
    bad = dataclasses.replace(good, pre=with_request(good.pre, "a", abort_pending=False))
    return Case("NO-EMPTY-STEP", good, bad, "nothing scheduled with 1 unfinished requests")


@cases("FINISH-REPORTED")
def case_sglang_chunked_abort_reported_next() -> Case:
    driver = sglang_chunk()
    driver.abort("a")
    driver.schedule()
    good = driver.schedule()
    assert good.output.finished_req_ids == {"a"}
    bad = dataclasses.replace(good, finished_since_last_schedule=frozenset())
    return Case("FINISH-REPORTED", good, bad, "wrong finished_req_ids")


def overlap_retraction_landing() -> UpdateTransition:
    """RETRACT under overlap: the step that retracts a is scheduled while a's previous
    decode is in flight; that decode then lands, and its token is dropped."""
    driver = Driver(**RETRACT, async_scheduling=True)
    driver.add("a", 6, max_tokens=12)
    driver.add("b", 4, max_tokens=12)
    driver.add("c", 5, max_tokens=12)
    in_flight: deque[ScheduleTransition] = deque()
    for _ in range(10):
        t = driver.schedule()
        in_flight.append(t)
        if len(in_flight) > 1:
            landed = driver.update(in_flight.popleft())
    assert t.output.preempted_req_ids == {"a"}
    assert landed.pre.requests["a"].drop_stale_output
    return landed


@cases("STOP")
def case_sglang_keeps_output_it_drops() -> Case:
    good = overlap_retraction_landing()
    a = good.pre.requests["a"]
    sampled = tuple(good.model_output.sampled_token_ids["a"])
    kept = with_request(good.post, "a", output_token_ids=a.output_token_ids + sampled)
    bad = dataclasses.replace(good, post=kept)
    return Case("STOP", good, bad, "stale output marked to be dropped was kept", "a")


@cases("PIPELINE")
def case_sglang_drop_mark_without_stale_output() -> Case:
    good = overlap_retraction_landing().pre
    bad = with_request(good, "a", num_stale_output_tokens=0, num_in_flight_tokens=0)
    return Case("PIPELINE", good, bad, "marked to drop stale output with none in flight", "a")


# ------------------------------------------------------------ the sglang profile


@cases("SG-PREFILL-FIRST")
def case_an_extend_step_that_decodes() -> Case:
    good = sglang_decode()
    bad = dataclasses.replace(good, post=with_policy(good.post, last_batch_kind="extend"))
    return Case("SG-PREFILL-FIRST", good, bad, "an extend step decoded ['a']")


@cases("SG-PREFILL-FIRST")
def case_a_decode_while_a_request_is_chunked() -> Case:
    good = sglang_decode()
    pre = with_policy(good.pre, chunked_request_id="a")
    bad = dataclasses.replace(good, pre=pre)
    return Case("SG-PREFILL-FIRST", good, bad, "a decode step while 'a' is chunked")


def test_a_decode_beside_a_chunk_held_back_for_want_of_a_block_is_prefill_first() -> None:
    """docs/SPEC.md "A chunk the pool cannot hold": the decode runs while 'a' is chunked
    only when the pool had no free or evictable block for its chunk."""
    good = sglang_decode()
    chunked = with_policy(good.pre, chunked_request_id="a")
    assert good.pre.kv.free_block_ids
    (violation,) = CHECKS["SG-PREFILL-FIRST"](dataclasses.replace(good, pre=chunked))
    assert violation.message == "a decode step while 'a' is chunked"
    no_block = dataclasses.replace(chunked, kv=dataclasses.replace(chunked.kv, free_block_ids=()))
    assert CHECKS["SG-PREFILL-FIRST"](dataclasses.replace(good, pre=no_block)) == []


@cases("SG-ONE-CHUNKED")
def case_a_second_request_mid_prefill() -> Case:
    good = sglang_chunk().state
    bad = with_policy(good, chunked_request_id=None)
    return Case("SG-ONE-CHUNKED", good, bad, "mid-prefill but not the chunked request", "a")


@cases("SG-RATIO")
def case_a_decode_that_does_not_decay_the_ratio() -> Case:
    good = sglang_decode()
    assert good.pre.sglang is not None
    bad = dataclasses.replace(
        good, post=with_policy(good.post, new_token_ratio=good.pre.sglang.new_token_ratio)
    )
    return Case("SG-RATIO", good, bad, "new_token_ratio after a decode step")


@cases("SG-RATIO")
def case_a_retraction_without_the_jump() -> Case:
    _, good = sglang_retraction()
    bad = dataclasses.replace(good, post=with_policy(good.post, new_token_ratio=0.07))
    # b survives with 8 outputs of 12: (8 + 20) / 13 > 1.
    return Case("SG-RATIO", good, bad, "after a decode step", expected=1.0, actual=0.07)


def sglang_admission_after_finishes() -> ScheduleTransition:
    """The ADMISSION example: r0 and r2 finish in the decode that closed the latch; the
    next step admits r3 beside the still running r1."""
    driver = Driver(
        family="sglang",
        block_size=1,
        num_blocks=68,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=68,
        schedule_conservativeness=0.1,
        enable_prefix_caching=True,
    )
    for i, (prompt, max_tokens) in enumerate([(10, 3), (20, 25), (8, 3), (15, 25), (12, 25)]):
        driver.add(f"r{i}", prompt, max_tokens=max_tokens)
    driver.steps(4)
    t = driver.schedule()
    assert t.pre.sglang is not None and t.pre.sglang.batch_is_full
    assert t.pre.running == ("r1",) and t.finished_since_last_schedule == {"r0", "r2"}
    assert dict(t.output.num_scheduled_tokens) == {"r3": 15}
    return t


@cases("SG-LATCH")
def case_admitting_through_a_closed_latch() -> Case:
    good = sglang_admission_after_finishes()
    bad = dataclasses.replace(good, finished_since_last_schedule=frozenset())
    return Case("SG-LATCH", good, bad, "admitted ['r3'] while the latch was closed")


@cases("SG-LATCH")
def case_admitting_through_a_latch_an_extend_closed() -> Case:
    """The same admission after an extend step that closed the latch (its pass ran out of
    memory), with nothing finished and no request of the running batch scheduled by it:
    the latch is still closed when the next pass begins, so nothing may be admitted."""
    good = sglang_admission_after_finishes()
    bad = dataclasses.replace(
        good,
        pre=with_policy(good.pre, last_batch_kind="extend"),
        finished_since_last_schedule=frozenset(),
        left_running={},
        previous_step=frozenset(),
    )
    return Case("SG-LATCH", good, bad, "admitted ['r3'] while the latch was closed")


@cases("SG-ADMISSION")
def case_admitting_a_future_that_does_not_fit() -> Case:
    good = sglang_latch_admission()
    # With 20 free slots b's future (10 + 20 + 1) cannot fit.
    fewer = with_kv(good.pre, free_block_ids=good.pre.kv.free_block_ids[:20])
    bad = dataclasses.replace(good, pre=fewer)
    return Case("SG-ADMISSION", good, bad, "its future did not fit", "b")


@cases("SG-ADMISSION")
def case_admitting_out_of_queue_order() -> Case:
    good = sglang_latch_admission()
    bad = dataclasses.replace(good, pre=dataclasses.replace(good.pre, waiting=("c", "b")))
    return Case("SG-ADMISSION", good, bad, "not the head of the waiting queue in order")


@cases("SG-ADMISSION")
def case_an_exact_fit_is_no_fit() -> Case:
    good = sglang_latch_admission()
    # Nothing runs, so the reservations are exact: with 31 free slots b's future
    # (10 + 20 + 1) equals the room, and SGLang's fit test is strict.
    exact = with_kv(good.pre, free_block_ids=good.pre.kv.free_block_ids[:31])
    bad = dataclasses.replace(good, pre=exact)
    return Case(
        "SG-ADMISSION", good, bad, "its future did not fit", "b", expected="< 31", actual=31
    )


def sglang_budget_stop() -> ScheduleTransition:
    """The BUDGET example: a chunk budget of 8 takes b (6 tokens) and the first 2 of
    c's 6 as a chunk; d, which fits the pool with room to spare, waits for the next
    pass, and the latch stays open."""
    driver = Driver(**CHUNKED)
    for rid in ("b", "c", "d"):
        driver.add(rid, 6, max_tokens=2)
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"b": 6, "c": 2}
    assert t.post.waiting == ("d",)
    assert t.post.sglang is not None and not t.post.sglang.batch_is_full
    return t


@cases("SG-LATCH")
def case_the_latch_closed_on_a_spent_budget_before_a_big_future() -> Case:
    """The budget example with d asking for 1000 tokens: its future no longer fits, but
    the pass stopped on the spent chunk budget before reading it, with memory left after
    b and c's chunk, so it leaves the latch open; a closed one is wrong."""
    good = sglang_budget_stop()
    big = dataclasses.replace(good.pre.requests["d"], max_tokens=1000)
    pre = dataclasses.replace(good.pre, requests={**good.pre.requests, "d": big})
    good = dataclasses.replace(good, pre=pre)
    bad = dataclasses.replace(good, post=with_policy(good.post, batch_is_full=True))
    return Case("SG-LATCH", good, bad, "closed the latch with memory and seats to spare")


@cases("SG-ADMISSION")
def case_a_chunk_over_the_budget() -> Case:
    good = sglang_budget_stop()
    bad = with_scheduled(good, {"b": 6, "c": 4})
    return Case("SG-ADMISSION", good, bad, "not the chunk budget's", "c", expected=2, actual=4)


@cases("SG-ADMISSION-STOP")
def case_a_fitting_request_left_waiting() -> Case:
    good = sglang_latch_admission()
    # a left the running batch, so the latch is open; c (4 + 2 + 1) fits beside b.
    bad = with_output(
        with_scheduled(good, {"b": 10}),
        scheduled_new_reqs=[n for n in good.output.scheduled_new_reqs if n.request_id == "b"],
    )
    return Case("SG-ADMISSION-STOP", good, bad, "left waiting although its future fits", "c")


@cases("SG-ADMISSION-STOP")
def case_nothing_admitted_after_a_finish() -> Case:
    good = sglang_latch_admission()
    bad = with_output(with_scheduled(good, {}), scheduled_new_reqs=[])
    return Case("SG-ADMISSION-STOP", good, bad, "left waiting although its future fits", "b")


@cases("SG-LATCH")
def case_the_latch_closed_by_a_spent_budget() -> Case:
    good = sglang_budget_stop()
    bad = dataclasses.replace(good, post=with_policy(good.post, batch_is_full=True))
    return Case("SG-LATCH", good, bad, "closed the latch with memory and seats to spare")


@cases("SG-CHUNK-ROOM")
def case_a_chunk_past_the_reservations() -> Case:
    driver = sglang_chunk()
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"a": 8}
    # Five free slots and nothing reserved leave a room of 5 for a's next chunk.
    tight = with_kv(good.pre, free_block_ids=good.pre.kv.free_block_ids[:5])
    bad = dataclasses.replace(good, pre=tight)
    return Case("SG-CHUNK-ROOM", good, bad, "larger than the room", "a", expected="<= 5", actual=8)


@cases("SG-RETRACT")
def case_the_victim_at_the_front() -> Case:
    _, good = sglang_retraction()
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("a", "c")))
    return Case(
        "SG-RETRACT", good, bad, "victims not at the back of the queue", expected=("c", "a")
    )


@cases("SG-RETRACT")
def case_the_shorter_prompt_retracted() -> Case:
    _, good = sglang_retraction()
    # Had a's prompt been the shorter, b would have been the victim.
    pre = with_request(good.pre, "a", prompt_token_ids=good.pre.requests["a"].prompt_token_ids[:3])
    bad = dataclasses.replace(good, pre=pre)
    return Case("SG-RETRACT", good, bad, "the wrong victims", expected=("b",), actual=("a",))


def sglang_decode_that_evicts() -> ScheduleTransition:
    """a and b (10-token prompts) finish and stay cached; c's decode then needs a's
    branch, the least recently used, and evicts it (nothing waits, nothing is chunked)."""
    driver = Driver(
        family="sglang",
        block_size=1,
        num_blocks=24,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        max_model_len=24,
        enable_prefix_caching=True,
    )
    driver.add("a", 10, max_tokens=2)
    driver.add("b", 10, max_tokens=2)
    driver.steps(4)
    driver.add("c", 3, max_tokens=10)
    driver.step()
    t = driver.schedule()
    before, after = t.pre.kv.block_hashes, t.post.kv.block_hashes
    evicted = [b for b, h in enumerate(before) if h is not None and after[b] != h]
    assert not t.pre.waiting and evicted
    return t


@cases("SG-EVICT-ORDER")
def case_evicting_out_of_order() -> Case:
    good = sglang_decode_that_evicts()
    kv = good.pre.kv
    pool = [b for b in kv.free_block_ids if kv.block_hashes[b] is None]
    cached = [b for b in kv.free_block_ids if kv.block_hashes[b] is not None]
    # The same blocks listed most recently used first: what went was not first in line.
    bad = dataclasses.replace(
        good, pre=with_kv(good.pre, free_block_ids=(*pool, *reversed(cached)))
    )
    return Case("SG-EVICT-ORDER", good, bad, "not the first of the eviction order")


@cases("SG-EVICT-ORDER")
def case_a_pool_slot_after_the_evictable_ones() -> Case:
    good = sglang_decode_that_evicts()
    kv = good.post.kv
    pool = [b for b in kv.free_block_ids if kv.block_hashes[b] is None]
    cached = [b for b in kv.free_block_ids if kv.block_hashes[b] is not None]
    assert pool and cached
    bad = dataclasses.replace(
        good, post=with_kv(good.post, free_block_ids=(*pool[1:], *cached, pool[0]))
    )
    return Case("SG-EVICT-ORDER", good, bad, "a free slot without a hash after evictable")


def _order_unobserved(state: State) -> State:
    assert state.sglang is not None
    return dataclasses.replace(
        state, sglang=dataclasses.replace(state.sglang, eviction_order_observed=False)
    )


@cases("SG-EVICT-ORDER")
def case_evicting_a_block_that_was_not_evictable() -> Case:
    """Where the engine hides its eviction order (FINDINGS G2) the profile still holds
    it to evicting only evictable blocks: one left out of the free queue was held."""
    good = sglang_decode_that_evicts()
    good = dataclasses.replace(good, pre=_order_unobserved(good.pre))
    before, after = good.pre.kv.block_hashes, good.post.kv.block_hashes
    evicted = [b for b, h in enumerate(before) if h is not None and after[b] != h]
    free = tuple(b for b in good.pre.kv.free_block_ids if b != evicted[0])
    bad = dataclasses.replace(good, pre=with_kv(good.pre, free_block_ids=free))
    return Case("SG-EVICT-ORDER", good, bad, "not evictable", actual=(evicted[0],))


def _with_free_blocks_swapped(t: ScheduleTransition, x: int, y: int) -> ScheduleTransition:
    """The step with blocks x and y trading places in the free queue after it."""
    swapped = tuple({x: y, y: x}.get(b, b) for b in t.post.kv.free_block_ids)
    return dataclasses.replace(t, post=with_kv(t.post, free_block_ids=swapped))


@cases("SG-EVICT-ORDER")
def case_waiting_prefixes_refreshed_head_first() -> Case:
    """The refresh run head first (c's prefix, then d's): a's first page, which the
    head c starts with, would be evicted before b's."""
    good = sglang_waiting_prefix_refresh()
    bad = _with_free_blocks_swapped(good, 0, 2)
    return Case(
        "SG-EVICT-ORDER",
        good,
        bad,
        "refreshed pages not in reverse queue order",
        expected=(2, 0),
        actual=(0, 2),
    )


@cases("SG-EVICT-ORDER")
def case_deeper_pages_refreshed_head_first() -> Case:
    """c and d share their first page, so only their second pages tell the refresh's
    order: run head first (c's path, then d's), a's second page (block 1, c's) would be
    evicted before b's (block 2, d's). rv-touch-waiting-head-first survived seed 9 of
    the kill table where only first pages were judged."""
    good = sglang_refresh_of_deeper_pages()
    assert refreshed_pages(good) == {0: 0, 1: 0, 2: 1}
    bad = _with_free_blocks_swapped(good, 1, 2)
    return Case(
        "SG-EVICT-ORDER",
        good,
        bad,
        "block 1 (place 0) is evicted before block 2 (place 1)",
        expected=(2, 1),
        actual=(1, 2),
    )


def test_a_refreshed_head_the_pass_admits_keeps_its_place() -> None:
    """The head h, refreshed last and then admitted with a one-token prompt (its match
    locks nothing), leaves a's first page (block 0) the most recent of the first pages,
    at h's place, though e, further back, starts with it too: no violation (judging
    block 0 at e's place, as if h had never been in the queue, was a false alarm on the
    reference under sglang-mixed-overcommit)."""
    t = sglang_refresh_pass_admits_the_head()
    assert refreshed_pages(t) == {0: 0, 2: 1}
    evictable = evictable_blocks(t.post)
    assert evictable.index(2) < evictable.index(0)
    assert CHECKS["SG-EVICT-ORDER"](t) == []


def test_a_refresh_is_judged_only_on_the_pass_that_runs_it() -> None:
    """The head-first order passes where the state says no refresh ran: a pass counted
    at 33 (not a multiple of 32), or an engine that keeps no count (None)."""
    bad = case_waiting_prefixes_refreshed_head_first().bad
    assert isinstance(bad, ScheduleTransition)
    for passes in (33, None):
        pre = with_policy(bad.pre, prefill_passes=passes)
        post = with_policy(bad.post, prefill_passes=None if passes is None else passes + 1)
        assert CHECKS["SG-EVICT-ORDER"](dataclasses.replace(bad, pre=pre, post=post)) == []


def test_an_unobserved_eviction_order_is_not_held_to_lru() -> None:
    """The out-of-order free queue of case_evicting_out_of_order passes once the state
    says the order is not the cache's (the SGLang adapter's snapshot: FINDINGS G2)."""
    bad = case_evicting_out_of_order().bad
    assert isinstance(bad, ScheduleTransition)
    unobserved = dataclasses.replace(bad, pre=_order_unobserved(bad.pre))
    assert CHECKS["SG-EVICT-ORDER"](unobserved) == []


@pytest.mark.parametrize("build", cases.params())
def test_the_invariant_holds_on_the_real_run(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_the_invariant_fires_on_the_corruption(build: CaseBuilder) -> None:
    assert_caught(build())


def test_the_profiles_of_the_split() -> None:
    assert {CATALOGUE[i].profile for i in ("ABORT-AT-ONCE", "STALE-KEPT", "TABLE-GROWS")} == {
        "vllm-v1"
    }
    sglang = {i for i, info in CATALOGUE.items() if info.profile == "sglang"}
    assert sglang == {
        "SG-PREFILL-FIRST",
        "SG-ONE-CHUNKED",
        "SG-RATIO",
        "SG-LATCH",
        "SG-ADMISSION",
        "SG-ADMISSION-STOP",
        "SG-CHUNK-ROOM",
        "SG-RETRACT",
        "SG-EVICT-ORDER",
        *test_invariants_sglang_lifecycle.cases.ids(),
    }
    assert sglang <= cases.ids() | test_invariants_sglang_lifecycle.cases.ids()


def test_sglang_state_is_what_the_profile_reads() -> None:
    assert isinstance(sglang_chunk().state.sglang, SGLangState)


def test_a_refreshed_request_tried_behind_an_admission_may_be_the_most_recent() -> None:
    """The reference under the opening long-after-decodes (seed 3 of 25 examples of
    sglang-mixed-overcommit): the 32nd pass refreshes r32 (prompt 1), r33 (5 5 ...) and
    those behind, admits r32 (its one-token match locks nothing, so its first page keeps
    r32's place), then tries r33, whose match touches r33's first page last. The two
    first pages end in queue order, not reverse: no violation (SGLang 0.5.23, in
    lockstep with the reference on this trace, made the same decisions)."""
    trace = regression_trace("sglang-refresh-tries-the-head-behind-an-admission")
    replay(trace, reference_engine, "sglang")
