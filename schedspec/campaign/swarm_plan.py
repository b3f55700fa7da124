"""Swarm mode's run of a RunPlan: how many configs, how many ticks each, on which device,
and the configs run in this process or in chunks on the plan's backend.

The plan's examples count configs and its max steps ticks per config, each defaulting
to SWARM_QUICK or, in the long profile, SWARM_LONG. A finding is shrunk for at most
SHRINK_SECONDS unless the plan asks for no shrinking. Chunks run on CPU workers
only: one process drives a device (chunks_off_cpu).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from schedspec.adapters.gpu import DEVICE_ENV
from schedspec.campaign.backend import Backend
from schedspec.campaign.plan import ProgressBar, no_progress, started_campaign
from schedspec.campaign.swarm import SwarmResult
from schedspec.campaign.swarm_chunks import (
    SWARM_CHUNK_CONFIGS,
    SwarmCampaign,
    SwarmSettings,
    SwarmWork,
    run_configs,
    run_swarm_campaign,
)
from schedspec.gpu_impl.engine import default_device
from schedspec.properties.run_plan import BackendChoice, RunPlan, is_long
from schedspec.properties.strategies.configs import configs

SWARM_QUICK = (4, 40)  # configs, ticks per config (check's --instances help states them)
SWARM_LONG = (32, 100)
SHRINK_SECONDS = 20.0


@dataclass(frozen=True)
class SwarmPlan:
    plan: RunPlan  # the configs, the seed, the backend
    swarm: SwarmSettings  # each config's swarm
    configs: int  # how many configs


def swarm_device() -> str:
    """The device the swarms run on: SCHEDSPEC_GPU_DEVICE, else CUDA where there is one."""
    return os.environ.get(DEVICE_ENV) or str(default_device())


def chunks_off_cpu(backend: BackendChoice, device: str) -> bool:
    """True when the backend would run chunks on a device other than the CPU, which
    swarm mode refuses: one process drives a device, and the instances it steps at once
    already spread a swarm over it."""
    return backend.parallel and device != "cpu"


def plan_swarm(plan: RunPlan, instances: int, device: str) -> SwarmPlan:
    """The plan as swarm mode runs it: `instances` instances per config on `device`."""
    default_configs, default_ticks = SWARM_LONG if is_long(plan.request.long) else SWARM_QUICK
    request = plan.request
    shrink_seconds = SHRINK_SECONDS if request.shrink else 0.0
    ticks = request.max_steps or default_ticks
    swarm = SwarmSettings(instances, ticks, device, plan.profile, shrink_seconds)
    return SwarmPlan(plan, swarm, request.examples or default_configs)


def run_swarm_here(
    planned: SwarmPlan, on_config: Callable[[SwarmResult], None] | None = None
) -> list[SwarmResult]:
    """The configs in this process, drawn on the plan's seed: a run of one chunk."""
    plan = planned.plan
    strategy = plan.config_strategy if plan.config_strategy is not None else configs()
    return run_configs(strategy, planned.configs, plan.seed, planned.swarm, on_config)


def run_swarm_parallel(
    planned: SwarmPlan,
    trace_dir: Path,
    *,
    on_backend: Callable[[Backend], None] | None = None,
    on_config: Callable[[SwarmResult], None] | None = None,
    progress: ProgressBar = no_progress,
) -> tuple[SwarmCampaign, str]:
    """The configs in chunks of SWARM_CHUNK_CONFIGS on the plan's backend
    (campaign/plan.started_campaign, as `check` and `diff` start theirs), and where
    they ran, as they ran (CampaignStart.where)."""
    plan = planned.plan
    sizes = (SWARM_CHUNK_CONFIGS, SWARM_CHUNK_CONFIGS)
    with started_campaign(
        plan, planned.configs, sizes=sizes, on_backend=on_backend, progress=progress
    ) as start:
        work = SwarmWork(planned.swarm, plan.configs, start.deadline)
        campaign = run_swarm_campaign(
            work,
            start.chunks,
            start.backend.runner,
            keep_going=start.keep_going,
            trace_dir=trace_dir,
            on_config=on_config,
            on_progress=start.on_progress,
        )
    return campaign, start.where
