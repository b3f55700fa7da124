"""Swarm mode: thousands of gpu_impl instances on random device workloads, checked on the device.

After every schedule() and every update, the device checks
(gpu_impl/device_checks.py) run over all instances; the step loop reads
back one flag per tick. On the first tick where any instance breaks one,
that instance is re-run alone and written as a trace (campaign/swarm_trace.py),
which the harness then replays with every invariant of the profile on the
gpu engine (B = 1) and on the reference, and shrinks (minimize.py) on the
engine where it fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from schedspec.adapters.gpu import gpu_engine
from schedspec.adapters.reference import reference_engine
from schedspec.campaign.swarm_trace import SwarmRun, record_instance
from schedspec.engines.protocol import EngineFactory
from schedspec.gpu_impl.device_checks import CHECK_IDS, check_state, check_step
from schedspec.gpu_impl.engine import BatchedScheduler
from schedspec.gpu_impl.step_plan import StepPlan
from schedspec.gpu_impl.swarm_workload import SwarmWorkload
from schedspec.properties.harness import SingleEngine
from schedspec.properties.minimize import failure_signature, minimize_on
from schedspec.spec.invariants import Profile
from schedspec.traces.trace import Trace


@dataclass
class SwarmFinding:
    """An instance that broke a device check, as a trace and as the harness judged it."""

    instance: int
    tick: int
    device_checks: tuple[str, ...]  # the device checks it broke
    trace: Trace  # the instance's ticks up to the failing one
    on_gpu: frozenset[str]  # what the harness finds replaying it on gpu_impl (B = 1)
    on_reference: frozenset[str]  # ... and on the reference (empty: it holds)
    shrunk: Trace | None = None  # 1-minimal, on the engine that fails it


@dataclass
class SwarmResult:
    run: SwarmRun
    instances: int
    ticks: int  # ticks run (up to and including a failing one)
    seconds: float
    checks: dict[str, int] = field(default_factory=dict)  # device check id -> instance-checks
    finding: SwarmFinding | None = None

    @property
    def instance_steps(self) -> int:
        return self.instances * self.ticks


def run_swarm(
    run: SwarmRun,
    instances: int,
    ticks: int,
    device: torch.device | str = "cpu",
    profile: Profile = "safety",
    shrink_seconds: float = 20.0,
) -> SwarmResult:
    """`instances` instances for up to `ticks` ticks; stops at the first tick with a finding,
    which it shrinks for up to `shrink_seconds` (0: not at all)."""
    # Narrow tensors that widen on demand: a step costs the slots in use, not run.slots.
    engine = BatchedScheduler(
        run.config, batch=instances, slots=run.slots, device=device, start_width=1
    )
    workload = SwarmWorkload(engine, run.seed, torch.arange(instances), run.shape)
    result = SwarmResult(run, instances, 0, 0.0, dict.fromkeys(CHECK_IDS, 0))
    started = time.perf_counter()
    found: list[torch.Tensor] = []

    def after_schedule(plan: StepPlan) -> None:
        found.append(check_step(engine.state, plan, run.config))

    for tick in range(ticks):
        found.clear()
        workload.tick(after_schedule)
        broken = found[0] | check_state(engine.state, run.config)
        result.ticks = tick + 1
        if bool(broken.any()):  # the one read-back per tick
            result.seconds = time.perf_counter() - started
            _count(result, tick + 1)
            result.finding = _finding(run, broken, tick, device, profile, shrink_seconds)
            return result
    result.seconds = time.perf_counter() - started
    _count(result, ticks)
    return result


def _count(result: SwarmResult, ticks: int) -> None:
    # After schedule and after update: state checks run twice per tick.
    for check_id in result.checks:
        result.checks[check_id] = result.instances * ticks * 2


def _finding(
    run: SwarmRun,
    broken: torch.Tensor,
    tick: int,
    device: torch.device | str,
    profile: Profile,
    shrink_seconds: float,
) -> SwarmFinding:
    instance = int(torch.nonzero(broken.any(dim=1))[0, 0])
    names = tuple(i for i, hit in zip(CHECK_IDS, broken[instance].tolist(), strict=True) if hit)
    trace = record_instance(run, instance, tick + 1, device)
    trace = Trace(trace.config, trace.events, trace.model, f"swarm: {', '.join(names)}")
    on_gpu = failure_signature(trace, SingleEngine(gpu_engine, profile))
    on_reference = failure_signature(trace, SingleEngine(reference_engine, profile))
    finding = SwarmFinding(instance, tick, names, trace, on_gpu, on_reference)
    failing: EngineFactory | None = gpu_engine if on_gpu else None
    if failing is None and on_reference:
        failing = reference_engine
    if failing is not None and shrink_seconds > 0:
        finding.shrunk = minimize_on(trace, SingleEngine(failing, profile), shrink_seconds)
    return finding
