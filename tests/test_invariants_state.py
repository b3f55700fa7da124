"""State invariants are not vacuous: each fires on a corrupted real snapshot, naming the
request or block at fault, and holds on the snapshot it was corrupted from.

Also home of the meta-test: every catalogue id has a bad-state case in one of the
three invariant test modules.
"""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.spec import Request, RequestState, RequestStatus, State
from schedspec.spec.invariants import CATALOGUE
from tests import (
    test_connector,
    test_invariants_allocation,
    test_invariants_cache_aware,
    test_invariants_completeness,
    test_invariants_families,
    test_invariants_hybrid,
    test_invariants_pipeline,
    test_invariants_policy,
    test_invariants_sglang_lifecycle,
    test_invariants_step,
)
from tests.invariant_builders import (
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    tokens,
    with_config,
    with_kv,
    with_ref_count,
    with_request,
)

cases = CaseRegistry()

PROMPT = tokens(100, 10)


def shared_prefix_state() -> State:
    """A and B running and sharing two cached prompt blocks; C waiting (max_num_seqs 2).

    block_size 4: A holds (0, 1, 2), B holds (0, 1, 3); blocks 0 and 1 are full,
    cached and held by both (ref count 2); 4..15 are free.
    """
    driver = Driver(enable_prefix_caching=True, max_num_seqs=2, num_blocks=16, max_model_len=48)
    driver.add("A", prompt=PROMPT)
    driver.add("B", prompt=(*PROMPT[:8], 500, 501))
    driver.add("C", 5)
    driver.step()
    state = driver.state
    assert state.requests["A"].block_ids == (0, 1, 2)
    assert state.requests["B"].block_ids == (0, 1, 3)
    assert state.running == ("A", "B") and state.waiting == ("C",)
    return state


# ------------------------------------------------------------- CONSERVATION


@cases("CONSERVATION")
def case_ref_count_above_holders() -> Case:
    good = shared_prefix_state()
    bad = with_kv(good, ref_counts=with_ref_count(good.kv, 2, 2))
    return Case(
        "CONSERVATION",
        good,
        bad,
        "ref count differs from the number of tables holding the block",
        block_id=2,
        expected=1,
        actual=2,
    )


def unshared_state() -> State:
    """A running alone, holding blocks (0, 1, 2) once each (block_size 4); 3..15 free."""
    driver = Driver(enable_prefix_caching=True, num_blocks=16, max_model_len=48)
    driver.add("A", prompt=PROMPT)
    driver.step()
    state = driver.state
    assert state.requests["A"].block_ids == (0, 1, 2)
    assert state.kv.ref_counts[:4] == (1, 1, 1, 0)
    return state


@cases("CONSERVATION")
def case_ref_count_moved_to_a_free_block() -> Case:
    # The counts still sum to the holders, and no block is shared: the count taken
    # from held block 1 shows up on free block 3.
    good = unshared_state()
    moved = with_ref_count(good.kv, 1, 0)
    bad = with_kv(good, ref_counts=(*moved[:3], 1, *moved[4:]))
    return Case(
        "CONSERVATION",
        good,
        bad,
        "ref count differs from the number of tables holding the block",
        block_id=1,
        expected=1,
        actual=0,
    )


@cases("CONSERVATION")
def case_held_block_in_free_queue() -> Case:
    good = shared_prefix_state()
    bad = with_kv(good, free_block_ids=(2, *good.kv.free_block_ids))
    return Case("CONSERVATION", good, bad, "ref count 1 but in the free queue", block_id=2)


@cases("CONSERVATION")
def case_leaked_block() -> Case:
    # Block 4 is held by nobody, but has left the free queue: a leak.
    good = shared_prefix_state()
    bad = with_kv(good, free_block_ids=good.kv.free_block_ids[1:])
    return Case("CONSERVATION", good, bad, "ref count 0 but not in the free queue", block_id=4)


@cases("CONSERVATION")
def case_free_plus_held_short() -> Case:
    good = shared_prefix_state()
    bad = with_kv(good, free_block_ids=good.kv.free_block_ids[1:])
    return Case(
        "CONSERVATION",
        good,
        bad,
        "free + held blocks do not add up to num_blocks",
        expected=16,
        actual=15,
    )


@cases("CONSERVATION")
def case_table_holds_block_twice() -> Case:
    good = shared_prefix_state()
    bad = with_request(good, "A", block_ids=(0, 1, 2, 2))
    return Case("CONSERVATION", good, bad, "table holds blocks [2] twice", request_id="A")


@cases("CONSERVATION")
def case_free_queue_duplicate() -> Case:
    good = shared_prefix_state()
    bad = with_kv(good, free_block_ids=(*good.kv.free_block_ids, 4))
    return Case("CONSERVATION", good, bad, "blocks [4] are in the free queue twice")


@cases("CONSERVATION")
def case_block_id_out_of_range() -> Case:
    good = shared_prefix_state()
    bad = with_request(good, "A", block_ids=(0, 1, 2, 99))
    return Case("CONSERVATION", good, bad, "block id out of range", request_id="A", block_id=99)


# ---------------------------------------------------------------- EXCLUSIVE


@cases("EXCLUSIVE")
def case_uncached_block_shared() -> Case:
    # B writes into A's partial tail block: two writers of one uncached block.
    good = shared_prefix_state()
    bad = with_request(good, "B", block_ids=(0, 1, 2))
    return Case("EXCLUSIVE", good, bad, "shared by [('A', 2), ('B', 2)] but not cached", block_id=2)


@cases("EXCLUSIVE")
def case_partial_block_shared() -> Case:
    good = shared_prefix_state()
    bad = with_request(good, "B", block_ids=(0, 1, 2))
    return Case(
        "EXCLUSIVE", good, bad, "shared block is not full at index 2", request_id="A", block_id=2
    )


@cases("EXCLUSIVE")
def case_shared_at_different_positions() -> Case:
    good = shared_prefix_state()
    bad = with_request(good, "B", block_ids=(1, 0, 3))
    return Case("EXCLUSIVE", good, bad, "shared at different positions", block_id=0)


# -------------------------------------------------------------- CACHE-INDEX


@cases("CACHE-INDEX")
def case_cached_block_missing_from_map() -> Case:
    good = shared_prefix_state()
    (hash0, _), entry1 = good.kv.prefix_cache
    bad = with_kv(good, prefix_cache=(entry1,))
    return Case(
        "CACHE-INDEX",
        good,
        bad,
        "block hash and prefix-cache map disagree",
        block_id=0,
        expected=hash0,
        actual="not in the map",
    )


@cases("CACHE-INDEX")
def case_empty_map_entry() -> Case:
    good = shared_prefix_state()
    bad = with_kv(good, prefix_cache=(*good.kv.prefix_cache, (0xABC, ())))
    return Case("CACHE-INDEX", good, bad, "empty entry for hash 0xabc")


@cases("CACHE-INDEX")
def case_block_indexed_twice() -> Case:
    good = shared_prefix_state()
    entry0, (hash1, _) = good.kv.prefix_cache
    bad = with_kv(good, prefix_cache=(entry0, (hash1, (1, 0))))
    return Case("CACHE-INDEX", good, bad, "block indexed twice", block_id=0)


# ------------------------------------------------------------------- QUEUES


@cases("QUEUES")
def case_queued_twice() -> Case:
    good = shared_prefix_state()
    bad = State(good.config, good.requests, ("C", "A"), good.running, good.kv)
    return Case("QUEUES", good, bad, "queued 2 times", request_id="A")


@cases("QUEUES")
def case_waiting_request_in_running() -> Case:
    good = shared_prefix_state()
    bad = State(good.config, good.requests, (), ("A", "B", "C"), good.kv)
    return Case("QUEUES", good, bad, "status WAITING but in running", request_id="C")


@cases("QUEUES")
def case_running_request_in_waiting() -> Case:
    good = shared_prefix_state()
    bad = State(good.config, good.requests, ("B", "C"), ("A",), good.kv)
    return Case("QUEUES", good, bad, "status RUNNING but in waiting", request_id="B")


@cases("QUEUES")
def case_waiting_request_holds_blocks() -> Case:
    good = shared_prefix_state()
    bad = with_request(good, "C", block_ids=(4,), num_computed_tokens=4)
    return Case(
        "QUEUES",
        good,
        bad,
        "waiting but holds: block_ids",
        request_id="C",
        expected=(),
        actual=(4,),
    )


@cases("QUEUES")
def case_preempted_never_counted() -> Case:
    good = shared_prefix_state()
    bad = with_request(good, "C", status=RequestStatus.PREEMPTED)
    return Case("QUEUES", good, bad, "PREEMPTED with num_preemptions 0", request_id="C")


@cases("QUEUES")
def case_request_in_no_queue() -> Case:
    good = shared_prefix_state()
    bad = State(good.config, good.requests, (), good.running, good.kv)
    return Case("QUEUES", good, bad, "unfinished but in no queue", request_id="C")


@cases("QUEUES")
def case_finished_request_still_live() -> Case:
    good = shared_prefix_state()
    bad = with_request(good, "C", status=RequestStatus.FINISHED_ABORTED)
    return Case("QUEUES", good, bad, "finished (FINISHED_ABORTED) but still live", request_id="C")


@cases("QUEUES")
def case_queued_unknown_request() -> Case:
    good = shared_prefix_state()
    bad = State(good.config, good.requests, ("C", "ghost"), good.running, good.kv)
    return Case("QUEUES", good, bad, "queued but not an unfinished request", request_id="ghost")


# --------------------------------------------------------------------- SEQS


@cases("SEQS")
def case_more_running_than_max_num_seqs() -> Case:
    good = shared_prefix_state()
    bad = with_config(good, max_num_seqs=1)
    return Case("SEQS", good, bad, "too many running requests", expected=1, actual=2)


# ------------------------------------------------------------------- LENGTH


def decoded_state() -> State:
    """A has decoded: prompt 10, outputs (7, 7, 7), max_tokens 5; C waiting."""
    driver = Driver(max_model_len=48)
    driver.add("A", prompt=PROMPT, max_tokens=5, eos_token_id=2)
    driver.steps(3)
    driver.add("C", 5)
    state = driver.state
    assert state.requests["A"].output_token_ids == (7, 7, 7)
    return state


@cases("LENGTH")
def case_live_after_eos() -> Case:
    good = decoded_state()
    bad = with_request(good, "A", output_token_ids=(7, 7, 2))
    return Case("LENGTH", good, bad, "live after emitting a stop token", request_id="A")


@cases("LENGTH")
def case_live_after_stop_token() -> Case:
    good = decoded_state()
    bad = with_request(good, "A", stop_token_ids=(7,))
    return Case("LENGTH", good, bad, "live after emitting a stop token", request_id="A")


@cases("LENGTH")
def case_live_at_max_tokens() -> Case:
    # #51299: a request held past its length cap (there, by a min_tokens early return).
    good = decoded_state()
    bad = with_request(good, "A", max_tokens=3)
    return Case("LENGTH", good, bad, "live at max_tokens", request_id="A", expected=2, actual=3)


@cases("LENGTH")
def case_live_at_max_model_len() -> Case:
    good = decoded_state()
    bad = with_config(good, max_model_len=13)
    return Case(
        "LENGTH", good, bad, "live at max_model_len", request_id="A", expected=12, actual=13
    )


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("build", cases.params())
def test_state_invariant_holds_on_the_real_snapshot(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_state_invariant_fires_on_the_corrupted_snapshot(build: CaseBuilder) -> None:
    assert_caught(build())


def test_state_cases_are_state_invariants() -> None:
    assert {CATALOGUE[i].kind for i in cases.ids()} == {"state"}


def test_every_catalogue_id_has_a_bad_case() -> None:
    """No invariant is vacuous: each one is shown to fire on some bad state or transition."""
    covered = (
        cases.ids()
        | test_invariants_step.cases.ids()
        | test_invariants_policy.cases.ids()
        | test_invariants_pipeline.cases.ids()
        | test_invariants_allocation.cases.ids()
        | test_invariants_families.cases.ids()
        | test_invariants_completeness.cases.ids()
        | test_invariants_cache_aware.cases.ids()
        | test_invariants_sglang_lifecycle.cases.ids()
        | test_connector.cases.ids()
        | test_invariants_hybrid.cases.ids()
    )
    missing = sorted(set(CATALOGUE) - covered)
    assert not missing, f"invariants with no bad-state case: {missing}"


def test_each_case_exercises_the_invariant_it_is_registered_under() -> None:
    registries = (
        cases,
        test_invariants_step.cases,
        test_invariants_policy.cases,
        test_invariants_pipeline.cases,
        test_invariants_allocation.cases,
        test_invariants_families.cases,
        test_invariants_completeness.cases,
        test_invariants_cache_aware.cases,
        test_invariants_sglang_lifecycle.cases,
        test_connector.cases,
        test_invariants_hybrid.cases,
    )
    for registry in registries:
        for invariant_id, build in registry.builders:
            assert build().invariant == invariant_id, build.__name__


# ------------------------------------------------- RequestState.of, the snapshot


def test_request_state_of_builds_the_same_frozen_record_as_the_constructor() -> None:
    """RequestState.of fills the instance in one update instead of through __init__:
    the record must be field for field the constructor's, as frozen, and a copy of
    the request's lists (an engine mutating its request later changes no snapshot)."""
    request = Request("r", (1, 2, 3), max_tokens=5, eos_token_id=2, stop_token_ids=(4,))
    request.output_token_ids.append(7)
    request.spec_token_ids.extend((8, 9))
    request.num_computed_tokens = 3
    request.status = RequestStatus.RUNNING
    fast = RequestState.of(request, (4, 5))
    built = RequestState(
        request_id="r",
        priority=0,
        arrival=-1,
        prompt_token_ids=(1, 2, 3),
        output_token_ids=(7,),
        spec_token_ids=(8, 9),
        num_computed_tokens=3,
        status=RequestStatus.RUNNING,
        block_ids=(4, 5),
        num_preemptions=0,
        max_tokens=5,
        eos_token_id=2,
        stop_token_ids=(4,),
    )
    assert fast == built and hash(fast) == hash(built)
    assert fast.num_tokens == built.num_tokens == 4  # `of` fills in the cached length
    assert vars(fast) == vars(built)  # every field and that length, and nothing else
    assert [f.name for f in dataclasses.fields(fast)] + ["num_tokens"] == list(vars(fast))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.num_computed_tokens = 0  # type: ignore[misc]
    assert dataclasses.replace(fast, num_computed_tokens=0).num_computed_tokens == 0
    request.output_token_ids.append(1)
    request.spec_token_ids.clear()
    assert fast.output_token_ids == (7,) and fast.spec_token_ids == (8, 9)
