"""The `sglang` profile's lifecycle invariants (schedspec/spec/invariants/sglang/lifecycle.py):
each holds on a real run of the reference's SGLang family and fires on the corruption
its docs/SPEC.md section describes."""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.spec.invariants import CATALOGUE, ScheduleTransition
from schedspec.spec.invariants.sglang import lifecycle
from tests.invariant_builders import (
    SGLANG_CHUNKED,
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    with_kv,
)

cases = CaseRegistry()

MIXED = {
    "family": "sglang",
    "block_size": 1,
    "num_blocks": 64,
    "max_num_batched_tokens": 16,
    "max_num_seqs": 4,
    "max_model_len": 64,
    "enable_chunked_prefill": True,
    "enable_mixed_chunk": True,
}
# SG-CHUNKED-ABORT's worked example: 8-token chunks of a 20-token prompt.
CHUNKED = SGLANG_CHUNKED


def mixed_step() -> ScheduleTransition:
    """a and b decoding; c and d admitted in a mixed step, where a and b decode."""
    driver = Driver(**MIXED)
    driver.add("a", 4, max_tokens=8)
    driver.add("b", 4, max_tokens=8)
    driver.steps(2)
    driver.add("c", 4, max_tokens=4)
    driver.add("d", 4, max_tokens=4)
    t = driver.schedule()
    assert t.post.sglang is not None and t.post.sglang.last_batch_kind == "mixed"
    assert t.pre.running == ("a", "b") and t.post.running == ("c", "d", "a", "b")
    return t


@cases("SG-RUNNING-ORDER")
def case_the_decodes_before_the_admissions() -> Case:
    good = mixed_step()
    bad = dataclasses.replace(
        good, post=dataclasses.replace(good.post, running=("a", "b", "c", "d"))
    )
    return Case(
        "SG-RUNNING-ORDER",
        good,
        bad,
        "after a mixed step",
        expected=("c", "d", "a", "b"),
        actual=("a", "b", "c", "d"),
    )


@cases("SG-RUNNING-ORDER")
def case_admissions_out_of_queue_order() -> Case:
    good = mixed_step()
    bad = dataclasses.replace(
        good, post=dataclasses.replace(good.post, running=("d", "c", "a", "b"))
    )
    return Case("SG-RUNNING-ORDER", good, bad, "after a mixed step", expected=("c", "d", "a", "b"))


def test_a_completed_chunk_comes_before_the_admissions() -> None:
    """The chunked request's last chunk is the new batch's first request."""
    driver = Driver(**CHUNKED)
    driver.add("a", 12, max_tokens=4)
    driver.step()
    driver.add("b", 3, max_tokens=4)
    t = driver.schedule()
    assert t.pre.sglang is not None and t.pre.sglang.chunked_request_id == "a"
    assert list(t.output.num_scheduled_tokens) == ["a", "b"] and t.post.running == ("a", "b")
    assert lifecycle.check_running_order(t) == []
    swapped = dataclasses.replace(t, post=dataclasses.replace(t.post, running=("b", "a")))
    assert [v.invariant for v in lifecycle.check_running_order(swapped)] == ["SG-RUNNING-ORDER"]


def chunked_abort() -> ScheduleTransition:
    """SG-CHUNKED-ABORT's worked example: a's second chunk (blocks 8-15) is computed
    and uncached when a is aborted; the next schedule ends a."""
    driver = Driver(**CHUNKED)
    driver.add("a", 20, max_tokens=2)
    driver.steps(2)
    driver.abort("a")
    t = driver.schedule()
    assert t.pre.sglang is not None and t.pre.sglang.chunked_request_id == "a"
    assert t.pre.requests["a"].abort_pending and "a" not in t.post.requests
    hashes = t.post.kv.block_hashes
    assert [b for b in range(16) if hashes[b] is not None] == list(range(8))
    return t


@cases("SG-CHUNKED-ABORT")
def case_the_aborted_chunk_cached() -> Case:
    good = chunked_abort()
    hashes = list(good.post.kv.block_hashes)
    hashes[8] = hashes[0]  # any hash: block 8 went into the radix tree
    bad = dataclasses.replace(good, post=with_kv(good.post, block_hashes=tuple(hashes)))
    return Case("SG-CHUNKED-ABORT", good, bad, "uncached KV was cached", "a", actual=(8,))


@cases("SG-CHUNKED-ABORT")
def case_the_aborted_chunked_request_kept() -> Case:
    good = chunked_abort()
    # The engine left it as it was: still chunked, still live.
    bad = dataclasses.replace(good, post=good.pre)
    return Case("SG-CHUNKED-ABORT", good, bad, "still live", "a")


def test_an_abort_before_it_was_chunked_is_not_judged() -> None:
    """Only an abort that named the chunked request binds: without one since the last
    schedule (a deferred abort kept through a retraction), the step is not judged."""
    bad = case_the_aborted_chunked_request_kept().bad
    assert isinstance(bad, ScheduleTransition)
    unnamed = dataclasses.replace(bad, aborted_since_last_schedule=frozenset())
    assert lifecycle.check_chunked_abort(unnamed) == []


def retraction_with_cache() -> ScheduleTransition:
    """a (prompt 10) and b (prompt 8) decode 40 tokens each in 64 slots with the radix
    cache on; the 26th schedule retracts a, whose 23 outputs free enough for b's 20
    decodes: a's cached prompt (10 slots) stays evictable."""
    driver = Driver(
        family="sglang",
        block_size=1,
        num_blocks=64,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=64,
        schedule_conservativeness=0.1,
        enable_prefix_caching=True,
    )
    driver.add("a", 10, max_tokens=40)
    driver.add("b", 8, max_tokens=40)
    driver.add("c", 5, max_tokens=40)
    driver.steps(25)
    t = driver.schedule()
    assert t.output.preempted_req_ids == {"a"}
    kv = t.post.kv
    free = [b for b in kv.free_block_ids if kv.block_hashes[b] is None]
    assert len(free) == 22 and len(kv.free_block_ids) - len(free) == 10
    return t


@cases("SG-RETRACT-EVICT")
def case_the_tree_kept_after_a_retraction() -> Case:
    good = retraction_with_cache()
    kv = good.post.kv
    free = [b for b in kv.free_block_ids if kv.block_hashes[b] is None]
    hashes = list(kv.block_hashes)
    cached = next(h for h in hashes if h is not None)
    for block in free[:5]:  # five slots the tree kept instead of freeing
        hashes[block] = cached
    bad = dataclasses.replace(good, post=with_kv(good.post, block_hashes=tuple(hashes)))
    return Case("SG-RETRACT-EVICT", good, bad, "evictable blocks left", expected=">= 20", actual=18)


@pytest.mark.parametrize("build", cases.params())
def test_the_invariant_holds_on_the_real_run(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_the_invariant_fires_on_the_corruption(build: CaseBuilder) -> None:
    assert_caught(build())


def test_the_module_registers_sglang_schedule_invariants() -> None:
    ids = {"SG-RUNNING-ORDER", "SG-CHUNKED-ABORT", "SG-RETRACT-EVICT"}
    assert cases.ids() == ids
    assert {(CATALOGUE[i].profile, CATALOGUE[i].kind) for i in ids} == {("sglang", "schedule")}
