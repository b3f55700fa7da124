"""Swarm mode in chunks (campaign/swarm_chunks.py): configs x seeds split over workers
through the suite's ChunkRunner, merged in chunk order; a finding reported as a run in one
process reports it, a campaign keeping every distinct one, a lost worker losing its chunk;
and the command's flags for it (local processes here; Ray in test_campaigns_ray.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedspec.adapters.gpu import DEVICE_ENV
from schedspec.campaign.parallel import WorkerLostError, timed_chunks
from schedspec.campaign.swarm_chunks import (
    SWARM_CHUNK_CONFIGS,
    SwarmSettings,
    SwarmWork,
    run_configs,
    run_swarm_campaign,
)
from schedspec.campaign.workers import ForkedWorkers
from schedspec.properties.strategies.configs import configs
from schedspec.properties.suite import Chunk, plan_chunks
from tests.proc_helpers import children
from tests.test_campaigns import InProcess
from tests.test_gpu_swarm import TIGHT, _keep_blocks_on_preemption, _swarm_cli

SMALL = SwarmSettings(instances=8, ticks=5, device="cpu", profile="vllm-v1", shrink_seconds=0)
# The planted bug (preemption keeps the victim's blocks) is met within 40 ticks of 256
# instances on the tight config (test_gpu_swarm.py).
FINDS = SwarmSettings(instances=256, ticks=40, device="cpu", profile="safety", shrink_seconds=0)
TIGHT_CONFIGS = "tests.test_gpu_swarm:tight_configs"


def test_chunk_k_draws_its_configs_on_its_own_seed_and_runs_config_j_on_seed_plus_j() -> None:
    # 5 configs on seed 10 over 2 workers: chunks of 3 and 2 on seeds 10 and 11. Chunk 0
    # is the plain run of seed 10 (its swarms on seeds 10, 11, 12); chunk 1 draws anew on
    # seed 11 (swarms on 11, 12).
    chunks = plan_chunks(5, 10, parts=2, max_examples=SWARM_CHUNK_CONFIGS)
    assert chunks == [Chunk(0, 10, 3), Chunk(1, 11, 2)]
    campaign = run_swarm_campaign(SwarmWork(SMALL), chunks, InProcess())
    assert [r.run.seed for r in campaign.results] == [10, 11, 12, 11, 12]
    plain = run_configs(configs(), 3, 10, SMALL)  # swarm mode's default: the suite's configs
    assert [r.run for r in campaign.results[:3]] == [r.run for r in plain]
    assert campaign.first is None and campaign.error is None and campaign.findings == []
    assert campaign.chunks == 2 and campaign.instance_steps == 5 * 8 * 5


def test_a_chunk_starts_no_config_past_its_deadline() -> None:
    work = SwarmWork(SMALL, deadline=time.time() - 1)
    outcome = work(Chunk(0, 1, 3))
    assert outcome.results == () and outcome.examples == 0 and outcome.steps == 0


def test_a_count_run_stops_at_the_first_finding_in_chunk_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _keep_blocks_on_preemption(monkeypatch)
    work = SwarmWork(FINDS, configs=TIGHT_CONFIGS)
    chunks = [Chunk(i, 7 + i, 2) for i in range(3)]
    campaign = run_swarm_campaign(work, chunks, InProcess())
    assert campaign.chunks == 1  # the first chunk found it: no other was merged
    assert campaign.first is not None and campaign.first.finding is not None
    assert campaign.first.run.seed == 7  # its first config, on the run's seed
    assert "PREEMPT-RESET" in campaign.findings[0].label
    assert campaign.findings[0].trace_path is None  # the first is the caller's to write


def test_a_campaign_keeps_each_distinct_finding_and_writes_the_later_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _keep_blocks_on_preemption(monkeypatch)
    work = SwarmWork(FINDS, configs=TIGHT_CONFIGS)
    # Chunks 0 and 2 on the same seed find the same trace: kept once.
    chunks = [Chunk(0, 7, 1), Chunk(1, 8, 1), Chunk(2, 7, 1)]
    campaign = run_swarm_campaign(work, chunks, InProcess(), keep_going=True, trace_dir=tmp_path)
    assert campaign.chunks == 3 and len(campaign.results) == 3
    assert [f.seed for f in campaign.findings] == [7, 8]
    later = campaign.findings[1]
    assert later.trace_path == tmp_path / "schedspec-swarm-8.json" and later.trace_path.exists()
    assert later.events is not None and later.events > 0


def test_a_lost_worker_loses_only_its_chunk() -> None:
    chunks = [Chunk(0, 1, 1), Chunk(1, 2, 1), Chunk(2, 3, 1)]
    campaign = run_swarm_campaign(SwarmWork(SMALL), chunks, InProcess(lose={1}), keep_going=True)
    assert campaign.chunks == 3 and campaign.lost == 1
    assert [r.run.seed for r in campaign.results] == [1, 3]
    assert isinstance(campaign.error, WorkerLostError)
    assert [f.label for f in campaign.findings] == ["worker lost"]
    # A count run stops there.
    counted = run_swarm_campaign(SwarmWork(SMALL), chunks, InProcess(lose={0}))
    assert counted.chunks == 1 and counted.results == []


def test_progress_counts_configs_and_instance_steps_over_the_chunks() -> None:
    seen: list[tuple[int, int]] = []
    chunks = timed_chunks(4, time.time() + 600, examples=3, parts=2, size=SWARM_CHUNK_CONFIGS)
    run_swarm_campaign(
        SwarmWork(SMALL),
        chunks,
        ForkedWorkers(2),
        on_progress=lambda tally: seen.append((tally.examples, tally.steps)),
    )
    assert seen[-1] == (3, 3 * 8 * 5)


def test_the_command_on_two_workers_writes_the_trace_a_run_in_one_process_writes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _keep_blocks_on_preemption(monkeypatch)  # forked workers inherit it
    args = ["--instances", "256", "--examples", "3", "--configs", TIGHT_CONFIGS, "--no-shrink"]
    code, output = _swarm_cli(*args, "--workers", "2", "--trace-dir", str(tmp_path / "two"))
    assert code == 1, output
    assert "VIOLATION on the device" in output
    assert "on 2 local processes: 1 chunk, " in output  # the first chunk found it
    assert output.rstrip().splitlines()[-1].startswith("FAILED: ")
    assert output.rstrip().endswith("(seed 3)")
    one_code, one_output = _swarm_cli(*args, "--trace-dir", str(tmp_path / "one"))
    assert one_code == 1, one_output
    name = "schedspec-swarm-3.json"
    assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()


def test_a_campaign_runs_for_its_duration_and_passes() -> None:
    code, output = _swarm_cli(
        "--instances", "8", "--max-steps", "5", "--workers", "2", "--duration", "3s"
    )
    assert code == 0, output
    assert "swarm: 8 instances of gpu_impl on cpu, profile vllm-v1, configs for 3s of 5" in output
    assert "on 2 local processes: " in output
    assert "PASSED: every device check held (" in output


def test_a_campaign_capped_by_examples_runs_exactly_those() -> None:
    args = ["--instances", "8", "--max-steps", "5", "--workers", "2", "--duration", "5m"]
    code, output = _swarm_cli(*args, "--examples", "6")
    assert code == 0, output
    assert "configs for 5m (at most 6)" in output
    assert "on 2 local processes: 2 chunks, 6 configs, 240 instance-steps" in output
    assert "PASSED: every device check held (6 configs, seed 3)" in output


def test_workers_on_a_device_other_than_the_cpu_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    code, output = _swarm_cli("--instances", "4", "--workers", "2")
    assert code == 2, output
    assert "swarm mode runs chunks on CPU workers only" in output
    assert "this run's device is cuda" in output


def test_a_strategy_drawn_in_a_worker_is_the_named_one() -> None:
    # Loaded by name in the worker; st.just has one config, so Hypothesis draws it once
    # however many the chunk asks for.
    outcome = SwarmWork(SMALL, configs=TIGHT_CONFIGS)(Chunk(0, 5, 2))
    assert [r.run.config for r in outcome.results] == [TIGHT]


def test_ctrl_c_stops_a_swarm_campaign_on_local_processes_and_leaves_no_worker() -> None:
    repo = Path(__file__).resolve().parent.parent
    args = ["check", "--engine", "gpu", "--instances", "64", "--seed", "1"]
    args += ["--workers", "2", "--duration", "5m"]
    process = subprocess.Popen(
        [sys.executable, "-m", "schedspec", *args],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job
    )
    try:
        deadline = time.monotonic() + 120
        while len(children(process.pid, zombies=False)) < 2:
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.2)
        workers = children(process.pid, zombies=False)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: to the whole group
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, output
    assert "on 2 local processes: " in output
    assert output.rstrip().endswith("INTERRUPTED by SIGINT (seed 1)")
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
