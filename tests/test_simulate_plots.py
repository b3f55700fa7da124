"""The pictures: what each figure draws, that overlays carry every config, that
legends sit clear of the data and that the Gantt shows each wait in the queue."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from schedspec.adapters.reference import reference_engine
from schedspec.simulate.configs import resolve_configs
from schedspec.simulate.cost_model import CostModel, StepWork
from schedspec.simulate.log_ticks import MIN_LABELS
from schedspec.simulate.metrics import RequestMetrics
from schedspec.simulate.plots import (
    KIND_COLORS,
    MIN_PHASE_SHARE,
    WAIT_COLOR,
    gantt_figure,
    gantt_segments,
    kv_queue_figure,
    latency_cdf_figure,
    pack_lanes,
    save_figure,
    wait_spans,
)
from schedspec.simulate.runs import ConfigRun, run_configs
from schedspec.simulate.simulator import RequestTimeline, SimStep, SimulationResult
from schedspec.simulate.timeline import ScheduledEntry
from schedspec.simulate.workloads import long_prompt_among_decodes
from schedspec.spec import SchedulerConfig


def _step(start: float, *entries: ScheduledEntry, preempted: tuple[str, ...] = ()) -> SimStep:
    """A one-second iteration at start."""
    return SimStep(start, 1.0, list(entries), StepWork(0, 0, 0), 0.5, 0, 1, list(preempted))


def _result(steps: list[SimStep], arrivals: dict[str, float]) -> SimulationResult:
    config = SchedulerConfig(
        block_size=16, num_blocks=8, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64
    )
    requests = {
        rid: RequestTimeline(rid, at, prompt_len=10, max_tokens=3) for rid, at in arrivals.items()
    }
    return SimulationResult("toy", config, CostModel(), steps, requests)


def _toy_result() -> SimulationResult:
    """A: prefill then two decodes back to back; B: a decode after a gap (it
    waits in the queue for the first second)."""
    steps = [
        _step(0.0, ScheduledEntry("A", "prefill", 10, 0)),
        _step(1.0, ScheduledEntry("A", "decode", 1, 0), ScheduledEntry("B", "decode", 1, 0)),
        _step(2.0, ScheduledEntry("A", "decode", 1, 0)),
        _step(3.0, ScheduledEntry("B", "spec", 3, 2)),
    ]
    return _result(steps, {"A": 0.0, "B": 0.0})


def _preempted_result() -> SimulationResult:
    """A runs at 0 and 1, is preempted by the iteration at 2 (B's admission needs
    its blocks) and resumes at 4; B arrives at 0.5 and first runs at 1; C arrives
    at 2.5 and is still queued when the steps end at 5."""
    steps = [
        _step(0.0, ScheduledEntry("A", "prefill", 10, 0)),
        _step(1.0, ScheduledEntry("A", "decode", 1, 0), ScheduledEntry("B", "prefill", 10, 0)),
        _step(2.0, ScheduledEntry("B", "decode", 1, 0), preempted=("A",)),
        _step(3.0, ScheduledEntry("B", "decode", 1, 0)),
        _step(4.0, ScheduledEntry("A", "prefill", 11, 0)),
    ]
    return _result(steps, {"A": 0.0, "B": 0.5, "C": 2.5})


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
    assert set(collections) == {"waiting in queue", "prefill", "decode", "spec"}
    assert len(collections["decode"].get_paths()) == 3  # A's two steps, B's one
    assert len(collections["waiting in queue"].get_paths()) == 1  # B, from 0 to 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B"]


def test_wait_spans_before_admission_after_preemption_and_at_the_end() -> None:
    assert wait_spans(_preempted_result()) == {
        "A": [(2.0, 2.0)],  # preempted at 2, scheduled again at 4; no wait at arrival
        "B": [(0.5, 0.5)],  # arrived at 0.5, first scheduled at 1
        "C": [(2.5, 2.5)],  # arrived at 2.5, still waiting when the last step ends at 5
    }
    assert wait_spans(_toy_result()) == {"A": [], "B": [(0.0, 1.0)]}


def _boxes(collection: PolyCollection) -> list[tuple[float, float, float, float]]:
    """Each drawn box as (x0, x1, y0, y1)."""
    boxes = []
    for path in collection.get_paths():
        vertices = np.asarray(path.vertices)
        xs, ys = vertices[:, 0], vertices[:, 1]
        boxes.append((float(xs.min()), float(xs.max()), float(ys.min()), float(ys.max())))
    return sorted(boxes)


def test_gantt_draws_waits_apart_from_work() -> None:
    (ax,) = gantt_figure(_preempted_result()).axes
    collections = {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}
    waits = collections["waiting in queue"]
    # Rows: A 0, B 1, C 2. Waits are thinner bands (0.4 of a row) than work (0.8).
    assert _boxes(waits) == [
        (0.5, 1.0, 0.8, 1.2),  # B before admission
        (2.0, 4.0, -0.2, 0.2),  # A after its preemption
        (2.5, 5.0, 1.8, 2.2),  # C, never admitted
    ]
    assert _boxes(collections["prefill"])[0] == (0.0, 1.0, -0.4, 0.4)
    wait_color = tuple(np.asarray(waits.get_facecolor())[0])
    assert wait_color == to_rgba(WAIT_COLOR)
    assert all(wait_color != to_rgba(color) for color in KIND_COLORS.values())
    # The preemption tick sits where A's wait starts.
    (ticks,) = [c for c in ax.collections if c.get_label() == "preempted"]
    assert np.asarray(ticks.get_offsets()).tolist() == [[2.0, 0.0]]


def _assert_legend_clear_of_axes(fig: Figure) -> None:
    """One figure legend, drawn outside every axes' data area; none inside one."""
    fig.draw_without_rendering()
    (legend,) = fig.legends
    box = legend.get_window_extent()
    assert box.width > 0 and box.height > 0
    for ax in fig.axes:
        assert ax.get_legend() is None
        assert not box.overlaps(ax.get_window_extent()), (box, ax.get_window_extent())


@pytest.fixture(scope="module")
def two_runs() -> list[ConfigRun]:
    cost = CostModel()
    configs = resolve_configs([], False, True, {}, cost)
    return run_configs(
        configs, long_prompt_among_decodes(0, 4096), reference_engine, cost, 0, 10**5
    )


def test_overlays_have_a_line_per_config(two_runs: list[ConfigRun]) -> None:
    kv_ax, queue_ax, *strips = kv_queue_figure([r.result for r in two_runs]).axes
    assert [line.get_label() for line in kv_ax.lines] == ["no-chunking", "chunked-512"]
    assert len(queue_ax.lines) == 2
    # The whole long prompt is one ~50 ms iteration; chunked, no iteration comes close.
    peaks = [max(np.asarray(line.get_ydata())) for strip in strips for line in strip.lines]
    assert peaks[0] > 40 > 10 > peaks[1]
    cdf_axes = latency_cdf_figure([(r.result, r.metrics) for r in two_runs]).axes
    assert [len(ax.lines) for ax in cdf_axes] == [2, 2, 2]
    # A CDF ends at 1 with every request counted.
    ttft_line = cdf_axes[0].lines[0]
    ys = np.asarray(ttft_line.get_ydata())
    assert ys[-1] == 1.0 and len(ys) == 17


def _strip_name(strip: Axes) -> str:
    (line,) = strip.lines
    return str(line.get_label())


def test_compare_draws_iteration_time_as_one_strip_per_config() -> None:
    names = ["no-chunking", "chunked", "chunked-512", "no-prefix-cache", "spec-decode", "small-kv"]
    results = [dataclasses.replace(_toy_result(), name=name) for name in names]
    fig = kv_queue_figure(results)
    kv_ax, queue_ax, *strips = fig.axes
    assert [len(kv_ax.lines), len(queue_ax.lines)] == [6, 6]  # KV and queue overlay
    assert [_strip_name(s) for s in strips] == names  # one series per strip, in order
    assert [s.get_title(loc="left") for s in strips] == [f"iteration time: {n}" for n in names]
    # Each config keeps its colour from the overlays, and the colours differ.
    colors = [to_rgba(line.get_color()) for line in kv_ax.lines]
    assert [to_rgba(s.lines[0].get_color()) for s in strips] == colors
    assert len(set(colors)) == 6
    # One time axis for every panel, one millisecond scale from 0 for every strip.
    for strip in strips:
        assert strip.get_shared_x_axes().joined(strip, kv_ax)
        assert strip.get_shared_y_axes().joined(strip, strips[0])
        assert strip.get_ylim() == strips[0].get_ylim() and strip.get_ylim()[0] == 0
    # Time is labelled once, under the last strip.
    fig.draw_without_rendering()
    labelled = [ax for ax in fig.axes if any(t.get_text() for t in ax.get_xticklabels())]
    assert labelled == [strips[-1]]
    assert strips[-1].get_xlabel() == "simulated time (s)"
    # The strips are stacked in order, top to bottom, without overlapping.
    tops = [ax.get_position().y1 for ax in fig.axes]
    bottoms = [ax.get_position().y0 for ax in fig.axes]
    assert all(b > t for b, t in zip(bottoms, tops[1:], strict=False))


def test_legends_never_cover_data(two_runs: list[ConfigRun]) -> None:
    _assert_legend_clear_of_axes(gantt_figure(_preempted_result()))
    _assert_legend_clear_of_axes(gantt_figure(two_runs[1].result))  # 17 rows, full width
    _assert_legend_clear_of_axes(kv_queue_figure([r.result for r in two_runs]))
    _assert_legend_clear_of_axes(latency_cdf_figure([(r.result, r.metrics) for r in two_runs]))
    labels = [t.get_text() for t in gantt_figure(_preempted_result()).legends[0].get_texts()]
    assert labels == ["waiting in queue", "prefill", "decode", "preempted"]


def _metrics(tpot_ms: list[float], ttft_ms: list[float]) -> list[RequestMetrics]:
    return [
        RequestMetrics(f"r{i}", 0.0, ttft / 1000, tpot / 1000, tpot / 1000, 1.0, 10, 0, 0, "done")
        for i, (tpot, ttft) in enumerate(zip(tpot_ms, ttft_ms, strict=True))
    ]


def _visible_labels(ax: Axes) -> list[str]:
    low, high = sorted(ax.get_xlim())
    return [
        t.get_text()
        for t in ax.get_xticklabels()
        if low <= t.get_position()[0] <= high and t.get_text()
    ]


def test_every_cdf_panel_has_readable_labels() -> None:
    """TPOT (and the worst gap, fed the same values) inside one decade, TTFT over
    four: each panel labels at least MIN_LABELS distinct values."""
    tpot = [4.3, 4.5, 4.6, 4.9]
    ttft = [5.0, 40.0, 900.0, 22000.0]
    fig = latency_cdf_figure([(_toy_result(), _metrics(tpot, ttft))])
    fig.draw_without_rendering()
    ttft_ax, tpot_ax, gap_ax = fig.axes
    assert _visible_labels(ttft_ax) == ["10", "100", "1000", "10000"]
    for ax in (tpot_ax, gap_ax):
        labels = _visible_labels(ax)
        assert len(labels) >= MIN_LABELS and len(set(labels)) == len(labels)
        assert all(4.2 <= float(label) <= 5.0 for label in labels), labels


def test_chunked_prefill_cdf_panels_have_readable_labels(two_runs: list[ConfigRun]) -> None:
    """The experiment's TPOTs all lie between 4.6 and 5.1 ms: that panel used to
    have no label at all, and the other two one each."""
    fig = latency_cdf_figure([(r.result, r.metrics) for r in two_runs])
    fig.draw_without_rendering()
    for ax in fig.axes:
        labels = _visible_labels(ax)
        assert len(labels) >= MIN_LABELS and len(set(labels)) == len(labels), labels
        assert ax.get_xscale() == "log"


def test_save_writes_each_format(two_runs: list[ConfigRun], tmp_path: Path) -> None:
    paths = save_figure(gantt_figure(two_runs[0].result), tmp_path, "g", ["png", "svg"])
    assert [p.name for p in paths] == ["g.png", "g.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in paths[1].read_bytes()[:500]


def test_save_lays_out_once_and_gives_the_layout_engine_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two formats, one layout: the second format draws where the first one's layout
    put the axes; the figure keeps its constrained layout after the save."""
    calls: list[Figure] = []
    execute = ConstrainedLayoutEngine.execute

    def counted(engine: ConstrainedLayoutEngine, fig: Figure) -> object:
        calls.append(fig)
        return execute(engine, fig)

    monkeypatch.setattr(ConstrainedLayoutEngine, "execute", counted)
    fig = kv_queue_figure([_toy_result()])
    engine = fig.get_layout_engine()
    save_figure(fig, tmp_path, "k", ["png", "svg"])
    assert len(calls) == 1
    assert fig.get_layout_engine() is engine
    alone = kv_queue_figure([_toy_result()])
    save_figure(alone, tmp_path, "alone", ["svg"])  # laid out by the SVG's own draw
    kept = np.array([ax.get_position().bounds for ax in fig.axes])
    own = np.array([ax.get_position().bounds for ax in alone.axes])
    assert np.abs(kept - own).max() < 0.01


def test_gantt_bars_are_one_image_in_an_svg(tmp_path: Path) -> None:
    """Thousands of bars as SVG elements took seconds to write: they are rasterized
    (embedded images); the axes and text stay vector."""
    fig = gantt_figure(_crowded_result())
    (ax,) = fig.axes
    bars = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert bars and all(c.get_rasterized() for c in bars)
    (svg,) = save_figure(fig, tmp_path, "g", ["svg"])
    text = svg.read_text()
    assert "<image" in text
    assert text.count("<path") < 400  # one per bar would be over 1,200


def _crowded_result(num_requests: int = 400) -> SimulationResult:
    """num_requests arrive one per 0.05 s step; every third waits a step before its
    prefill; each then decodes for 40 steps: about 41 alive at once, 440 steps."""
    first_step = {f"r{i}": i + (1 if i % 3 == 0 else 0) for i in range(num_requests)}
    steps = []
    for n in range(num_requests + 41):
        entries = [
            ScheduledEntry(rid, "prefill" if n == start else "decode", 8 if n == start else 1, 0)
            for rid, start in first_step.items()
            if start <= n <= start + 40
        ]
        steps.append(dataclasses.replace(_step(n * 0.05, *entries), duration=0.05))
    return _result(steps, {f"r{i}": i * 0.05 for i in range(num_requests)})


def test_a_gantt_of_400_requests_packs_lanes_and_shows_every_phase() -> None:
    """400 requests as a row each left a few pixels per request and one colour overall:
    packed into lanes (as many as are alive at once), each request's prefill drawn wide
    enough to see, every phase in its own colour with a legend entry."""
    result = _crowded_result()
    fig = gantt_figure(result)
    (ax,) = fig.axes
    lanes = round(ax.get_ylim()[0] + 0.5)
    assert 41 <= lanes <= 45, lanes
    assert ax.get_ylabel() == "lane (400 requests, packed by lifetime)"
    collections = {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}
    colours = {tuple(np.asarray(c.get_facecolor())[0]) for c in collections.values()}
    assert len(colours) == len(collections) == 3  # waiting, prefill, decode
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["waiting in queue", "prefill", "decode"]
    span = result.steps[-1].start + result.steps[-1].duration
    prefills = _boxes(collections["prefill"])
    assert len(prefills) == 400
    assert min(x1 - x0 for x0, x1, _, _ in prefills) >= MIN_PHASE_SHARE * span - 1e-9
    # No two requests of one lane overlap in time.
    by_lane: dict[float, list[tuple[float, float]]] = {}
    for x0, x1, y0, y1 in _boxes(collections["decode"]):
        by_lane.setdefault(round((y0 + y1) / 2), []).append((x0, x1))
    for spans in by_lane.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(spans))


def test_pack_lanes_reuses_a_lane_once_its_request_is_done() -> None:
    spans = {"a": (0.0, 2.0), "b": (1.0, 3.0), "c": (2.5, 4.0), "d": (3.5, 5.0)}
    assert pack_lanes(spans) == {"a": 0, "b": 1, "c": 0, "d": 1}


def test_a_few_requests_keep_a_named_row_each() -> None:
    (ax,) = gantt_figure(_crowded_result(30)).axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"r{i}" for i in range(30)]
    assert ax.get_ylabel() == "request (arrival order)"
