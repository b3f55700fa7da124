"""Swarm mode: many instances checked on the device, and a planted bug found, replayed, shrunk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import schedspec.gpu_impl.step_plan as step_plan
from schedspec.adapters.gpu import gpu_engine
from schedspec.adapters.reference import reference_engine
from schedspec.campaign.swarm import run_swarm
from schedspec.campaign.swarm_trace import SwarmRun, drive, record_instance
from schedspec.cli.main import main
from schedspec.engines.recording import RecordingEngine
from schedspec.gpu_impl.engine import BatchedScheduler, NewRequests
from schedspec.gpu_impl.swarm_queue import SwarmQueue
from schedspec.gpu_impl.swarm_workload import SwarmWorkload, _below
from schedspec.properties.checked_engine import replay
from schedspec.properties.harness import SingleEngine
from schedspec.properties.minimize import failure_signature
from schedspec.spec import SchedulerConfig

# Small and tight: 24 blocks of 4 tokens for up to 12 requests of up to 64 tokens.
TIGHT = SchedulerConfig(
    block_size=4,
    num_blocks=24,
    max_num_batched_tokens=64,
    max_num_seqs=8,
    max_model_len=64,
    long_prefill_token_threshold=16,
    enable_prefix_caching=True,
    watermark=0.1,
    num_speculative_tokens=2,
    policy="priority",
)
RUN = SwarmRun(TIGHT, seed=1)


def _keep_blocks_on_preemption(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: preemption forgets to free the victim's table."""
    monkeypatch.setattr(step_plan, "release_tables", lambda *args: None)


def test_a_correct_swarm_passes_every_device_check() -> None:
    result = run_swarm(RUN, instances=64, ticks=25)
    assert result.finding is None
    assert result.ticks == 25 and result.instance_steps == 64 * 25
    assert set(result.checks.values()) == {64 * 25 * 2}


def test_a_recorded_instance_replays_on_the_reference_with_the_swarm_schedule() -> None:
    engine = BatchedScheduler(TIGHT, batch=8, slots=RUN.slots, device="cpu")
    workload = SwarmWorkload(engine, RUN.seed, torch.arange(8), RUN.shape)
    swarm_totals = [int(workload.tick().plan.scheduled[3].sum()) for _ in range(30)]
    recorder = RecordingEngine(reference_engine(TIGHT))
    steps = sum(drive(recorder, record_instance(RUN, 3, 30)))
    assert steps == 30
    assert [o.total_num_scheduled_tokens for o in recorder.outputs] == swarm_totals
    assert sum(swarm_totals) > 0


def test_a_planted_bug_is_found_replayed_and_shrunk(monkeypatch: pytest.MonkeyPatch) -> None:
    _keep_blocks_on_preemption(monkeypatch)
    result = run_swarm(RUN, instances=256, ticks=40, shrink_seconds=10)
    finding = result.finding
    assert finding is not None
    assert "PREEMPT-RESET" in finding.device_checks
    assert result.ticks == finding.tick + 1  # it stopped at the first failing tick
    # The harness confirms it on the gpu engine; the reference holds on the same trace.
    assert "PREEMPT-RESET" in finding.on_gpu
    assert finding.on_reference == frozenset()
    assert finding.shrunk is not None
    assert len(finding.shrunk.events) <= len(finding.trace.events)
    assert failure_signature(finding.shrunk, SingleEngine(gpu_engine, "safety"))


def _swarm_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["check", "--engine", "gpu", "--seed", "3", *args])
    return result.exit_code, result.output


def test_the_command_passes_on_the_correct_engine() -> None:
    code, output = _swarm_cli("--instances", "32", "--examples", "1", "--max-steps", "10")
    assert code == 0, output
    assert "32 instances of gpu_impl" in output
    assert "PASSED: every device check held (1 config, seed 3)" in output


def test_the_command_writes_a_shrunk_trace_for_a_finding(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _keep_blocks_on_preemption(monkeypatch)
    code, output = _swarm_cli(
        "--instances",
        "256",
        "--examples",
        "3",
        "--max-steps",
        "40",
        "--configs",
        "tests.test_gpu_swarm:tight_configs",
        "--trace-dir",
        str(tmp_path),
    )
    assert code == 1, output
    assert "VIOLATION on the device" in output
    assert "replayed on reference" in output and "holds every invariant" in output
    assert (tmp_path / "schedspec-swarm-3.json").exists()


def tight_configs() -> object:
    from hypothesis import strategies as st

    return st.just(TIGHT)


def test_swarm_mode_needs_the_gpu_engine() -> None:
    result = CliRunner().invoke(main, ["check", "--instances", "4"])
    assert result.exit_code == 2
    assert "needs --engine gpu" in result.output


@pytest.mark.parametrize("n", [1, 3, 5, 7, 24])
def test_a_draw_brought_below_n_takes_each_value_about_equally_often(n: int) -> None:
    """_below is a multiply-high, not a remainder: over every 15-bit draw each value
    below n comes up 2**15 / n times, give or take one."""
    draws = torch.arange(2**15)
    values = _below(draws, n, 15)
    assert int(values.min()) == 0 and int(values.max()) == n - 1
    counts = torch.bincount(values, minlength=n)
    assert int(counts.max()) - int(counts.min()) <= 1
    # A tensor of bounds works element by element, as for the accepted drafts.
    bounds = torch.full((2**15,), n)
    assert torch.equal(_below(draws, bounds, 15), values)


def test_below_worked_example() -> None:
    """n = 3 over the 32,768 15-bit draws: draw d gives (d * 3) >> 15, so 0 for d up to
    10,922, 1 up to 21,845 and 2 from 21,846 on."""
    counts = torch.bincount(_below(torch.arange(2**15), 3, 15))
    assert counts.tolist() == [10_923, 10_923, 10_922]
    assert _below(torch.tensor([10_922, 10_923, 21_845, 21_846]), 3, 15).tolist() == [0, 1, 1, 2]


def test_swarm_defaults_are_4_configs_of_40_ticks_and_the_profile_the_engine_claims() -> None:
    code, output = _swarm_cli("--instances", "2")
    assert code == 0, output
    assert "swarm: 2 instances of gpu_impl on cpu, profile vllm-v1, 4 configs of 40 ticks" in output
    assert "PASSED: every device check held (4 configs, seed 3)" in output


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--junit", "r.xml"], "swarm mode writes no CI reports"),
        (["--json", "r.json"], "swarm mode writes no CI reports"),
        (["--step-timeout", "3"], "swarm mode's device checks are no engine calls to time"),
        (["--example-db", "db"], "swarm mode draws configs only, and keeps its findings as traces"),
    ],
)
def test_flags_swarm_mode_does_not_use_are_refused(flags: list[str], why: str) -> None:
    code, output = _swarm_cli("--instances", "4", *flags)
    assert code == 2, output
    assert f"{flags[0]}: not used in swarm mode (--instances 4): {why}" in output


# The same tight config with async scheduling and spec-decode padding: each instance's
# steps land one tick late, through the device's batch queue (swarm_queue.py).
PIPELINED = SwarmRun(
    dataclasses.replace(TIGHT, async_scheduling=True, pad_spec_decode=True, policy="fcfs"),
    seed=2,
)


def test_an_async_padded_swarm_passes_every_device_check() -> None:
    result = run_swarm(PIPELINED, instances=64, ticks=30)
    assert result.finding is None
    assert result.instance_steps == 64 * 30


def test_a_recorded_async_instance_replays_through_the_harness_with_the_swarm_schedule() -> None:
    """Instance 0 among 8, and alone through the harness's batch queue (every invariant
    checked on the reference): the same steps scheduled, in the same ticks."""
    engine = BatchedScheduler(PIPELINED.config, batch=8, slots=PIPELINED.slots, device="cpu")
    workload = SwarmWorkload(engine, PIPELINED.seed, torch.arange(8), PIPELINED.shape)
    ticks = [workload.tick() for _ in range(30)]
    schedules = [t.schedules for t in ticks if t.schedules is not None]
    stale = [t.result.stale for t in ticks if t.result.stale is not None]
    assert len(schedules) == len(stale) == 30  # async: both are reported every tick
    # An instance with nothing to schedule does not call schedule(): no output that tick.
    swarm_totals = [
        int(t.plan.scheduled[0].sum()) for t, s in zip(ticks, schedules, strict=True) if s[0]
    ]
    assert len(swarm_totals) < 30
    # It was preempted with output in flight, which landed stale.
    assert any(bool(s[0].any()) for s in stale)
    recorder = RecordingEngine(reference_engine(PIPELINED.config))
    replay(record_instance(PIPELINED, 0, 30), lambda _: recorder, "vllm-v1")
    assert [o.total_num_scheduled_tokens for o in recorder.outputs] == swarm_totals
    # Steps carried placeholder drafts (the runner's own guesses).
    assert any(-1 in d for o in recorder.outputs for d in o.scheduled_spec_decode_tokens.values())


def test_an_async_trace_is_not_driven_unchecked() -> None:
    with pytest.raises(ValueError, match="async_scheduling trace replays through the harness"):
        next(drive(reference_engine(PIPELINED.config), record_instance(PIPELINED, 3, 2)))


def test_a_planted_async_bug_is_found_and_confirmed_by_the_harness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planted bug: output landing for a preempted request is taken as fresh (its
    drafts' rollback then pulls the reset computed count below zero)."""
    original = BatchedScheduler._land_stale

    def nothing_stale(self: BatchedScheduler, scheduled: torch.Tensor) -> torch.Tensor | None:
        stale = original(self, scheduled)
        return None if stale is None else torch.zeros_like(stale)

    monkeypatch.setattr(BatchedScheduler, "_land_stale", nothing_stale)
    result = run_swarm(PIPELINED, instances=64, ticks=30, shrink_seconds=0)
    finding = result.finding
    assert finding is not None
    assert "PIPELINE" in finding.device_checks
    assert "ROLLBACK" in finding.on_gpu and finding.on_reference == frozenset()


def test_the_device_batch_queue_lands_each_step_one_tick_late() -> None:
    """Instance 0 runs a request, instance 1 has none. Instance 0 lands nothing in the
    tick that schedules its first step, then the oldest step each tick (one a tick, as
    the engine core does); once its request is aborted it schedules once more (to
    report the abort), runs nothing, lands what it held, and lands that empty step in
    the next tick without scheduling. Instance 1 never schedules."""
    config = dataclasses.replace(TIGHT, async_scheduling=True)
    engine = BatchedScheduler(config, batch=2, slots=2, device="cpu")
    engine.add_requests(
        NewRequests(
            inst=torch.tensor([0]),
            slot=torch.tensor([0]),
            prompt=torch.arange(5).view(1, 5),
            prompt_len=torch.tensor([5]),
            max_tokens=torch.tensor([8]),
            eos=torch.tensor([-1]),
            stops=torch.full((1, 1), -1),
            priority=torch.tensor([0]),
        )
    )
    queue = SwarmQueue(engine.state, pipelined=True)

    def tick() -> tuple[list[bool], list[int], list[int]]:
        schedules = queue.schedules(engine.state)
        assert schedules is not None
        plan = engine.schedule(schedules)
        landed, lands = queue.land(engine.state, plan, schedules)
        assert lands is not None
        return schedules.tolist(), lands.tolist(), landed.scheduled[:, 0].tolist()

    assert tick() == ([True, False], [False, False], [5, 0])  # the prefill goes in flight
    assert tick() == ([True, False], [True, False], [5, 0])  # the prefill lands
    engine.finish_requests(torch.tensor([[True, False]]), torch.zeros((1, 2)), torch.tensor([0]))
    queue.finished(torch.tensor([True, False]))
    # Scheduled to report the abort: the queue is full, so the held step (the second
    # tick's decode, 1 + 2 placeholder drafts) lands; the empty step stays in flight.
    assert tick() == ([True, False], [True, False], [3, 0])
    assert tick() == ([False, False], [True, False], [0, 0])
    assert tick() == ([False, False], [False, False], [0, 0])
