"""The smaller hostile inputs: each a usage error (exit 2) naming what is wrong, or a
warning where a request is honoured in part, with no traceback, where they were exit 6
or a silent change to what was asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import ROOT, assert_refused, probe


@pytest.mark.parametrize("value", ["nan", "inf", "0", "1e9"])
def test_prove_refuses_a_query_timeout_out_of_bounds(value: str) -> None:
    result = probe("prove", "--timeout", value, "--only", "BUDGET", "--max-n", "0")
    assert_refused(result, 2, "Invalid value for '--timeout'", "at most 86400 seconds")


def test_a_ray_that_fails_to_import_is_a_usage_error(tmp_path: Path) -> None:
    """find_spec finds a broken package; importing it is what fails."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text('raise ImportError("planted: half-installed")\n')
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "schedspec", "check", "--ray", "--examples", "2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "installed here but fails to import (ImportError: planted" in output
    assert "Traceback" not in output


def test_simulate_says_when_it_cuts_a_shared_prefix(tmp_path: Path) -> None:
    args = ["--num-requests", "8", "--no-plots", "--out", str(tmp_path)]
    result = probe("simulate", "--prefix-len", "100000000", *args)
    assert_refused(result, 0, "warning: --prefix-len 100000000 is cut to 4095 tokens")


def test_a_nan_arrival_time_names_the_field(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"arrival_time": NaN, "prompt_tokens": 5, "output_tokens": 3}\n')
    result = probe("simulate", "--workload", str(workload), "--out", str(tmp_path / "out"))
    assert_refused(result, 2, "line 1: field 'arrival_time' must be a finite number, got NaN")


def test_a_long_trace_replays_printing_only_its_last_events(tmp_path: Path) -> None:
    from schedspec.cli.replay import SHOWN_EVENTS
    from schedspec.engines.events import AddRequest, Step
    from schedspec.spec import SchedulerConfig
    from schedspec.traces.trace import Trace

    config = SchedulerConfig(
        block_size=4, num_blocks=64, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=16
    )
    events = [e for i in range(150) for e in (AddRequest(f"r{i}", (1, 2, 3), 2), Step(), Step())]
    path = tmp_path / "long.json"
    Trace(config, tuple(events)).save(path)
    result = probe("replay", str(path))
    assert_refused(result, 0, f"... {len(events) - SHOWN_EVENTS} earlier events not shown")
    assert result.stdout.count("\n  #") == SHOWN_EVENTS
