"""Campaigns on a local Ray cluster, run as a user runs them (`python -m schedspec ...` in a
fresh process): a report like a local run's, a lost worker losing only its chunk, the
example database served to Ray's workers, and Ctrl-C or SIGTERM stopping the whole
campaign with its report written and no process of it left behind.

Each run's processes are found by a marker in their environment, which every process a
run starts inherits (Ray's head processes, its agents, its workers), whoever its
parent is. Each test starts a local Ray cluster (tens of seconds on 2 busy cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fault_engines import KILL_ONCE_ENV
from tests.ray_required import require_ray

require_ray("the campaigns on a local Ray cluster (tests/test_campaigns_ray.py)")

REPO = Path(__file__).resolve().parent.parent
MARK_VARIABLE = "SCHEDSPEC_TEST_RUN_MARK"
# Generous: a local cluster takes ~25 s to start on 2 shared cores.
RUN_TIMEOUT_SECONDS = 240
# How long the processes of a finished run may take to be gone.
GONE_WITHIN_SECONDS = 15


@dataclass
class Run:
    process: subprocess.Popen[str]
    mark: str

    def processes(self) -> dict[int, str]:
        """Every live process but the command itself with this run's mark: pid -> its
        command line."""
        needle = f"{MARK_VARIABLE}={self.mark}".encode()
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.process.pid:
                continue
            try:
                if needle in (entry / "environ").read_bytes():
                    command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                    found[int(entry.name)] = command.decode(errors="replace").strip()
            except OSError:
                continue  # ended meanwhile, or a zombie
        return found

    def wait_for_workers(self, count: int) -> None:
        """Until `count` Ray workers run chunks (they run until the run stops)."""
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            chunks = [c for c in self.processes().values() if c.startswith("ray::_run_chunk")]
            if len(chunks) >= count:
                return
            assert self.process.poll() is None, self.process.communicate()
            time.sleep(0.5)
        raise AssertionError(f"no {count} Ray workers running chunks: {self.processes()}")

    def finish(self) -> tuple[int, str]:
        """The exit status and the whole output, once every process of the run is gone."""
        output, _ = self.process.communicate(timeout=RUN_TIMEOUT_SECONDS)
        deadline = time.monotonic() + GONE_WITHIN_SECONDS
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = self.processes()
        for pid in left:  # so a failing test leaves nothing behind either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind by the run: {left}"
        return self.process.returncode, output


def schedspec(*args: str, environment: dict[str, str] | None = None) -> AbstractContextManager[Run]:
    """`python -m schedspec ARGS` in a session of its own (as a terminal's job is its own
    process group), every process it starts marked."""
    return python("-m", "schedspec", *args, environment=environment)


@contextmanager
def python(*args: str, environment: dict[str, str] | None = None) -> Iterator[Run]:
    """`python ARGS` as `schedspec` runs the command."""
    mark = uuid.uuid4().hex
    env = {**os.environ, **(environment or {}), MARK_VARIABLE: mark}
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    run = Run(process, mark)
    try:
        yield run
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def report_of(path: Path) -> dict[str, object]:
    report: dict[str, object] = json.loads(path.read_text())
    return report


def test_a_campaign_on_local_ray_reports_like_a_local_run(tmp_path: Path) -> None:
    # wrong_total breaks BUDGET; chunk 0 runs on the run's seed wherever it runs, so the
    # first failure's shrunk trace is the same on Ray as on local processes. --examples
    # caps the campaign (2 chunks of 20), so that it does not depend on timing. No example
    # database: with one, a chunk may start from what another saved first, which depends on
    # timing (the next test covers the database).
    common = ["check", "--engine", "tests.broken_engines:wrong_total", "--seed", "1"]
    common += ["--workers", "2", "--duration", "5m", "--examples", "40"]
    ray_dir, local_dir = tmp_path / "ray", tmp_path / "local"
    with schedspec(
        *common, "--ray", "--trace-dir", str(ray_dir), "--json", str(ray_dir / "report.json"),
    ) as run:  # fmt: skip
        code, output = run.finish()
    assert code == 1, output
    assert "on a local Ray cluster (" in output and "failures kept:" in output
    assert output.rstrip().endswith("FAILED: BUDGET (seed 1)")
    with schedspec(*common, "--trace-dir", str(local_dir)) as run:
        local_code, local_output = run.finish()
    assert local_code == 1, local_output
    name = "schedspec-failure-1.json"
    assert (ray_dir / name).read_text() == (local_dir / name).read_text()
    report = report_of(ray_dir / "report.json")
    assert report["outcome"] == "violation" and report["seed"] == 1
    campaign = report["campaign"]
    assert isinstance(campaign, dict)
    assert campaign["ray"] == "local" and campaign["workers"] == 2
    assert campaign["findings"][0]["trace"] == str(ray_dir / name)


def test_ray_workers_save_their_failures_into_the_campaigns_example_database(
    tmp_path: Path,
) -> None:
    # Ray's workers save the failure into the campaign's database (through the driver): a
    # run on another seed tries it first.
    database = str(tmp_path / "db")
    args = ["check", "--engine", "tests.broken_engines:wrong_total", "--seed", "1", "--ray"]
    args += ["--workers", "2", "--duration", "5m", "--examples", "40"]
    with schedspec(*args, "--trace-dir", str(tmp_path), "--example-db", database) as run:
        code, output = run.finish()
    assert code == 1, output
    assert output.rstrip().endswith("FAILED: BUDGET (seed 1)")
    again = tmp_path / "again.json"
    args = ["--examples", "40", "--seed", "77", "--example-db", database, "--json", str(again)]
    with schedspec("check", "--engine", "tests.broken_engines:wrong_total", *args) as run:
        code, output = run.finish()
    assert code == 1, output
    assert report_of(again)["first_failure_example"] == 1


def test_a_lost_ray_worker_loses_only_its_chunk(tmp_path: Path) -> None:
    # The first schedule() of the run SIGKILLs its Ray worker; the other chunks pass.
    args = ["check", "--engine", "tests.fault_engines:kills_its_process_once", "--ray"]
    args += ["--workers", "2", "--duration", "5m", "--examples", "60", "--seed", "3"]
    args += ["--trace-dir", str(tmp_path)]
    args += ["--json", str(tmp_path / "report.json")]
    with schedspec(*args, environment={KILL_ONCE_ENV: str(tmp_path / "killed")}) as run:
        code, output = run.finish()
    assert code == 4, output  # the engine ended its worker: an engine error
    assert "was lost to Ray" in output
    campaign = report_of(tmp_path / "report.json")["campaign"]
    assert isinstance(campaign, dict)
    assert campaign["lost_chunks"] == 1 and campaign["chunks"] == 2  # of 30 examples
    assert [f["label"] for f in campaign["findings"]] == ["worker lost"]


@pytest.mark.parametrize(
    ("command", "stop", "exit_code"),
    [
        # Ctrl-C at a terminal: SIGINT to the whole process group.
        (["check"], "ctrl-c", 130),
        (["diff", "--right", "gpu"], "sigterm", 143),
    ],
)
def test_a_signal_stops_the_whole_campaign_and_leaves_no_worker(
    tmp_path: Path, command: list[str], stop: str, exit_code: int
) -> None:
    report_path = tmp_path / "report.json"
    args = [*command, "--ray", "--workers", "2", "--duration", "5m", "--seed", "1"]
    with schedspec(*args, "--trace-dir", str(tmp_path), "--json", str(report_path)) as run:
        run.wait_for_workers(2)
        assert any("raylet" in c for c in run.processes().values())
        if stop == "ctrl-c":
            os.killpg(run.process.pid, signal.SIGINT)
        else:
            run.process.send_signal(signal.SIGTERM)
        code, output = run.finish()
    assert code == exit_code, output
    name = "SIGINT" if stop == "ctrl-c" else "SIGTERM"
    assert f"INTERRUPTED by {name} (seed 1)" in output
    report = report_of(report_path)
    assert report["outcome"] == "interrupted"
    campaign = report["campaign"]
    assert isinstance(campaign, dict) and campaign["ray"] == "local"


def test_a_cluster_address_that_does_not_answer_is_a_usage_error(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port just freed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with schedspec("check", "--ray", f"127.0.0.1:{port}", "--trace-dir", str(tmp_path)) as run:
        code, output = run.finish()
    assert code == 2, output
    assert f"Invalid value for '--ray': no Ray cluster answers at 127.0.0.1:{port}" in output


def test_a_killed_driver_leaves_no_process_of_its_cluster(tmp_path: Path) -> None:
    # SIGKILL: nothing in the driver runs. Ray ends its head processes and workers; the
    # reaper (campaign/ray_reaper.py) ends the rest, and removes the cluster's directory.
    args = ["check", "--ray", "--workers", "2", "--duration", "5m", "--seed", "1"]
    with schedspec(*args, "--trace-dir", str(tmp_path)) as run:
        run.wait_for_workers(2)
        (raylet,) = [c for c in run.processes().values() if "raylet" in c.split()[0]]
        (session,) = [a for a in raylet.split() if a.startswith("--session_dir=")]
        temp_dir = Path(session.removeprefix("--session_dir=")).parent
        assert temp_dir.name.startswith("schedspec-ray-") and temp_dir.is_dir()
        run.process.send_signal(signal.SIGKILL)
        code, _ = run.finish()
    assert code == -signal.SIGKILL
    assert not temp_dir.exists()


SWARM = ["check", "--engine", "gpu", "--seed", "3"]


def test_a_swarm_on_local_ray_reports_like_a_local_run(tmp_path: Path) -> None:
    # tests.swarm_planted plants a gpu_impl bug in every process that loads its configs
    # (the driver and each Ray worker); chunk 0 runs on the run's seed wherever it runs,
    # so the unshrunk trace of its finding is the same on Ray as on local processes.
    args = [*SWARM, "--instances", "256", "--examples", "3", "--no-shrink"]
    args += ["--configs", "tests.swarm_planted:tight_configs", "--workers", "2"]
    ray_dir, local_dir = tmp_path / "ray", tmp_path / "local"
    with schedspec(*args, "--ray", "--trace-dir", str(ray_dir)) as run:
        code, output = run.finish()
    assert code == 1, output
    assert "VIOLATION on the device" in output
    assert "on a local Ray cluster (2 CPUs), 2 workers: 1 chunk, " in output
    assert output.rstrip().splitlines()[-1].startswith("FAILED: ")
    with schedspec(*args, "--trace-dir", str(local_dir)) as run:
        local_code, local_output = run.finish()
    assert local_code == 1, local_output
    name = "schedspec-swarm-3.json"
    assert (ray_dir / name).read_text() == (local_dir / name).read_text()


def test_sigterm_stops_a_swarm_campaign_on_ray_and_leaves_no_worker(tmp_path: Path) -> None:
    args = [*SWARM, "--instances", "64", "--ray", "--workers", "2", "--duration", "5m"]
    with schedspec(*args, "--trace-dir", str(tmp_path)) as run:
        run.wait_for_workers(2)
        run.process.send_signal(signal.SIGTERM)
        code, output = run.finish()
    assert code == 143, output
    assert "on a local Ray cluster (2 CPUs), 2 workers: " in output
    assert output.rstrip().endswith("INTERRUPTED by SIGTERM (seed 3)")


# More chunks than a Ray worker process runs: the one worker's process id for each.
RECYCLED = """
import os
from schedspec.campaign.ray_cluster import ray_cluster
with ray_cluster(None, 1):
    from schedspec.campaign.ray_workers import CHUNKS_PER_WORKER_PROCESS, RayWorkers
    chunks = range(CHUNKS_PER_WORKER_PROCESS + 1)
    pids = list(RayWorkers(1).map_chunks(lambda chunk: os.getpid(), chunks))
    print(CHUNKS_PER_WORKER_PROCESS, pids)
"""


def test_a_ray_worker_process_is_replaced_after_its_share_of_chunks() -> None:
    # (Ray is imported in the script only: this process stays free of it.)
    with python("-c", RECYCLED) as run:
        code, output = run.finish()
    assert code == 0, output
    limit, listed = output.strip().splitlines()[-1].split(" ", 1)
    pids = json.loads(listed)
    assert len(pids) == int(limit) + 1
    assert len(set(pids[: int(limit)])) == 1  # one process, chunk after chunk
    assert pids[-1] != pids[0]  # then a fresh one: its memory starts over
