"""PROGRESS, the bounded-progress invariant (docs/SPEC.md, "PROGRESS"): worked examples.

#39734's shape: a request that needs the whole KV pool sits at the head of the waiting
queue while others arrive behind it. The config refuses the pool of the upstream report
(smaller than one max_model_len request); in the tightest pool it accepts, the reference
holds the head back while anything runs and admits it in the first step in which nothing
does. An engine that passes over it instead, running the later arrivals, is judged in
that very step, while NO-EMPTY-STEP (something was scheduled) says nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest, Event, Step
from schedspec.engines.protocol import EngineFactory
from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError
from schedspec.spec import ConfigError, SchedulerConfig
from schedspec.spec.invariants import (
    PassedOver,
    Profile,
    passed_over_after,
    passed_over_head,
    progress_step_bound,
)
from tests.invariant_builders import Driver
from tests.mutants.catalogue import MUTANTS
from tests.mutants.mutation import build_mutant_package, engine_factory
from tests.test_invariants_step import EMPTY_OUTPUT

# The tightest pool the config accepts: 4 blocks of 4 slots, one max_model_len request.
TIGHT = SchedulerConfig(
    block_size=4,
    num_blocks=4,
    max_num_batched_tokens=16,
    max_num_seqs=2,
    max_model_len=16,
    enable_chunked_prefill=True,
)
PASSED_OVER = "head-needing-whole-pool-passed-over"


def prompt(first: int, n: int) -> tuple[int, ...]:
    return tuple(range(first, first + n))


# `small` runs; `big` (13 prompt tokens + 3 outputs = max_model_len: all 4 blocks) waits
# at the head behind it; `late` arrives behind `big`. While `small` holds a block, `big`
# cannot be admitted, and fcfs keeps `late` behind it.
WORKLOAD: tuple[Event, ...] = (
    AddRequest("small", prompt(100, 4), max_tokens=4),
    Step(),
    AddRequest("big", prompt(200, 13), max_tokens=3),
    AddRequest("late", prompt(300, 4), max_tokens=2),
    *[Step() for _ in range(8)],
)
SMALL_DONE = 7  # the events up to the 4th step, whose output finishes small (max_tokens 4)


def test_the_config_refuses_the_pool_of_the_upstream_report() -> None:
    """#39734's pool, smaller than one max_model_len request, is not a config of the
    spec: every admissible request fits an empty cache, which PROGRESS rests on."""
    with pytest.raises(ConfigError, match="num_blocks"):
        dataclasses.replace(TIGHT, num_blocks=3)


def run(factory: EngineFactory, events: tuple[Event, ...], profile: Profile) -> CheckedEngine:
    checked = CheckedEngine.from_factory(factory, TIGHT, profile)
    for event in events:
        checked.apply(event)
    return checked


def test_the_reference_admits_the_head_the_first_step_nothing_runs() -> None:
    checked = run(reference_engine, WORKLOAD[:SMALL_DONE], "vllm-v1")
    state = checked.state
    assert not state.running and state.waiting == ("big", "late")
    checked.apply(Step())  # nothing runs: big, which needs every block, is admitted
    assert checked.state.running == ("big",)
    assert checked.state.waiting == ("late",)
    for event in WORKLOAD[SMALL_DONE + 1 :]:
        checked.apply(event)


def test_an_engine_that_passes_over_the_head_is_judged_in_that_step(tmp_path: Path) -> None:
    mutant = next(m for m in MUTANTS if m.id == PASSED_OVER)
    factory = engine_factory(build_mutant_package(mutant, tmp_path))
    checked = run(factory, WORKLOAD[:SMALL_DONE], "safety")
    with pytest.raises(InvariantViolationError) as caught:
        checked.apply(Step())
    # late ran, so the step was not empty: only PROGRESS sees the stall.
    assert checked.state.running == ("late",)
    assert [v.invariant for v in caught.value.violations] == ["PROGRESS"]
    (violation,) = caught.value.violations
    assert violation.request_id == "big"
    assert (violation.expected, violation.actual) == (0, 1)


def test_under_async_scheduling_the_second_pass_over_is_judged_across_steps_others_ran(
    tmp_path: Path,
) -> None:
    """One step may pass over the head under async scheduling (its stale output may be
    in flight). The mutant passes `big` over once, runs `late` and `later` to their end,
    and passes it over again the next time nothing runs: the history kept across the
    steps in which they ran makes that the second time."""
    mutant = next(m for m in MUTANTS if m.id == PASSED_OVER)
    factory = engine_factory(build_mutant_package(mutant, tmp_path))
    config = dataclasses.replace(TIGHT, async_scheduling=True)
    checked = CheckedEngine.from_factory(factory, config, "safety")
    first_pass = (*WORKLOAD[:4], Step(), Step(), Step(), Step())  # small's 4 steps
    for event in (*first_pass, AddRequest("later", prompt(400, 4), max_tokens=2), Step()):
        checked.apply(event)
    assert checked.state.running == ("late", "later")  # big was passed over: allowed once
    for event in (Step(), Step(), AddRequest("last", prompt(500, 4), max_tokens=2)):
        checked.apply(event)
    assert not checked.state.running and checked.state.waiting == ("big", "last")
    with pytest.raises(InvariantViolationError) as caught:
        checked.apply(Step())
    assert [v.invariant for v in caught.value.violations] == ["PROGRESS"]
    (violation,) = caught.value.violations
    assert violation.request_id == "big"
    assert (violation.expected, violation.actual) == (1, 2)


def test_the_bound_is_one_step_in_flight_under_async_scheduling() -> None:
    assert progress_step_bound(TIGHT) == 0
    assert progress_step_bound(dataclasses.replace(TIGHT, async_scheduling=True)) == 1


def test_the_history_counts_a_head_across_steps_in_which_others_run() -> None:
    """What the harness hands the next schedule() (passed_over_after): a head passed over
    while nothing ran, counted once more each time; kept across steps in which others
    run (the next time nothing runs, passing it over again is the second time); and
    forgotten once the head is scheduled or gone."""
    driver = Driver(**dataclasses.asdict(TIGHT))
    driver.add("A", 8)
    driver.add("B", 4)
    first = driver.schedule()  # nothing runs: A, the head, is admitted, and B beside it
    assert passed_over_head(first) is None and passed_over_after(first) is None
    arrival = first.pre.requests["A"].arrival
    passed_over = dataclasses.replace(first, output=EMPTY_OUTPUT, post=first.pre)
    assert passed_over_head(passed_over) == "A"
    assert passed_over_after(passed_over) == ("A", arrival, 1)
    again = dataclasses.replace(passed_over, head_passed_over=PassedOver("A", arrival, 1))
    assert passed_over_after(again) == ("A", arrival, 2)
    scheduled = dataclasses.replace(first, head_passed_over=PassedOver("A", arrival, 1))
    assert passed_over_after(scheduled) is None  # A was scheduled: forgotten
    driver.update(first)
    driver.add("C", 4)
    others_run = driver.schedule()  # A and B run; C waits for a seat (max_num_seqs 2)
    assert "C" not in others_run.output.num_scheduled_tokens
    c_arrival = others_run.pre.requests["C"].arrival
    history = PassedOver("C", c_arrival, 1)
    kept = dataclasses.replace(others_run, head_passed_over=history)
    assert passed_over_head(kept) is None and passed_over_after(kept) == history
    reused = dataclasses.replace(others_run, head_passed_over=PassedOver("C", c_arrival + 1, 1))
    assert passed_over_after(reused) is None  # another request under the same id


def test_an_engine_that_does_not_reorder_for_cached_prefixes_makes_progress() -> None:
    """docs/upgrades U2's shape: with cache-aware admission's window, the reorder's head
    (r2, whose prefix r0 left cached) is the one the reference admits; vLLM 0.33.0, which
    has no such knob and claims safety only under it, admits the queue's own head (r1)
    instead, and that is progress. A step that admits neither passes over the reorder's
    head."""
    driver = Driver(
        block_size=1,
        num_blocks=3,
        max_num_batched_tokens=3,
        max_num_seqs=1,
        max_model_len=3,
        enable_chunked_prefill=False,
        enable_prefix_caching=True,
        cache_aware_admission_window=2,
        cache_aware_admission_threshold=0.0,
    )
    driver.add("r0", prompt=(1,), max_tokens=1)
    driver.add("r1", prompt=(0,), max_tokens=1)
    driver.add("r2", prompt=(1, 2), max_tokens=1)
    driver.update(driver.schedule())  # r0 runs and finishes; its block stays cached
    reordered = driver.schedule()
    assert reordered.pre.waiting == ("r1", "r2") and not reordered.pre.running
    assert list(reordered.output.num_scheduled_tokens) == ["r2"]
    assert passed_over_head(reordered) is None
    in_arrival_order = dataclasses.replace(
        reordered,
        output=dataclasses.replace(
            reordered.output, num_scheduled_tokens={"r1": 1}, total_num_scheduled_tokens=1
        ),
    )
    assert passed_over_head(in_arrival_order) is None
    neither = dataclasses.replace(reordered, output=EMPTY_OUTPUT, post=reordered.pre)
    assert passed_over_head(neither) == "r2"
