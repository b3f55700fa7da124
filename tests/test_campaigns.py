"""Campaigns on local processes: time budgets, every distinct failure kept, a lost worker
losing only its chunk, progress over every worker, the named corners, Hypothesis'
example database shared by a run's workers, and the flags that ask for them."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest
from click.testing import CliRunner

from schedspec.adapters.reference import ReferenceEngine, reference_engine
from schedspec.campaign import ray_reaper
from schedspec.campaign.chunk_work import BuiltTarget, ChunkProgress
from schedspec.campaign.example_db import LocalDirectory
from schedspec.campaign.parallel import (
    CAMPAIGN_CHUNK_EXAMPLES,
    CampaignTally,
    WorkerLostError,
    run_campaign,
    timed_chunks,
)
from schedspec.campaign.ray_cluster import RayClusterError, check_reachable
from schedspec.campaign.workers import ForkedWorkers, OnProgress, WorkerCrashed, WorkerLost
from schedspec.cli.main import main
from schedspec.cli.options import format_duration, parse_duration
from schedspec.cli.printing.progress import campaign_progress
from schedspec.engines.events import AddRequest, Step
from schedspec.engines.signals import interrupt_signals_counted
from schedspec.properties.checked_engine import CheckedEngine
from schedspec.properties.corners import CORNER_NAMES, corners_for
from schedspec.properties.harness import SingleEngine
from schedspec.properties.suite import Chunk, SuiteSettings, plan_chunks, run_suite
from schedspec.spec import SchedulerConfig
from tests.broken_engines import wrong_total
from tests.fault_engines import KILL_ONCE_ENV, PressesCtrlCWhenCollected, crashes_in_snapshot

T = TypeVar("T")
C = TypeVar("C")


class InProcess:
    """A ChunkRunner that runs each chunk here, in order (the merge logic, without
    processes); `lose` names chunk indexes reported lost instead of run."""

    def __init__(self, lose: Iterable[int] = ()) -> None:
        self.lose = set(lose)

    def map_chunks(
        self,
        work: Callable[[C], T],
        chunks: Iterable[C],
        on_progress: OnProgress[C] | None = None,
    ) -> Iterator[T | WorkerLost[C] | WorkerCrashed[C]]:
        for chunk in chunks:
            if isinstance(chunk, Chunk) and chunk.index in self.lose:
                yield WorkerLost(chunk, -9)
            else:
                yield work(chunk)


def _campaign_of(factory: object, chunks: Iterable[Chunk], runner: object, **kwargs: object):  # type: ignore[no-untyped-def]
    target = SingleEngine(factory, "vllm-v1")  # type: ignore[arg-type]
    settings = SuiteSettings(examples=20, seed=1)
    return run_campaign(BuiltTarget(target), target, settings, chunks, runner, **kwargs)  # type: ignore[arg-type]


def _shrunk_wrong_total(seed: int) -> tuple[SchedulerConfig, tuple[object, ...]]:
    """The config and events of wrong_total's shrunk counterexample on the seed, as one
    chunk of 20 examples finds it."""
    result = run_suite(wrong_total, "vllm-v1", SuiteSettings(examples=20, seed=seed))
    assert result.trace is not None
    return result.trace.config, tuple(result.trace.events)


class TestDurations:
    def test_durations_read_with_units(self) -> None:
        assert [parse_duration(t) for t in ("90", "90s", "5m", "2h", "1h30m", "1d")] == [
            90,
            90,
            300,
            7200,
            5400,
            86400,
        ]
        assert [format_duration(s) for s in (90, 300, 5400, 0.5)] == [
            "1m30s",
            "5m",
            "1h30m",
            "0.5s",
        ]

    @pytest.mark.parametrize("text", ["", "soon", "5x", "-5m", "5 m"])
    def test_a_duration_that_does_not_read_is_refused_naming_the_forms(self, text: str) -> None:
        with pytest.raises(ValueError, match="units s, m, h, d"):
            parse_duration(text)

    @pytest.mark.parametrize("text", ["0", "0s", "8d", "169h"])
    def test_a_duration_out_of_bounds_is_refused_naming_them(self, text: str) -> None:
        with pytest.raises(ValueError, match="more than 0 s and at most 7d"):
            parse_duration(text)

    def test_check_and_diff_refuse_a_bad_duration_naming_the_flag(self) -> None:
        for command in (["check"], ["diff", "--right", "reference"]):
            outcome = CliRunner().invoke(main, [*command, "--duration", "8d"])
            assert outcome.exit_code == 2
            assert "--duration" in outcome.output and "at most 7d" in outcome.output


class TestTimedChunks:
    def test_chunks_stop_at_the_deadline(self) -> None:
        assert list(timed_chunks(5, deadline=time.time() - 1)) == []
        chunks = timed_chunks(5, deadline=time.time() + 60)
        first = [next(chunks) for _ in range(3)]
        assert first == [Chunk(i, 5 + i, CAMPAIGN_CHUNK_EXAMPLES) for i in range(3)]

    def test_examples_cap_a_campaign(self) -> None:
        chunks = list(timed_chunks(0, deadline=time.time() + 60, examples=500, parts=2))
        assert chunks == plan_chunks(500, 0, 2, CAMPAIGN_CHUNK_EXAMPLES)
        assert [c.examples for c in chunks] == [167, 167, 166]


class TestDeadline:
    def test_no_example_starts_after_the_deadline(self) -> None:
        settings = SuiteSettings(examples=100, seed=2, deadline=time.time() - 1)
        result = run_suite(reference_engine, "vllm-v1", settings)
        assert result.passed and result.budget_spent
        assert result.examples == 1  # the first one ran; the deadline is read after each

    def test_a_failure_found_before_the_deadline_is_still_shrunk(self) -> None:
        # crashes_in_snapshot fails in the first example, which runs whatever the deadline
        settings = SuiteSettings(examples=100, seed=1, deadline=time.time() - 1)
        unshrunk = run_suite(crashes_in_snapshot, "vllm-v1", replace(settings, shrink=False))
        result = run_suite(crashes_in_snapshot, "vllm-v1", settings)
        assert result.other_error is not None and not result.budget_spent
        assert unshrunk.first_failure_example == 1
        assert result.examples > unshrunk.examples  # shrinking ran past the deadline
        assert result.trace is not None and unshrunk.trace is not None
        assert len(result.trace.events) <= len(unshrunk.trace.events)


class TestCampaignMerge:
    def test_a_campaign_keeps_every_distinct_failure_once(self, tmp_path: Path) -> None:
        # Chunks 0 and 2 run the same seed: their shrunk traces are the same finding.
        # Chunk 1 runs the first seed after it whose shrunk trace differs: a finding of
        # its own (which seed that is depends on what Hypothesis draws, so it is found
        # here rather than written down).
        first = _shrunk_wrong_total(1)
        other = next(s for s in range(2, 12) if _shrunk_wrong_total(s) != first)
        chunks = [Chunk(0, 1, 20), Chunk(1, other, 20), Chunk(2, 1, 20)]
        campaign = _campaign_of(
            wrong_total, chunks, InProcess(), keep_going=True, trace_dir=tmp_path
        )
        labels = [(f.label, f.seed) for f in campaign.findings]
        assert labels == [("BUDGET", 1), ("BUDGET", other)]
        first, second = campaign.findings
        assert first.trace_path == tmp_path / "schedspec-failure-1.json"  # the run's seed
        assert second.trace_path == tmp_path / f"schedspec-failure-{other}.json"  # its chunk's
        assert second.trace_path.exists() and second.events == 3
        result = campaign.result
        assert result.error is not None  # the first failure, rebuilt here
        assert {v.invariant for v in result.error.violations} == {"BUDGET"}
        assert campaign.chunks == 3

    def test_a_count_run_stops_at_its_first_failure(self) -> None:
        chunks = [Chunk(0, 1, 20), Chunk(1, 5, 20)]
        campaign = _campaign_of(wrong_total, chunks, InProcess())
        assert campaign.chunks == 1 and len(campaign.findings) == 1

    def test_a_lost_worker_loses_only_its_chunk(self) -> None:
        chunks = [Chunk(i, 10 + i, 5) for i in range(3)]
        campaign = _campaign_of(reference_engine, chunks, InProcess(lose=[1]), keep_going=True)
        assert campaign.chunks == 3 and campaign.lost == 1
        assert [(f.label, f.seed) for f in campaign.findings] == [("worker lost", 11)]
        assert isinstance(campaign.result.other_error, WorkerLostError)
        assert campaign.result.examples >= 10  # chunks 0 and 2 counted

    def test_forked_workers_lose_only_the_chunk_whose_engine_killed_them(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv(KILL_ONCE_ENV, str(tmp_path / "killed"))
        from tests.fault_engines import kills_its_process_once

        chunks = [Chunk(i, i, 5) for i in range(3)]
        campaign = _campaign_of(kills_its_process_once, chunks, ForkedWorkers(1), keep_going=True)
        assert campaign.lost == 1 and campaign.chunks == 3
        assert [f.label for f in campaign.findings] == ["worker lost"]
        assert "SIGKILL" in str(campaign.result.other_error)


class TestProgress:
    def test_forked_workers_report_progress_while_they_run(self) -> None:
        seen: list[tuple[int, int]] = []

        def on_progress(tally: CampaignTally) -> None:
            seen.append((tally.examples, tally.steps))

        chunks = plan_chunks(40, 3, parts=2)
        campaign = _campaign_of(reference_engine, chunks, ForkedWorkers(2), on_progress=on_progress)
        assert campaign.result.passed
        assert seen and seen[-1] == (campaign.result.examples, campaign.result.stats.steps)
        assert all(b >= a for (a, _), (b, _) in itertools.pairwise(seen))

    def test_a_report_after_its_chunk_finished_is_not_counted_twice(self) -> None:
        tally = CampaignTally()
        chunk = Chunk(0, 0, 10)
        tally.reported(chunk, ChunkProgress(4, 40))
        tally.finished(chunk, 10, 100)
        assert (tally.examples, tally.steps) == (10, 100)

    def test_the_lines_count_examples_steps_and_failures(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with campaign_progress(10, None, forced=True, tty=False) as advance:
            assert advance is not None
            advance(CampaignTally(finished_examples=7, finished_steps=70, findings=1))
        assert "checking: 7 examples, 70 steps, 1 failures" in capsys.readouterr().err

    def test_a_campaign_measures_its_time_not_its_examples(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Both displays start at 0 s; the reports come at 0.4 s and 4 s.
        readings = [0.0, 0.0, 0.4, 4.0]
        monkeypatch.setattr(
            "schedspec.cli.printing.progress.time.perf_counter",
            lambda: readings.pop(0) if len(readings) > 1 else readings[0],
        )
        with campaign_progress(1000, 10.0, forced=True, tty=False) as advance:
            assert advance is not None
            advance(CampaignTally(finished_examples=7, finished_steps=70))  # 0 of 10 s: quiet
            advance(CampaignTally(finished_examples=9, finished_steps=90))  # 4 s: a line
        assert capsys.readouterr().err.startswith("checking: 9 examples, 90 steps (")

    def test_a_capped_campaign_measures_its_examples_when_they_run_out_first(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # 600 s or 1000 examples: at 1 s, 500 examples are half the run, not 1/600 of it.
        monkeypatch.setattr("schedspec.cli.printing.progress.time.perf_counter", lambda: 1.0)
        with campaign_progress(1000, 600.0, forced=True, tty=False) as advance:
            assert advance is not None
            advance(CampaignTally(finished_examples=50, finished_steps=500))  # 5%: quiet
            assert capsys.readouterr().err == ""
            advance(CampaignTally(finished_examples=500, finished_steps=5000))
        assert "checking: 500 examples, 5000 steps (" in capsys.readouterr().err


def _ctrl_c_in_a_finalizer_before(second: int, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
    """The chunks, pulled one by one as a runner does; just before chunk `second` is
    handed over, a finalizer presses Ctrl-C (fault_engines.PressesCtrlCWhenCollected)."""
    for position, chunk in enumerate(chunks):
        if position == second:
            PressesCtrlCWhenCollected()  # collected at once: its __del__ runs here
        yield chunk


class TestInterrupts:
    def test_a_ctrl_c_a_finalizer_swallowed_still_stops_the_campaign(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A fresh-clone CI run once finished a --workers campaign with exit 0 after its
        # Ctrl-C: the SIGINT had landed while the driver ran a finalizer.
        swallowed: list[type[BaseException] | None] = []
        monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
        # Python's own handler, which the command line counts (signals.py), whatever
        # the test runner installed.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with interrupt_signals_counted():
                chunks = [Chunk(i, 10 + i, 3) for i in range(4)]
                pressing = _ctrl_c_in_a_finalizer_before(1, chunks)
                campaign = _campaign_of(reference_engine, pressing, InProcess())
        finally:
            signal.signal(signal.SIGINT, previous)
        assert swallowed == [KeyboardInterrupt]  # the handler's exception went nowhere
        assert isinstance(campaign.result.interrupted, KeyboardInterrupt)
        # The chunk running when the signal came finished and is merged; no later one ran.
        assert campaign.chunks == 2

    def test_without_a_signal_every_chunk_runs(self) -> None:
        with interrupt_signals_counted():
            chunks = [Chunk(i, 10 + i, 3) for i in range(4)]
            campaign = _campaign_of(reference_engine, chunks, InProcess())
        assert campaign.result.interrupted is None and campaign.chunks == 4


class TestCorners:
    def test_a_long_prompt_is_prefilled_in_chunks_that_fill_the_budget(self) -> None:
        config = SchedulerConfig(
            block_size=4,
            num_blocks=32,
            max_num_batched_tokens=8,
            max_num_seqs=2,
            max_model_len=64,
        )
        checked = CheckedEngine(ReferenceEngine(config), config, "vllm-v1")
        checked.apply(AddRequest("A", tuple(range(20)), 2))
        checked.apply(Step())
        assert checked.stats.corners == {"budget-exact-fit": 1}

    def test_a_run_counts_corners_by_name(self) -> None:
        result = run_suite(reference_engine, "vllm-v1", SuiteSettings(examples=30, seed=4))
        corners = result.stats.corners
        assert set(corners) <= set(CORNER_NAMES) and corners
        assert all(0 < steps <= result.stats.steps for steps in corners.values())


class TestExampleDatabase:
    def test_a_failure_found_once_is_tried_first_next_time(self, tmp_path: Path) -> None:
        source = LocalDirectory(tmp_path / "db", "check:wrong_total:vllm-v1:suite-configs")
        first = run_suite(
            wrong_total, "vllm-v1", SuiteSettings(examples=50, seed=1, database=source.open())
        )
        assert first.first_failure_example is not None and first.first_failure_example > 1
        again = run_suite(
            wrong_total, "vllm-v1", SuiteSettings(examples=50, seed=99, database=source.open())
        )
        assert again.first_failure_example == 1  # the saved failure, replayed first

    def test_namespaces_keep_engines_apart(self, tmp_path: Path) -> None:
        path = tmp_path / "db"
        run_suite(
            wrong_total,
            "vllm-v1",
            SuiteSettings(examples=50, seed=1, database=LocalDirectory(path, "a").open()),
        )
        other = LocalDirectory(path, "b").open()
        again = run_suite(
            wrong_total, "vllm-v1", SuiteSettings(examples=50, seed=1, database=other)
        )
        assert again.first_failure_example not in (None, 1)

    def test_check_shares_the_database_across_its_workers(self, tmp_path: Path) -> None:
        engine = "tests.broken_engines:wrong_total"
        base = ["check", "--engine", engine, "--workers", "2", "--examples", "40"]
        base += ["--example-db", str(tmp_path / "db"), "--trace-dir", str(tmp_path)]
        json_path = tmp_path / "report.json"
        CliRunner().invoke(main, [*base, "--seed", "1"])
        outcome = CliRunner().invoke(main, [*base, "--seed", "77", "--json", str(json_path)])
        assert outcome.exit_code == 1, outcome.output
        assert json.loads(json_path.read_text())["first_failure_example"] == 1


class TestCommandLine:
    def test_a_campaign_on_local_processes_reports_what_it_covered(self, tmp_path: Path) -> None:
        json_path = tmp_path / "report.json"
        args = ["check", "--workers", "2", "--duration", "3s", "--seed", "1"]
        outcome = CliRunner().invoke(
            main, [*args, "--trace-dir", str(tmp_path), "--json", str(json_path)]
        )
        assert outcome.exit_code == 0, outcome.output
        assert "examples for 3s of up to 40 actions" in outcome.output
        assert "on 2 local processes:" in outcome.output
        assert "corners reached: " in outcome.output  # the table every run prints
        report = json.loads(json_path.read_text())
        assert report["version"] == 4 and report["campaign"]["workers"] == 2
        assert report["campaign"]["duration"] == 3 and report["campaign"]["findings"] == []
        # merged over every chunk, for the vllm-v1 family's corners (the KV connector's
        # and hybrid KV cache groups' only where a config drew them: these drew neither)
        assert set(report["corners"]) == {
            c.name for c in corners_for("vllm-v1") if not c.needs_connector and not c.needs_hybrid
        }
        assert report["corners"]["preemption"] > 0

    def test_a_campaign_lists_the_failures_it_kept(self, tmp_path: Path) -> None:
        args = ["check", "--engine", "tests.broken_engines:wrong_total", "--workers", "2"]
        args += ["--duration", "4s", "--seed", "1", "--trace-dir", str(tmp_path)]
        outcome = CliRunner().invoke(main, args)
        assert outcome.exit_code == 1, outcome.output
        assert "failures kept:" in outcome.output
        assert "BUDGET (chunk seed 1): " in outcome.output
        assert outcome.output.rstrip().endswith("FAILED: BUDGET (seed 1)")

    def test_diff_takes_workers(self, tmp_path: Path) -> None:
        args = ["diff", "--right", "reference", "--workers", "2", "--examples", "10", "--seed", "1"]
        outcome = CliRunner().invoke(main, [*args, "--trace-dir", str(tmp_path)])
        assert outcome.exit_code == 0, outcome.output
        assert "on 2 local processes: 2 chunks, " in outcome.output

    def test_ray_without_ray_installed_is_a_usage_error_naming_the_extra(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "ray", None)  # find_spec: not installed
        swarm = ["check", "--engine", "gpu", "--instances", "8"]
        for command in (["check"], ["diff", "--right", "reference"], swarm):
            outcome = CliRunner().invoke(main, [*command, "--ray"])
            assert outcome.exit_code == 2, outcome.output
            assert "--ray needs Ray, which is not installed here" in outcome.output
            assert "pip install 'ray" in outcome.output  # the extra's pin, outside a checkout too


class TestRayAddress:
    """Joining a cluster: an address that does not answer is refused at once, naming it
    (Ray's own client would retry it for minutes). Needs no Ray."""

    def test_an_address_where_nothing_listens_is_refused(self) -> None:
        with socket.socket() as probe:  # a port just freed: nothing listens there
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with pytest.raises(RayClusterError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
            check_reachable(f"127.0.0.1:{port}", timeout=5)
        with pytest.raises(RayClusterError, match=f"at ray://127.0.0.1:{port}: "):
            check_reachable(f"ray://127.0.0.1:{port}", timeout=5)

    def test_an_address_that_answers_passes(self) -> None:
        with socket.socket() as listening:
            listening.bind(("127.0.0.1", 0))
            listening.listen()
            port = listening.getsockname()[1]
            check_reachable(f"127.0.0.1:{port}", timeout=5)
            check_reachable(f"ray://127.0.0.1:{port}", timeout=5)
        check_reachable("auto")  # Ray finds this machine's cluster itself

    @pytest.mark.parametrize("address", ["head", "head:", "head:port", ":6379"])
    def test_an_address_of_another_form_is_refused_naming_the_forms(self, address: str) -> None:
        with pytest.raises(RayClusterError, match="auto, HOST:PORT or ray://HOST:PORT"):
            check_reachable(address)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the reaper reads /proc (Linux)")
class TestRayReaper:
    """ray_reaper: what ends a local cluster's processes once its driver is done or gone.
    Needs no Ray: plain processes carry the mark."""

    @staticmethod
    def marked(token: str, code: str) -> subprocess.Popen[bytes]:
        environment = {**os.environ, ray_reaper.RUN_VARIABLE: token}
        command = [sys.executable, "-c", code]
        return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE)

    @staticmethod
    def refreshed_until(cluster: ray_reaper.Cluster, pids: set[int]) -> list[int]:
        deadline = time.monotonic() + 30
        found = cluster.refresh()
        while not pids <= set(found) and time.monotonic() < deadline:
            time.sleep(0.1)
            found = cluster.refresh()
        return found

    @staticmethod
    def gone(pid: int) -> bool:
        """Ended: no such process, or a zombie nobody has reaped yet."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat[stat.rindex(")") + 2] == "Z"

    def test_every_marked_process_ends_even_one_that_ignores_sigterm(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        token = uuid.uuid4().hex
        stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        processes = [
            self.marked(token, "import time; time.sleep(60)"),
            self.marked(token, stubborn + "print('ready', flush=True); time.sleep(60)"),
        ]
        spared = self.marked(token, "import time; time.sleep(60)")
        other = self.marked(uuid.uuid4().hex, "import time; time.sleep(60)")
        cluster = ray_reaper.Cluster(token, frozenset({spared.pid}))
        try:
            assert processes[1].stdout is not None
            assert processes[1].stdout.readline() == b"ready\n"  # its handler is set
            self.refreshed_until(cluster, {p.pid for p in processes})
            found = ray_reaper.sweep(cluster)
            assert sorted(found) == sorted(p.pid for p in processes)
            assert [p.wait(10) for p in processes] == [-signal.SIGTERM, -signal.SIGKILL]
            assert spared.poll() is None and other.poll() is None

            # One that appears a second into sweeping (as an agent a dying raylet starts).
            def start_late() -> None:
                processes.append(self.marked(token, "import time; time.sleep(60)"))

            timer = threading.Timer(1.0, start_late)
            monkeypatch.setattr(ray_reaper, "QUIET_SECONDS", 5.0)
            timer.start()
            ray_reaper.sweep_until_quiet(cluster)
            timer.join()
            assert len(processes) == 3 and processes[2].wait(10) == -signal.SIGTERM
            assert spared.poll() is None and other.poll() is None
        finally:
            for process in (spared, other, *processes):
                process.kill()
                process.wait()
                if process.stdout is not None:
                    process.stdout.close()

    def test_an_orphan_that_lost_its_mark_is_swept_as_a_remembered_descendant(self) -> None:
        # As Ray's agents: a marked parent (the raylet) starts a child whose environment, as
        # /proc shows it, no longer holds the mark (their process title overwrites it), and
        # dies first (SIGKILL), leaving the child to init.
        token = uuid.uuid4().hex
        unmarked = f"{{k: v for k, v in os.environ.items() if k != {ray_reaper.RUN_VARIABLE!r}}}"
        parent_code = (
            "import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            f"env={unmarked})\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n"
        )
        parent = self.marked(token, parent_code)
        cluster = ray_reaper.Cluster(token)
        child = 0
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            assert not ray_reaper.is_marked(child, token)
            # What the reaper sees while the cluster runs: the parent marked, the child its
            # descendant.
            assert self.refreshed_until(cluster, {parent.pid, child}) == sorted([parent.pid, child])
            parent.kill()
            parent.wait()
            assert ray_reaper.sweep(cluster) == [child]
            deadline = time.monotonic() + 10
            while not self.gone(child) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert self.gone(child)
            # A fresh reaper that never saw the parent could not have found it.
            assert ray_reaper.Cluster(token).refresh() == []
        finally:
            parent.kill()
            parent.wait()
            if parent.stdout is not None:
                parent.stdout.close()
            if child and not self.gone(child):
                os.kill(child, signal.SIGKILL)

    def test_the_watch_remembers_the_cluster_until_the_driver_closes_its_pipe(self) -> None:
        token = uuid.uuid4().hex
        process = self.marked(token, "import time; time.sleep(60)")
        cluster = ray_reaper.Cluster(token)
        read_end, write_end = os.pipe()
        closer = threading.Timer(2.5, os.close, [write_end])
        try:
            closer.start()
            started = time.monotonic()
            ray_reaper.watch_until_closed(cluster, read_end)
            assert time.monotonic() - started >= 2.0  # it waited for the end of file
            assert process.pid in cluster.remembered  # and looked at /proc meanwhile
        finally:
            closer.join()
            os.close(read_end)
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()

    def test_a_stat_line_whose_command_name_holds_parentheses_and_spaces(self) -> None:
        stat = "4242 (we (ird) name)) S 17 4242 17 0 -1 4194304 " + "0 " * 12 + "98765 31 2"
        expected = ray_reaper.ProcessEntry(parent=17, start=98765, state="S")
        assert ray_reaper.parse_stat(stat) == expected
