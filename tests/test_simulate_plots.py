"""The pictures: what each figure draws, and that overlays carry every config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from schedspec.properties.reference_adapter import reference_engine
from schedspec.simulate.configs import resolve_configs
from schedspec.simulate.cost_model import CostModel, StepWork
from schedspec.simulate.plots import (
    gantt_figure,
    gantt_segments,
    kv_queue_figure,
    latency_cdf_figure,
    save_figure,
)
from schedspec.simulate.runs import ConfigRun, run_configs
from schedspec.simulate.simulator import RequestTimeline, SimStep, SimulationResult
from schedspec.simulate.timeline import ScheduledEntry
from schedspec.simulate.workloads import long_prompt_among_decodes
from schedspec.spec import SchedulerConfig


def _toy_result() -> SimulationResult:
    """A: prefill then two decodes back to back; B: a decode after a gap."""
    config = SchedulerConfig(
        block_size=16, num_blocks=8, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64
    )

    def step(start: float, *entries: ScheduledEntry) -> SimStep:
        return SimStep(start, 1.0, list(entries), StepWork(0, 0, 0), 0.5, 0, 1, [])

    steps = [
        step(0.0, ScheduledEntry("A", "prefill", 10, 0)),
        step(1.0, ScheduledEntry("A", "decode", 1, 0), ScheduledEntry("B", "decode", 1, 0)),
        step(2.0, ScheduledEntry("A", "decode", 1, 0)),
        step(3.0, ScheduledEntry("B", "spec", 3, 2)),
    ]
    requests = {rid: RequestTimeline(rid, 0.0, prompt_len=10, max_tokens=3) for rid in "AB"}
    return SimulationResult("toy", config, CostModel(), steps, requests)


def test_gantt_segments_merge_back_to_back_steps() -> None:
    merged = gantt_segments(_toy_result(), merge=True)
    assert merged[("A", "prefill")] == [(0.0, 1.0)]
    assert merged[("A", "decode")] == [(1.0, 2.0)]  # steps 2 and 3, one bar
    assert merged[("B", "decode")] == [(1.0, 1.0)]
    assert merged[("B", "spec")] == [(3.0, 1.0)]
    per_step = gantt_segments(_toy_result(), merge=False)
    assert per_step[("A", "decode")] == [(1.0, 1.0), (2.0, 1.0)]


def test_gantt_draws_one_collection_per_kind() -> None:
    fig = gantt_figure(_toy_result())
    (ax,) = fig.axes
    collections = {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}
    assert set(collections) == {"prefill", "decode", "spec"}
    assert len(collections["decode"].get_paths()) == 3  # A's two steps, B's one
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B"]


@pytest.fixture(scope="module")
def two_runs() -> list[ConfigRun]:
    cost = CostModel()
    configs = resolve_configs([], False, True, {}, cost)
    return run_configs(
        configs, long_prompt_among_decodes(0, 4096), reference_engine, cost, 0, 10**5
    )


def test_overlays_have_a_line_per_config(two_runs: list[ConfigRun]) -> None:
    kv_ax, queue_ax, step_ax = kv_queue_figure([r.result for r in two_runs]).axes
    assert [line.get_label() for line in kv_ax.lines] == ["no-chunking", "chunked-512"]
    assert len(queue_ax.lines) == 2
    # The whole long prompt is one ~50 ms iteration; chunked, no iteration comes close.
    peaks = [max(np.asarray(line.get_ydata())) for line in step_ax.lines]
    assert peaks[0] > 40 > 10 > peaks[1]
    cdf_axes = latency_cdf_figure([(r.result, r.metrics) for r in two_runs]).axes
    assert [len(ax.lines) for ax in cdf_axes] == [2, 2, 2]
    # A CDF ends at 1 with every request counted.
    ttft_line = cdf_axes[0].lines[0]
    ys = np.asarray(ttft_line.get_ydata())
    assert ys[-1] == 1.0 and len(ys) == 17


def test_save_writes_each_format(two_runs: list[ConfigRun], tmp_path: Path) -> None:
    paths = save_figure(gantt_figure(two_runs[0].result), tmp_path, "g", ["png", "svg"])
    assert [p.name for p in paths] == ["g.png", "g.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in paths[1].read_bytes()[:500]
