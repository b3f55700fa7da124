"""The device checks: silent on a good batch, and each one firing on a hand-broken instance."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from schedspec.gpu_impl.batch_state import (
    BIG,
    EMPTY,
    EMPTY_BUCKET,
    NO_HASH,
    PREEMPTED,
    RUNNING,
    TOMBSTONE,
    WAITING,
    BatchState,
)
from schedspec.gpu_impl.device_checks import CHECK_IDS, check_state, check_step
from schedspec.gpu_impl.engine import BatchedScheduler, NewRequests
from schedspec.gpu_impl.step_plan import SCHEDULED_RESUMED, SCHEDULED_RUNNING, StepPlan
from schedspec.spec import SchedulerConfig

CONFIG = SchedulerConfig(
    block_size=2, num_blocks=12, max_num_batched_tokens=16, max_num_seqs=3, max_model_len=12
)
# Cache-aware admission in effect (the reorder's checks keep the keys from before a step).
CACHE_AWARE = dataclasses.replace(
    CONFIG,
    enable_prefix_caching=True,
    cache_aware_admission_window=2,
    cache_aware_admission_threshold=0.0,
)


def _two_busy_instances(config: SchedulerConfig = CONFIG) -> tuple[BatchedScheduler, StepPlan]:
    """Two instances, each running two requests (prompts of 3 and 4 tokens) after one step."""
    engine = BatchedScheduler(config, batch=2, slots=4, device="cpu")
    for slot, length in ((0, 3), (1, 4)):
        both = torch.tensor([0, 1])
        engine.add_requests(
            NewRequests(
                inst=both,
                slot=torch.tensor([slot, slot]),
                prompt=torch.arange(length).expand(2, -1),
                prompt_len=torch.tensor([length, length]),
                max_tokens=torch.tensor([5, 5]),
                eos=torch.tensor([-1, -1]),
                stops=torch.full((2, 1), -1),
                priority=torch.tensor([0, 0]),
            )
        )
    return engine, engine.schedule()


def _break_conservation(state: BatchState, plan: StepPlan) -> None:
    state.ref_cnt[1, state.table[1, 0, 0]] += 1


def _break_exclusive(state: BatchState, plan: StepPlan) -> None:
    # Block of request 0 also in request 1's table, ref count kept honest: shared, uncached.
    block = state.table[1, 0, 0]
    state.table[1, 1, state.num_held[1, 1]] = block
    state.num_held[1, 1] += 1
    state.ref_cnt[1, block] = 2


def _break_cache_index(state: BatchState, plan: StepPlan) -> None:
    # CONFIG caches nothing: an index entry naming a held block is stale by definition.
    state.cache_index[1, 0] = state.table[1, 0, 0]


def _break_seqs(state: BatchState, plan: StepPlan) -> None:
    state.status[1, 2:] = RUNNING  # four running, max_num_seqs is 3


def _break_queues(state: BatchState, plan: StepPlan) -> None:
    state.status[1, 0] = WAITING  # waiting, yet holding its blocks


def _break_no_leak(state: BatchState, plan: StepPlan) -> None:
    state.status[1] = EMPTY  # nobody left, blocks still referenced


def _break_budget(state: BatchState, plan: StepPlan) -> None:
    plan.scheduled[1, 0] = CONFIG.max_num_batched_tokens + 1


def _break_no_overshoot(state: BatchState, plan: StepPlan) -> None:
    state.num_computed[1, 0] = state.num_tokens[1, 0] + 1


def _break_kv_cover(state: BatchState, plan: StepPlan) -> None:
    state.num_held[1, 1] -= 1  # 4 computed tokens, one 2-token block


def _break_preempt_reset(state: BatchState, plan: StepPlan) -> None:
    plan.preempted[1, 0] = True  # reported preempted, still running with its blocks


def _break_max_tokens(state: BatchState, plan: StepPlan) -> None:
    # Scheduled again as a running request whose step in flight (3 computed, 1
    # placeholder) is sure to bring it to 3 + 2 - 1 = 4 tokens: prompt 3 + max_tokens 1.
    plan.kind[1, 0] = SCHEDULED_RUNNING
    plan.computed_before[1, 0], plan.placeholders_before[1, 0] = 3, 1
    state.max_tokens[1, 0] = 1


def _break_stale_hold(state: BatchState, plan: StepPlan) -> None:
    plan.kind[1, 0] = SCHEDULED_RESUMED  # resumed, with a stale token still in flight
    state.num_stale[1, 0] = 1


def _break_pipeline(state: BatchState, plan: StepPlan) -> None:
    state.num_placeholders[1, 0] = 1  # an output placeholder without async scheduling


def _break_cache_aware_keep(state: BatchState, plan: StepPlan) -> None:
    # Both requests were admitted from the first two places: trading their keys would be
    # a reorder, a key neither held before is not.
    state.wait_key[1, 0] = state.wait_key[1, 1] + 1


def _break_cache_aware_order(state: BatchState, plan: StepPlan) -> None:
    # Ranked as if the second had the deeper prefix, yet left behind the first.
    assert plan.ranked_depth is not None
    plan.ranked_depth[1, :2] = torch.tensor([0, 1])


BREAKERS: dict[str, Callable[[BatchState, StepPlan], None]] = {
    "CONSERVATION": _break_conservation,
    "EXCLUSIVE": _break_exclusive,
    "CACHE-INDEX": _break_cache_index,
    "SEQS": _break_seqs,
    "QUEUES": _break_queues,
    "NO-LEAK": _break_no_leak,
    "BUDGET": _break_budget,
    "NO-OVERSHOOT": _break_no_overshoot,
    "KV-COVER": _break_kv_cover,
    "PREEMPT-RESET": _break_preempt_reset,
    "MAX-TOKENS": _break_max_tokens,
    "STALE-HOLD": _break_stale_hold,
    "PIPELINE": _break_pipeline,
    "CACHE-AWARE-KEEP": _break_cache_aware_keep,
    "CACHE-AWARE-ORDER": _break_cache_aware_order,
}
# The config each breaker's instance runs: CONFIG unless the check needs a window.
CONFIG_OF = {"CACHE-AWARE-KEEP": CACHE_AWARE, "CACHE-AWARE-ORDER": CACHE_AWARE}


def test_every_check_has_a_breaker() -> None:
    assert set(BREAKERS) == set(CHECK_IDS)


@pytest.mark.parametrize("config", [CONFIG, CACHE_AWARE], ids=["plain", "cache-aware"])
def test_a_good_batch_passes_every_check(config: SchedulerConfig) -> None:
    engine, plan = _two_busy_instances(config)
    assert (plan.scheduled > 0).sum() == 4
    assert not check_step(engine.state, plan, config).any()
    assert not check_state(engine.state, config).any()


@pytest.mark.parametrize("check_id", CHECK_IDS)
def test_each_check_fires_on_the_broken_instance_only(check_id: str) -> None:
    config = CONFIG_OF.get(check_id, CONFIG)
    engine, plan = _two_busy_instances(config)
    with torch.inference_mode():  # the plan is the engine's output: an inference tensor
        BREAKERS[check_id](engine.state, plan)
    column = check_step(engine.state, plan, config)[:, CHECK_IDS.index(check_id)]
    assert column.tolist() == [False, True]


def _cache_aware_pair() -> tuple[BatchedScheduler, StepPlan]:
    """One instance (of two) with two requests queued behind a running one that holds the
    only seat: the reorder ranks them (same depth: no cached prefix) and admits neither."""
    config = dataclasses.replace(CACHE_AWARE, max_num_seqs=1)
    engine = BatchedScheduler(config, batch=2, slots=4, device="cpu")
    for slot in range(3):
        engine.add_requests(
            NewRequests(
                inst=torch.tensor([1]),
                slot=torch.tensor([slot]),
                prompt=(torch.arange(3) + 10 * slot).unsqueeze(0),
                prompt_len=torch.tensor([3]),
                max_tokens=torch.tensor([5]),
                eos=torch.tensor([-1]),
                stops=torch.full((1, 1), -1),
                priority=torch.tensor([0]),
            )
        )
    engine.schedule()  # slot 0 takes the seat
    return engine, engine.schedule()


def test_the_reorder_checks_hold_a_ranked_pair_to_its_keys() -> None:
    """A trade of keys between the two ranked requests that puts the later one first on
    equal depths breaks CACHE-AWARE-ORDER, not KEEP (a trade is what a reorder makes);
    ranking the later one deeper makes the same trade right. A key no one held before
    breaks KEEP."""
    engine, plan = _cache_aware_pair()
    state, config = engine.state, engine.config
    assert plan.ranked_depth is not None and plan.ranked_depth[1].tolist() == [-1, 0, 0, -1]
    keep, order = CHECK_IDS.index("CACHE-AWARE-KEEP"), CHECK_IDS.index("CACHE-AWARE-ORDER")
    assert not check_step(state, plan, config).any()
    state.wait_key[1, 1:3] = state.wait_key[1, 1:3].flip(0).clone()
    found = check_step(state, plan, config)
    assert found[:, keep].tolist() == [False, False]
    assert found[:, order].tolist() == [False, True]
    with torch.inference_mode():
        plan.ranked_depth[1, 2] = 1
    assert not check_step(state, plan, config).any()
    state.wait_key[1, 2] = 99
    assert check_step(state, plan, config)[:, keep].tolist() == [False, True]


def _free_block(state: BatchState) -> int:
    return int(torch.nonzero(state.ref_cnt[1] == 0)[0])


def _ring_names_another_block(state: BatchState) -> None:
    """The ring entry under a free block's key names the block after it."""
    block = _free_block(state)
    at = int(state.free_key[1, block]) % state.free_ring.shape[1]
    state.free_ring[1, at] = (block + 1) % state.free_key.shape[1]


def _span_past_ring(state: BatchState) -> None:
    """Keys still found through the ring, but a span one key wider than it."""
    state.free_front[1] = state.free_back[1] - state.free_ring.shape[1] - 1


@pytest.mark.parametrize(
    "breaker",
    [
        pytest.param(lambda s: s.free_key[1].__setitem__(int(s.table[1, 0, 0]), 0), id="held-key"),
        pytest.param(lambda s: s.num_free.__setitem__(1, s.num_free[1] - 1), id="free-count"),
        pytest.param(lambda s: s.free_key[1].__setitem__(_free_block(s), BIG), id="free-keyed-big"),
        pytest.param(_ring_names_another_block, id="ring-entry"),
        pytest.param(lambda s: s.free_front.__setitem__(1, s.free_back[1]), id="below-front"),
        pytest.param(lambda s: s.free_back.__setitem__(1, s.free_front[1]), id="past-back"),
        pytest.param(_span_past_ring, id="span-past-ring"),
    ],
)
def test_conservation_covers_the_free_queue_bookkeeping(
    breaker: Callable[[BatchState], None],
) -> None:
    """The step keeps held blocks' keys at BIG (so taking the smallest keys never needs
    the ref counts), a free-block counter (so no step sums the pool) and a ring that
    finds blocks by key (so taking blocks reads the queue's front only): CONSERVATION
    flags a held block with a queue key, a counter off by one, two free blocks sharing
    the key BIG (a free block that lost its place), a ring entry naming another block,
    a key outside [free_front, free_back), and a span the ring cannot hold."""
    engine, _ = _two_busy_instances()
    assert engine.state.num_free.tolist() == [8, 8]  # 12 blocks, 2 + 2 held per instance
    breaker(engine.state)
    column = check_state(engine.state, CONFIG)[:, CHECK_IDS.index("CONSERVATION")]
    assert column.tolist() == [False, True]


def _cached_bucket(state: BatchState) -> tuple[int, int]:
    """A cached block of instance 1 and its bucket in the prefix-cache index."""
    block = int(torch.nonzero(state.block_hash[1] != NO_HASH)[0])
    return block, int(state.cache_bucket[1, block])


def _lose_entry(state: BatchState) -> None:
    _, bucket = _cached_bucket(state)
    state.cache_index[1, bucket] = TOMBSTONE
    state.cache_deleted[1] += 1  # counted, so only the lost entry is wrong


def _keep_stale_entry(state: BatchState) -> None:
    block, _ = _cached_bucket(state)
    state.block_hash[1, block] = NO_HASH  # evicted without prefix_index.forget


def _move_entry_before_its_home(state: BatchState) -> None:
    block, bucket = _cached_bucket(state)
    before = (bucket - 1) % state.cache_index.shape[1]
    state.cache_index[1, bucket] = EMPTY_BUCKET
    state.cache_index[1, before] = block
    state.cache_bucket[1, block] = before  # consistent pointers, unreachable place


def _plant_uncounted_tombstone(state: BatchState) -> None:
    empty = int(torch.nonzero(state.cache_index[1] == EMPTY_BUCKET)[0])
    state.cache_index[1, empty] = TOMBSTONE


@pytest.mark.parametrize(
    "breaker",
    [_lose_entry, _keep_stale_entry, _move_entry_before_its_home, _plant_uncounted_tombstone],
)
def test_cache_index_flags_an_index_out_of_step_with_block_hash(
    breaker: Callable[[BatchState], None],
) -> None:
    """With prefix caching on, the index holds an entry per cached block; CACHE-INDEX
    flags a cached block with no entry, an entry left on a block that lost its id, an
    entry a lookup cannot reach from its home, and tombstones beyond the count that
    decides when a row is rebuilt."""
    config = dataclasses.replace(CONFIG, enable_prefix_caching=True)
    engine, _ = _two_busy_instances(config)
    assert int((engine.state.cache_index >= 0).sum()) == 4  # 2 cached blocks per instance
    column = check_state(engine.state, config)[:, CHECK_IDS.index("CACHE-INDEX")]
    assert column.tolist() == [False, False]
    breaker(engine.state)
    column = check_state(engine.state, config)[:, CHECK_IDS.index("CACHE-INDEX")]
    assert column.tolist() == [False, True]


# One placeholder draft per request: after the first step each request (3 and 4 prompt
# tokens) has its prefill in flight, 1 output placeholder and a placeholder draft.
PIPELINED = dataclasses.replace(CONFIG, async_scheduling=True, num_speculative_tokens=1)


def test_a_pipelined_batch_passes_every_check_with_two_steps_in_flight() -> None:
    engine, _ = _two_busy_instances(PIPELINED)
    state = engine.state
    assert state.num_in_flight[:, :2].tolist() == [[3, 4], [3, 4]]
    assert state.num_placeholders[:, :2].tolist() == [[1, 1], [1, 1]]
    plan = engine.schedule()  # the next step before the first lands: 1 + 1 draft each
    assert plan.scheduled[:, :2].tolist() == [[2, 2], [2, 2]]
    # 5 computed = 3 tokens + 1 placeholder + 1 draft: NO-OVERSHOOT's limit exactly.
    assert state.num_computed[:, 0].tolist() == [5, 5]
    assert not check_step(state, plan, PIPELINED).any()
    assert not check_state(state, PIPELINED).any()
    state.num_computed[1, 0] += 1
    column = check_step(state, plan, PIPELINED)[:, CHECK_IDS.index("NO-OVERSHOOT")]
    assert column.tolist() == [False, True]


def _pipeline_breakers() -> dict[str, Callable[[BatchState], None]]:
    """Each breaks one part of PIPELINE on instance 1's first request (RUNNING: 3 tokens,
    3 computed and in flight, 1 placeholder, 1 placeholder draft)."""

    def put(name: str, value: int) -> Callable[[BatchState], None]:
        return lambda s: getattr(s, name).__setitem__((1, 0), value)

    def nothing_in_flight(state: BatchState) -> None:
        state.num_in_flight[1, 0] = 0  # confirmed 3 = every known token: one past the last
        state.num_placeholders[1, 0] = 0

    return {
        "negative": put("num_in_flight", -1),
        "placeholders-over-in-flight": put("num_placeholders", 4),
        "running-with-stale": put("num_stale", 1),
        "confirmed-past-last-token": nothing_in_flight,
        "chunk-with-placeholders": lambda s: s.is_prefill_chunk.__setitem__((1, 0), True),
        "proposed-draft": lambda s: s.spec.__setitem__((1, 0, 0), 5),
        "waiting-in-flight": put("status", WAITING),
        "preempted-not-stale": put("status", PREEMPTED),
    }


@pytest.mark.parametrize("name", list(_pipeline_breakers()))
def test_pipeline_flags_each_broken_count(name: str) -> None:
    engine, _ = _two_busy_instances(PIPELINED)
    column = check_state(engine.state, PIPELINED)[:, CHECK_IDS.index("PIPELINE")]
    assert column.tolist() == [False, False]
    _pipeline_breakers()[name](engine.state)
    column = check_state(engine.state, PIPELINED)[:, CHECK_IDS.index("PIPELINE")]
    assert column.tolist() == [False, True]


def test_preempt_reset_wants_all_output_in_flight_stale() -> None:
    engine, plan = _two_busy_instances(PIPELINED)
    state = engine.state
    with torch.inference_mode():  # reported preempted (and so not scheduled)
        plan.preempted[1, 0], plan.scheduled[1, 0] = True, 0
    # The reset a preemption makes, but for its in-flight tokens left fresh.
    state.status[1, 0], state.num_computed[1, 0], state.num_held[1, 0] = PREEMPTED, 0, 0
    state.num_spec[1, 0], state.num_placeholders[1, 0] = 0, 0
    column = check_step(state, plan, PIPELINED)[:, CHECK_IDS.index("PREEMPT-RESET")]
    assert column.tolist() == [False, True]
    state.num_stale[1, 0] = state.num_in_flight[1, 0]
    column = check_step(state, plan, PIPELINED)[:, CHECK_IDS.index("PREEMPT-RESET")]
    assert column.tolist() == [False, False]
