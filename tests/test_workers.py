"""The worker layer: chunks planned from the examples, run in forked processes, results in
chunk order, a worker that dies reported as such, the rest stopped when the caller stops."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.adapters.reference import reference_engine
from schedspec.campaign.parallel import run_suite_parallel
from schedspec.campaign.workers import ForkedWorkers, WorkerCrashed, WorkerLost
from schedspec.cli.main import main
from schedspec.properties.suite import MAX_CHUNK_EXAMPLES, Chunk, SuiteSettings, plan_chunks


class TestPlanChunks:
    def test_a_run_that_fits_one_chunk_is_the_plain_run_of_its_seed(self) -> None:
        assert plan_chunks(100, 7) == [Chunk(0, 7, 100)]
        assert plan_chunks(MAX_CHUNK_EXAMPLES, 7) == [Chunk(0, 7, MAX_CHUNK_EXAMPLES)]

    def test_a_long_campaign_is_a_series_of_chunks_on_successive_seeds(self) -> None:
        chunks = plan_chunks(20_000, 5)
        assert len(chunks) == 20 and {c.examples for c in chunks} == {1000}
        assert [c.seed for c in chunks] == list(range(5, 25))
        assert plan_chunks(2001, 0) == [Chunk(0, 0, 667), Chunk(1, 1, 667), Chunk(2, 2, 667)]

    def test_at_least_one_chunk_per_worker_never_more_than_the_examples(self) -> None:
        assert [c.examples for c in plan_chunks(100, 0, parts=3)] == [34, 33, 33]
        assert [c.examples for c in plan_chunks(3, 0, parts=8)] == [1, 1, 1]

    def test_nonsense_sizes_are_refused(self) -> None:
        with pytest.raises(ValueError, match="must be >= 1"):
            plan_chunks(0, 0)


def _square(chunk: int) -> int:
    return chunk * chunk


def _slow_square(chunk: int) -> int:
    time.sleep(0.3 if chunk == 0 else 0)  # the first chunk finishes last
    return chunk * chunk


def _dies(chunk: int) -> int:
    if chunk == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return chunk


def _raises(chunk: int) -> int:
    raise ValueError(f"planted in chunk {chunk}")


def _pid(chunk: int) -> int:
    return os.getpid()


class TestForkedWorkers:
    def test_results_come_in_chunk_order_whatever_finishes_first(self) -> None:
        assert list(ForkedWorkers(3).map_chunks(_slow_square, [0, 1, 2, 3])) == [0, 1, 4, 9]

    def test_every_chunk_runs_in_a_fresh_process(self) -> None:
        pids = list(ForkedWorkers(2).map_chunks(_pid, [0, 1, 2, 3]))
        assert len(set(pids)) == 4 and os.getpid() not in pids

    def test_a_worker_that_dies_is_reported_in_its_place(self) -> None:
        results = list(ForkedWorkers(2).map_chunks(_dies, [0, 1, 2]))
        assert results[0] == 0 and results[2] == 2
        lost = results[1]
        assert isinstance(lost, WorkerLost) and lost.chunk == 1
        assert lost.describe() == "was ended by SIGKILL"

    def test_what_the_work_raises_comes_back_as_text(self) -> None:
        (crashed,) = ForkedWorkers(1).map_chunks(_raises, [4])
        assert isinstance(crashed, WorkerCrashed)
        assert "ValueError: planted in chunk 4" in crashed.traceback

    def test_closing_the_results_stops_the_workers_still_running(self) -> None:
        results = ForkedWorkers(2).map_chunks(_slow_square, [0, 1, 2, 3])
        started = time.monotonic()
        assert next(results) == 0
        results.close()  # type: ignore[attr-defined]
        assert time.monotonic() - started < 5


def test_more_workers_than_examples_run_one_example_each(tmp_path: Path) -> None:
    """`--workers 8 --examples 3` crashed inside Hypothesis (workers given 0 examples)."""
    result = run_suite_parallel(reference_engine, "vllm-v1", SuiteSettings(examples=3, seed=2), 8)
    assert result.passed and result.examples >= 3
    outcome = CliRunner().invoke(
        main, ["check", "--workers", "8", "--examples", "3", "--trace-dir", str(tmp_path)]
    )
    assert outcome.exit_code == 0, outcome.output
