"""gpu_impl and vLLM 0.34.0's knobs: the long-prefill rule (long_prefill_needs_chunked_prefill)
and cache-aware admission (cache_aware_admission_window / _threshold), followed block for
block: one instance (the gpu engine) in lockstep with the reference, and B instances at
once, each stepping as it does alone (gpu_impl/cache_aware.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

from schedspec.adapters.gpu import gpu_engine
from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest, Drain, Event, Step
from schedspec.engines.registry import ENGINES
from schedspec.gpu_impl.cache_aware import most_free_blocks
from schedspec.gpu_impl.device_checks import check_state, check_step
from schedspec.gpu_impl.engine import BatchedScheduler
from schedspec.gpu_impl.step_plan import StepPlan
from schedspec.gpu_impl.swarm_workload import SwarmWorkload, WorkloadShape
from schedspec.properties.differential import DiffOptions, DiffResult, diff_trace, run_diff
from schedspec.properties.strategies.configs import configs
from schedspec.properties.suite import SuiteSettings
from schedspec.spec import SchedulerConfig
from schedspec.traces.trace import Trace
from tests.gpu_helpers import busy_swarm
from tests.sched_helpers import cache_aware_config, make_config

EXACT = DiffOptions(compare_block_ids=True)


def lockstep(trace: Trace) -> DiffResult:
    result = diff_trace(trace, reference_engine, gpu_engine, "vllm-v1", EXACT)
    assert result.passed, result.divergence or result.error
    return result


def admitted(result: DiffResult) -> list[list[str]]:
    """The gpu engine's admissions, step by step (a drain's steps included)."""
    return [
        [new.request_id for new in output.scheduled_new_reqs]
        for entry in result.entries
        for output in entry.outputs[1]
    ]


def test_the_gpu_engine_runs_on_the_suites_own_configs() -> None:
    assert ENGINES["gpu"].configs is None


# ------------------------------------------------------------ the long-prefill rule


@pytest.mark.parametrize(("needs_chunked", "first_step"), [(True, 12), (False, 4)])
def test_with_chunking_off_the_cap_follows_the_release_rule(
    needs_chunked: bool, first_step: int
) -> None:
    """Two 12-token prompts, chunked prefill off, a threshold of 4: vLLM 0.34.0's rule
    (True) caps nothing without chunking, 0.33.0's caps each prompt to 4 a step."""
    config = make_config(
        enable_chunked_prefill=False,
        long_prefill_token_threshold=4,
        long_prefill_needs_chunked_prefill=needs_chunked,
    )
    events = (AddRequest("a", tuple(range(12)), 2), AddRequest("b", tuple(range(50, 62)), 2))
    result = lockstep(Trace(config, (*events, Step(), Step(), Drain())))
    first = result.entries[2].outputs[1][0]
    assert dict(first.num_scheduled_tokens) == {"a": first_step, "b": first_step}


# ------------------------------------------------------------- cache-aware admission

# Block size 4. SEED leaves three full blocks cached when it ends; WARM shares two.
SEED = tuple(range(1, 13))
COLD = tuple(range(100, 112))
WARM = (*range(1, 12), 99)


def cache_aware(events: tuple[Event, ...], **overrides: object) -> Trace:
    """SEED runs and ends (its blocks cached and free), then `events`, then a drain: a
    window of 4, a threshold of 0 (the reorder runs in an empty cache), one seat."""
    seeded = (AddRequest("seed", SEED, 1), Step())
    return Trace(cache_aware_config(**overrides), (*seeded, *events, Drain()))


def test_ties_keep_queue_order_and_the_queue_stays_reordered() -> None:
    """Deepest first, ties by queue position; the seat is taken, so nothing is admitted
    in the step that reorders, and the steps after admit in the reordered order."""
    events = (
        AddRequest("busy", tuple(range(700, 712)), 2),
        Step(),
        AddRequest("c1", (*range(200, 211), 1), 1),
        AddRequest("w1", WARM, 1),
        AddRequest("c2", COLD, 1),
        AddRequest("w2", SEED, 1),
    )
    order = [a for step in admitted(lockstep(cache_aware(events))) for a in step]
    assert order == ["seed", "busy", "w1", "w2", "c1", "c2"]


@pytest.mark.parametrize(("window", "first"), [(4, "warm"), (1, "cold"), (0, "cold")])
def test_the_window_bounds_what_moves(window: int, first: str) -> None:
    events = (AddRequest("cold", COLD, 1), AddRequest("warm", WARM, 1))
    result = lockstep(cache_aware(events, cache_aware_admission_window=window))
    assert admitted(result)[1] == [first]


@pytest.mark.parametrize(("threshold", "first"), [(0.5, "warm"), (0.51, "cold")])
def test_the_threshold_is_read_after_the_running_requests_took_their_blocks(
    threshold: float, first: str
) -> None:
    """Eight blocks; busy holds three before the step (usage 3/8) and takes a fourth for
    its next token before admission (usage 1/2): the reorder runs at 0.5, not above."""
    events = (
        AddRequest("busy", tuple(range(700, 712)), 8),
        Step(),
        AddRequest("cold", tuple(range(300, 308)), 1),
        AddRequest("warm", (*SEED[:8], 98), 1),
        Step(),
    )
    overrides = {"num_blocks": 8, "max_model_len": 32, "max_num_seqs": 2}
    trace = cache_aware(events, cache_aware_admission_threshold=threshold, **overrides)
    assert admitted(lockstep(trace))[2] == [first]


def test_no_reorder_in_a_step_that_preempted() -> None:
    """Two requests fill the cache; the step that preempts b admits nothing, and b keeps
    the head of the queue (a preempted request never moves)."""
    events: tuple[Event, ...] = (
        AddRequest("a", tuple(range(400, 408)), 100),
        AddRequest("b", tuple(range(500, 508)), 100),
        *[Step()] * 5,
        AddRequest("cold", tuple(range(600, 604)), 1),
        AddRequest("warm", (*range(400, 404), 97), 1),
        Step(),
    )
    overrides = {"num_blocks": 6, "max_model_len": 24, "max_num_seqs": 4}
    result = lockstep(cache_aware(events, **overrides))
    preempting = [e for e in result.entries if isinstance(e.event, Step)][-1].outputs[1][0]
    assert preempting.preempted_req_ids == frozenset({"b"})
    assert not preempting.scheduled_new_reqs


STARVES = (
    Path(__file__).resolve().parent.parent
    / "docs"
    / "findings"
    / "vllm-cache-aware-admission-starves-a-request.json"
)


def test_f4_starvation_replays_block_for_block() -> None:
    """docs/FINDINGS.md F4: every warm request moves ahead of cold, on both engines."""
    steps = admitted(lockstep(Trace.load(STARVES)))
    assert steps.index(["cold"]) == 9  # after the eight warm requests, one a step


def test_random_cache_aware_workloads_agree() -> None:
    """The suite's configs with the reorder in effect (fcfs, prefix caching, a window):
    it runs in many steps, and both engines make every decision alike."""
    knobs = st.tuples(
        configs(), st.sampled_from([1, 2, 3, 8]), st.sampled_from([0.0, 0.25, 0.5, 1.0])
    )
    strategy = knobs.map(
        lambda k: dataclasses.replace(
            k[0],
            policy="fcfs",
            enable_prefix_caching=True,
            cache_aware_admission_window=k[1],
            cache_aware_admission_threshold=k[2],
        )
    )
    settings = SuiteSettings(examples=25, rules_per_example=20, seed=20261206)
    result = run_diff(reference_engine, gpu_engine, "vllm-v1", settings, strategy, EXACT)
    assert result.passed, result.divergence or result.error or result.other_error
    assert result.stats.corners.get("cache-aware-reorder", 0) > 0


def test_the_usage_gate_is_the_specs_float_expression() -> None:
    """most_free_blocks turns `1 - free / num_blocks >= threshold` into a bound on the
    free blocks; it agrees with the expression at every count, thresholds at the edges
    and where the division rounds included."""
    for num_blocks in (1, 3, 7, 10, 24, 100, 256):
        for threshold in (0.0, 0.1, 0.25, 0.3, 0.5, 0.51, 0.7, 0.9, 1.0, 1 / 3, 2 / 3):
            config = make_config(
                num_blocks=num_blocks, max_model_len=4, cache_aware_admission_threshold=threshold
            )
            limit = most_free_blocks(config)
            for free in range(num_blocks + 1):
                reorders = 1.0 - free / num_blocks >= threshold
                assert reorders == (free <= limit), (num_blocks, threshold, free)


# ------------------------------------------------------------------ B instances


def _cache_aware_swarm() -> tuple[SchedulerConfig, WorkloadShape]:
    config, shape = busy_swarm("fcfs")
    config = dataclasses.replace(
        config, cache_aware_admission_window=3, cache_aware_admission_threshold=0.25
    )
    return config, shape


def test_an_instance_reorders_the_same_in_a_batch_as_alone() -> None:
    """Instances share tensors, never state: each of 8 ends exactly as it does alone,
    and the device checks (the reorder's among them) hold at every step."""
    config, shape = _cache_aware_swarm()
    batch = BatchedScheduler(config, batch=8, slots=10, device="cpu")
    alone = [BatchedScheduler(config, batch=1, slots=10, device="cpu") for _ in range(8)]
    workloads = [SwarmWorkload(batch, 1, torch.arange(8), shape)]
    workloads += [SwarmWorkload(e, 1, torch.tensor([i]), shape) for i, e in enumerate(alone)]
    reordered = 0
    checked: list[torch.Tensor] = []

    def check(plan: StepPlan) -> None:
        checked.append(check_step(batch.state, plan, config))

    for _ in range(40):
        ticks = [workloads[0].tick(check)] + [w.tick() for w in workloads[1:]]
        assert not checked.pop().any() and not check_state(batch.state, config).any()
        ranked = ticks[0].plan.ranked_depth
        assert ranked is not None
        reordered += int(((ranked >= 0).sum(dim=1) >= 2).sum())
        for i in range(8):
            assert torch.equal(ticks[0].plan.scheduled[i], ticks[i + 1].plan.scheduled[0])
    for i, engine in enumerate(alone):
        for field in dataclasses.fields(batch.state):
            both = getattr(batch.state, field.name)[i], getattr(engine.state, field.name)[0]
            assert torch.equal(*both), field.name
    assert reordered > 0  # the reorder ranked two or more requests in some instance-steps


def test_an_instance_sitting_out_a_step_does_not_reorder() -> None:
    """Instance 1 of 4 schedules every other tick: in the ticks it sits out, its queue
    keeps its keys (the reorder belongs to a schedule() it takes no part in); in the
    others it reorders like the rest."""
    config, shape = _cache_aware_swarm()
    engine = BatchedScheduler(config, batch=4, slots=10, device="cpu")
    workload = SwarmWorkload(engine, 3, torch.arange(4), shape)
    active = torch.ones(4, dtype=torch.bool)
    schedule = engine.schedule
    engine.schedule = lambda _=None: schedule(active)  # type: ignore[method-assign,assignment]
    moved = {True: 0, False: 0}

    def count(plan: StepPlan) -> None:
        assert plan.wait_key_before is not None
        changed = (engine.state.wait_key[1] != plan.wait_key_before[1]).any()
        moved[bool(active[1])] += int(changed)

    for tick in range(60):
        active[1] = tick % 2 == 0
        workload.tick(count)
    assert moved[False] == 0 and moved[True] > 0
