"""Cache-aware admission (vLLM 0.34.0's cache_aware_admission_window and _threshold), worked
examples on the reference: the probe, the usage it is gated on, and the reorder itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from schedspec.adapters.reference import ReferenceEngine
from schedspec.engines.events import AddRequest, Drain, Event, Step
from schedspec.properties.checked_engine import replay
from schedspec.reference import Scheduler
from schedspec.spec import ConfigError, Request, RequestStatus, SchedulerConfig, SchedulerOutput
from schedspec.traces.trace import Trace
from tests.sched_helpers import (
    cache_aware_config,
    emit,
    make_config,
    make_scheduler,
    single_group_kv,
)

# Block size 4 (make_config). SEED's prompt leaves three full blocks cached when it ends.
SEED = list(range(1, 13))
COLD = list(range(100, 112))  # shares nothing with SEED
WARM = [*range(1, 12), 99]  # SEED's first 11 tokens: its first two blocks hit


def cache_aware(**overrides: object) -> Scheduler:
    """A scheduler on cache_aware_config in which SEED has run and ended, its blocks
    cached and free."""
    scheduler = Scheduler(cache_aware_config(**overrides))
    scheduler.add_request(Request("seed", SEED, max_tokens=1))
    emit(scheduler, scheduler.schedule())
    assert not scheduler.requests
    return scheduler


def add(scheduler: Scheduler, *requests: tuple[str, Sequence[int]], max_tokens: int = 4) -> None:
    for request_id, prompt in requests:
        scheduler.add_request(Request(request_id, list(prompt), max_tokens=max_tokens))


def take_the_seat(scheduler: Scheduler) -> None:
    """A request with a prompt of its own runs (its step not answered yet)."""
    add(scheduler, ("busy", range(700, 712)))
    scheduler.schedule()


def queue(scheduler: Scheduler) -> list[str]:
    return [r.request_id for r in scheduler.waiting]


def admitted(scheduler: Scheduler) -> list[str]:
    return [d.request_id for d in scheduler.schedule().scheduled_new_reqs]


# ------------------------------------------------------------------------ the probe


def test_the_probe_counts_the_cached_prefix_and_changes_nothing() -> None:
    scheduler = cache_aware()
    add(scheduler, ("cold", COLD), ("warm", WARM), ("same", SEED))
    kv = single_group_kv(scheduler)
    before = kv.snapshot()
    cold, warm, same = scheduler.waiting
    # SEED's own prompt: three blocks cached, but the last token's block is never a hit.
    assert [kv.get_num_cached_tokens(r) for r in (cold, warm, same)] == [0, 8, 8]
    assert kv.snapshot() == before  # no ref count, free queue or cache entry moved
    assert kv.get_computed_blocks(same)[1] == 8  # the same lookup admission makes


def test_the_probe_is_zero_without_prefix_caching() -> None:
    scheduler = make_scheduler()
    add(scheduler, ("a", SEED))
    emit(scheduler, scheduler.schedule())
    add(scheduler, ("b", SEED))
    request = scheduler.requests["b"]
    assert single_group_kv(scheduler).get_num_cached_tokens(request) == 0


def test_usage_is_held_blocks_over_all_blocks() -> None:
    """vLLM's usage is 1 - free / (blocks - null block): num_blocks here. Free cached
    blocks count as free."""
    scheduler = cache_aware(num_blocks=8, max_model_len=32)
    assert single_group_kv(scheduler).usage == 0.0  # SEED's blocks: cached, but free
    add(scheduler, ("a", COLD))
    scheduler.schedule()  # 12 tokens: 3 blocks held
    assert single_group_kv(scheduler).usage == 1.0 - 5 / 8


# ---------------------------------------------------------------------- the reorder


def test_a_warm_request_goes_ahead_of_a_cold_one() -> None:
    scheduler = cache_aware(max_num_seqs=4)
    add(scheduler, ("cold", COLD), ("warm", WARM))
    assert admitted(scheduler) == ["warm", "cold"]


def test_window_zero_admits_in_arrival_order() -> None:
    scheduler = cache_aware(max_num_seqs=4, cache_aware_admission_window=0)
    add(scheduler, ("cold", COLD), ("warm", WARM))
    assert admitted(scheduler) == ["cold", "warm"]


def test_the_reorder_protects_the_resident_prefix() -> None:
    """The point of it (vLLM's test of the same name): with room for one prompt only,
    the cold request admitted first would evict the warm one's cached prefix."""
    for window, first in ((4, "warm"), (0, "cold")):
        scheduler = cache_aware(num_blocks=4, max_model_len=16, cache_aware_admission_window=window)
        add(scheduler, ("cold", COLD), ("warm", WARM))
        output = scheduler.schedule()
        assert [d.request_id for d in output.scheduled_new_reqs] == [first]
        warm = scheduler.requests["warm"]
        hit = single_group_kv(scheduler).get_num_cached_tokens(warm)
        if first == "warm":
            assert output.num_scheduled_tokens["warm"] == 4  # 8 of 12 tokens hit
        else:
            assert hit < 8  # the cold prompt's blocks evicted part of it


def test_ties_keep_queue_order_and_the_queue_stays_reordered() -> None:
    """Deepest first, queue position breaking ties; with the only seat taken nothing is
    admitted, and the reordered queue is what the next step starts from."""
    scheduler = cache_aware()
    take_the_seat(scheduler)
    add(scheduler, ("c1", [*range(200, 211), 1]), ("w1", WARM), ("c2", COLD), ("w2", SEED))
    assert admitted(scheduler) == []
    assert queue(scheduler) == ["w1", "w2", "c1", "c2"]


def test_a_preempted_request_keeps_its_exact_place() -> None:
    """vLLM's example: a request that is not plain waiting (preempted; or, in vLLM, one
    with computed tokens) keeps its index; the others trade places around it, and past
    the window nothing moves."""
    scheduler = cache_aware()
    take_the_seat(scheduler)
    add(
        scheduler,
        ("cold", COLD),
        ("blocked", range(800, 812)),
        ("started", range(900, 912)),
        ("warm", WARM),
        ("tail", WARM),
    )
    requests = scheduler.requests
    requests["blocked"].status = RequestStatus.PREEMPTED
    requests["started"].num_computed_tokens = 4
    scheduler._reorder_waiting_by_cached_prefix()
    assert queue(scheduler) == ["warm", "blocked", "started", "cold", "tail"]


def test_nothing_moves_past_the_window() -> None:
    scheduler = cache_aware(max_num_seqs=4, cache_aware_admission_window=1)
    add(scheduler, ("cold", COLD), ("warm", WARM))
    assert admitted(scheduler) == ["cold", "warm"]


@pytest.mark.parametrize(("threshold", "first"), [(0.5, "warm"), (0.51, "cold")])
def test_the_threshold_is_read_after_the_running_requests_took_their_blocks(
    threshold: float, first: str
) -> None:
    """Eight blocks; busy holds three before the step (usage 3/8, below either
    threshold) and takes a fourth for its next token before admission (usage 1/2):
    the reorder runs at 0.5 and not above. One seat is left."""
    scheduler = cache_aware(
        num_blocks=8,
        max_model_len=32,
        max_num_seqs=2,
        cache_aware_admission_threshold=threshold,
    )
    add(scheduler, ("busy", range(700, 712)))
    emit(scheduler, scheduler.schedule())  # 12 tokens in 3 blocks, then one sampled
    add(scheduler, ("cold", range(300, 308)), ("warm", [*SEED[:8], 98]))
    assert single_group_kv(scheduler).usage == 3 / 8
    output = scheduler.schedule()
    assert len(single_group_kv(scheduler).req_to_blocks["busy"]) == 4
    assert [d.request_id for d in output.scheduled_new_reqs] == [first]


@pytest.mark.parametrize(
    "overrides", [{"policy": "priority"}, {"enable_prefix_caching": False}], ids=str
)
def test_ignored_without_fcfs_or_prefix_caching(overrides: dict[str, object]) -> None:
    """As vLLM does: the window is accepted and ignored."""
    scheduler = cache_aware(max_num_seqs=4, **overrides)
    add(scheduler, ("cold", COLD), ("warm", WARM))
    assert admitted(scheduler) == ["cold", "warm"]


def test_no_reorder_in_a_step_that_preempted() -> None:
    """The reorder belongs to the waiting phase, which a step that preempted skips."""
    scheduler = cache_aware(num_blocks=6, max_model_len=24, max_num_seqs=4)
    add(scheduler, ("a", range(400, 408)), ("b", range(500, 508)), max_tokens=100)
    for _ in range(5):
        emit(scheduler, scheduler.schedule())
    add(scheduler, ("cold", range(600, 604)), ("warm", [*range(400, 404), 97]))
    kv = single_group_kv(scheduler)
    assert [kv.get_num_cached_tokens(r) for r in scheduler.waiting] == [0, 4]
    output = scheduler.schedule()
    assert output.preempted_req_ids == {"b"}
    assert queue(scheduler) == ["b", "cold", "warm"]


# --------------------------------------------------------------------- the config


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("cache_aware_admission_window", -1, "must be >= 0"),
        ("cache_aware_admission_window", 1.5, "must be an int"),
        ("cache_aware_admission_window", True, "must be an int"),
        ("cache_aware_admission_threshold", -0.1, "must be in [0, 1]"),
        ("cache_aware_admission_threshold", 1.5, "must be in [0, 1]"),
        ("cache_aware_admission_threshold", float("nan"), "must be in [0, 1]"),
        ("cache_aware_admission_threshold", "0.5", "must be a float"),
        ("cache_aware_admission_threshold", False, "must be a float"),
    ],
)
def test_bad_values_are_refused_naming_field_and_bound(
    field: str, value: object, bound: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        make_config(**{field: value})
    assert refused.value.field == field
    assert bound in str(refused.value)


def test_the_edges_are_accepted() -> None:
    for threshold in (0, 0.0, 1, 1.0):
        make_config(cache_aware_admission_threshold=threshold, cache_aware_admission_window=9)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cache_aware_admission_window", 2),
        ("cache_aware_admission_threshold", 0.0),
        ("long_prefill_needs_chunked_prefill", False),
    ],
)
def test_sglang_keeps_the_vllm_release_knobs_at_their_defaults(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as refused:
        make_config(family="sglang", max_model_len=16, **{field: value})
    assert refused.value.field == field


# ------------------------------------------- starvation (docs/FINDINGS.md F4)

STARVES = (
    Path(__file__).resolve().parent.parent
    / "docs"
    / "findings"
    / "vllm-cache-aware-admission-starves-a-request.json"
)


class AdmissionLog(ReferenceEngine):
    """The reference, noting the step (from 1) in which each request was admitted."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.num_steps = 0
        self.admitted_at: dict[str, int] = {}

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        self.num_steps += 1
        for new in output.scheduled_new_reqs:
            self.admitted_at.setdefault(new.request_id, self.num_steps)
        return output


def admission_steps(trace: Trace) -> dict[str, int]:
    """Replay under every vllm-v1 invariant, the drain (DRAIN, NO-LEAK) included."""
    built: list[AdmissionLog] = []

    def factory(config: SchedulerConfig) -> AdmissionLog:
        built.append(AdmissionLog(config))
        return built[-1]

    checked = replay(trace, factory, "vllm-v1")
    assert not checked.state.requests
    return built[-1].admitted_at


def test_f4_cold_waits_while_warm_requests_keep_arriving() -> None:
    """docs/FINDINGS.md F4. The hog holds half the blocks and shares its prompt's first
    four blocks with every warm request; one seat is left. cold arrives first, then a warm
    request before each step: each one moves ahead of cold (window 2, usage 0.5 at
    vLLM's default threshold) and takes the seat. cold runs only once arrivals stop."""
    trace = Trace.load(STARVES)
    warm = [e.request_id for e in trace.events if isinstance(e, AddRequest)][2:]
    assert len(warm) == 8
    admitted = admission_steps(trace)
    assert [admitted[w] for w in warm] == list(range(2, 10))
    assert admitted["cold"] == 10  # the drain's first step
    off = dataclasses.replace(trace.config, cache_aware_admission_window=0)  # 0.33.0
    assert admission_steps(dataclasses.replace(trace, config=off))["cold"] == 2


@pytest.mark.parametrize("arrivals", [1, 5, 30])
def test_f4_no_bound_in_steps_while_arrivals_last(arrivals: int) -> None:
    """However many warm requests arrive, one a step, cold waits for all of them: no
    step bound holds without a bound on arrivals. It is passed only by requests that
    arrived after it, each once; with no more arrivals it runs as soon as it fits."""
    trace = Trace.load(STARVES)
    # A longer context: the hog's 56 tokens hold 14 of 24 blocks (more than half) and it
    # decodes through every arrival.
    config = dataclasses.replace(
        trace.config, max_model_len=96, num_blocks=24, max_num_batched_tokens=96
    )
    found = trace.events[0]
    assert isinstance(found, AddRequest)
    system = found.prompt_token_ids[:16]
    hog = AddRequest("hog", (*system, *range(100, 140)), max_tokens=arrivals + 2)
    events: list[Event] = [hog, Step(), trace.events[2]]
    for i in range(arrivals):
        events += [AddRequest(f"w{i}", (*system, 500 + i, 501 + i, 502 + i), 1), Step()]
    admitted = admission_steps(Trace(config, (*events, Drain())))
    assert [admitted[f"w{i}"] for i in range(arrivals)] == list(range(2, arrivals + 2))
    assert admitted["cold"] > arrivals + 1  # after them all (once its blocks fit)
