"""The running walk when only some instances take part (schedule(active=...)): the first
segment then reads the active instances' rows instead of every instance's."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from schedspec.gpu_impl.engine import BatchedScheduler
from schedspec.gpu_impl.swarm_workload import SwarmWorkload
from tests.gpu_helpers import busy_swarm


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fcfs-cache-aware"])
def test_instances_sitting_out_change_nothing_for_the_others(policy: str) -> None:
    """Instance 2 of 8 never schedules; every other instance steps as in a batch where all
    schedule (its draws depend on its own id only), preemptions included, and the
    cache-aware reorder too (test_gpu_release_knobs.py: an instance sitting out a step
    does not reorder)."""
    config, shape = busy_swarm(policy.removesuffix("-cache-aware"))
    if policy.endswith("-cache-aware"):
        config = dataclasses.replace(
            config, cache_aware_admission_window=3, cache_aware_admission_threshold=0.0
        )
    every = BatchedScheduler(config, batch=8, slots=10, device="cpu")
    some = BatchedScheduler(config, batch=8, slots=10, device="cpu")
    active = torch.arange(8) != 2
    some.schedule = functools.partial(some.schedule, active=active)  # type: ignore[method-assign]
    workloads = [SwarmWorkload(engine, 11, torch.arange(8), shape) for engine in (every, some)]
    preempted = 0
    for _ in range(40):
        ticks = [w.tick() for w in workloads]
        assert int(ticks[1].plan.scheduled[2].sum()) == 0
        preempted += int(ticks[1].plan.preempted[active].sum())
        for name in ("scheduled", "rank", "kind", "num_drafts", "preempted", "new_from"):
            both = [getattr(tick.plan, name)[active] for tick in ticks]
            assert torch.equal(*both), name
    for field in dataclasses.fields(every.state):
        both = [getattr(engine.state, field.name)[active] for engine in (every, some)]
        assert torch.equal(*both), field.name
    assert preempted > 0  # the walk's preempt-and-retry rounds ran on a subset too
