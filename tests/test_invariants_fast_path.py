"""The fused state fast path never vouches for a state that some covered invariant rejects.

state_holds may be stricter than the named predicates (the checker then runs them)
but never laxer. Worked examples: every good and bad state case of the catalogue;
corrupted snapshots of real reference runs; and a lax fast path that these tests
catch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import Step
from schedspec.properties.checked_engine import CheckedEngine, CheckStats
from schedspec.properties.strategies.actions import RequestDraw, request_draws
from schedspec.properties.strategies.configs import configs
from schedspec.spec import RequestStatus, SchedulerConfig, State
from schedspec.spec.invariants import CHECKS, ids_for
from schedspec.spec.invariants.safety.state_fast_path import (
    FAST_PATH_IDS,
    StateFastPath,
    state_holds,
)
from tests import (
    test_connector,
    test_invariants_families,
    test_invariants_pipeline,
    test_invariants_state,
)
from tests.invariant_builders import CaseBuilder, with_kv, with_request
from tests.sched_helpers import add_drawn

# The state cases of every registry: the fast path must agree with each.
STATE_CASES = [
    pytest.param(build, id=f"{invariant_id}:{build.__name__.removeprefix('case_')}")
    for registry in (test_invariants_state.cases, test_invariants_pipeline.cases)
    for invariant_id, build in registry.builders
    if isinstance(build().good, State)
]

# The cases of the other covered state invariants (LOAD-PARKED, STALE-KEPT), kept in
# the registries of their families. A LOAD-PARKED good case has a load in flight, which
# the fast path leaves to the named predicates, so these are held to soundness and to
# turning down the bad case, not to vouching for the good one.
COVERED_ELSEWHERE = [
    pytest.param(build, id=f"{invariant_id}:{build.__name__.removeprefix('case_')}")
    for registry in (test_connector.cases, test_invariants_families.cases)
    for invariant_id, build in registry.builders
    if invariant_id in FAST_PATH_IDS and isinstance(build().good, State)
]

FastPath = Callable[[State], bool]


def covered_violations(state: State) -> list[str]:
    return [str(v) for i in sorted(FAST_PATH_IDS) for v in CHECKS[i](state)]


def assert_sound(fast_path: FastPath, state: State) -> None:
    """If the fast path vouches for the state, every covered predicate agrees."""
    if fast_path(state):
        assert covered_violations(state) == [], "the fast path vouched for a bad state"


def test_fast_path_covers_state_invariants_only() -> None:
    assert set(ids_for("state", "vllm-v1")) >= FAST_PATH_IDS


def test_the_state_cases_cover_every_fast_path_id() -> None:
    covered = {p.id.split(":")[0] for p in [*STATE_CASES, *COVERED_ELSEWHERE]}  # type: ignore[union-attr]
    assert covered >= FAST_PATH_IDS


@pytest.mark.parametrize("build", STATE_CASES)
def test_fast_path_vouches_for_every_good_case(build: CaseBuilder) -> None:
    good = build().good
    assert isinstance(good, State)
    assert state_holds(good)


@pytest.mark.parametrize("build", COVERED_ELSEWHERE)
def test_fast_path_is_sound_on_the_other_good_cases(build: CaseBuilder) -> None:
    good = build().good
    assert isinstance(good, State)
    assert_sound(state_holds, good)


@pytest.mark.parametrize("build", [*STATE_CASES, *COVERED_ELSEWHERE])
def test_fast_path_rejects_every_bad_case(build: CaseBuilder) -> None:
    bad = build().bad
    assert isinstance(bad, State)
    assert not state_holds(bad)
    assert_sound(state_holds, bad)


@pytest.mark.parametrize("build", [*STATE_CASES, *COVERED_ELSEWHERE])
def test_the_run_fast_path_rejects_every_bad_case_after_its_good_one(build: CaseBuilder) -> None:
    """StateFastPath, having seen the good state (whose records and KV state the bad
    one mostly shares), answers as state_holds does."""
    case = build()
    assert isinstance(case.good, State) and isinstance(case.bad, State)
    fast_path = StateFastPath()
    assert fast_path.holds(case.good) == state_holds(case.good)
    assert not fast_path.holds(case.bad)


def test_a_lax_fast_path_is_caught() -> None:
    """The soundness check has teeth: a fast path that skips EXCLUSIVE's sharing rule fails it."""
    (build,) = [
        b
        for _, b in test_invariants_state.cases.builders
        if b.__name__ == "case_uncached_block_shared"
    ]
    bad = build().bad
    assert isinstance(bad, State)
    with pytest.raises(AssertionError, match="vouched for a bad state"):
        assert_sound(lambda state: True, bad)


def _corruptions(state: State) -> list[State]:
    """Small single-field corruptions of a real snapshot (most break some invariant)."""
    out: list[State] = []
    kv = state.kv
    for block in range(min(kv.num_blocks, 4)):
        refs = list(kv.ref_counts)
        refs[block] += 1
        out.append(with_kv(state, ref_counts=tuple(refs)))
    if kv.free_block_ids:
        out.append(with_kv(state, free_block_ids=kv.free_block_ids[1:]))
        out.append(with_kv(state, free_block_ids=(*kv.free_block_ids, kv.free_block_ids[0])))
    if kv.prefix_cache:
        out.append(with_kv(state, prefix_cache=kv.prefix_cache[1:]))
    for rid, request in state.requests.items():
        if request.block_ids:
            table = request.block_ids
            out.append(with_request(state, rid, block_ids=table[:-1]))
            out.append(with_request(state, rid, block_ids=(*table, table[0])))
            out.append(with_request(state, rid, status=RequestStatus.WAITING))
        out.append(with_request(state, rid, status=RequestStatus.FINISHED_ABORTED))
        out.append(with_request(state, rid, max_tokens=len(request.output_token_ids)))
        if request.output_token_ids:
            out.append(with_request(state, rid, eos_token_id=request.output_token_ids[-1]))
    if state.running and state.waiting:
        # Each queue the right size, a request in the wrong one.
        running, waiting = list(state.running), list(state.waiting)
        running[-1], waiting[0] = waiting[0], running[-1]
        out.append(dataclasses.replace(state, running=tuple(running), waiting=tuple(waiting)))
    if state.running:
        out.append(dataclasses.replace(state, running=state.running[:-1]))
        out.append(
            dataclasses.replace(state, config=dataclasses.replace(state.config, max_num_seqs=1))
            if len(state.running) > 1
            else dataclasses.replace(state, running=(*state.running, state.running[0]))
        )
    return out


@given(
    config=configs(),
    draws=st.lists(request_draws, min_size=1, max_size=6),
    num_steps=st.integers(1, 8),
)
def test_fast_path_on_real_and_corrupted_snapshots(
    config: SchedulerConfig, draws: list[RequestDraw], num_steps: int
) -> None:
    checked = CheckedEngine.from_factory(reference_engine, config, "vllm-v1", stats=CheckStats())
    for index, drawn in enumerate(draws):
        add_drawn(checked, config, index, drawn)
    for _ in range(num_steps):
        checked.apply(Step())
        state = checked.state
        assert state_holds(state), "a real snapshot must pass the fast path"
        for corrupted in _corruptions(state):
            assert_sound(state_holds, corrupted)
            # Seen after the snapshot it corrupts (sharing its other records and,
            # mostly, its KV state), the run's fast path answers as state_holds does.
            fast_path = StateFastPath()
            assert fast_path.holds(state)
            assert fast_path.holds(corrupted) == state_holds(corrupted)
