"""Pictures of a simulation: Gantt timeline, KV and queue over time, latency CDFs.

matplotlib's object API renders through Agg without pyplot, so no screen or
global backend state is involved; every figure is written as each requested
format (png, svg). Several runs on one workload overlay in the same axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from schedspec.simulate.metrics import RequestMetrics
from schedspec.simulate.simulator import SimulationResult
from schedspec.simulate.timeline import Kind

KIND_COLORS: dict[Kind, str] = {"prefill": "tab:blue", "decode": "tab:green", "spec": "tab:orange"}
LABELLED_ROWS = 40  # name every row up to this many requests
MAX_STEP_BARS = 400  # above this many steps, a Gantt bar spans back-to-back steps


def save_figure(fig: Figure, out_dir: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    paths = []
    for fmt in formats:
        path = out_dir / f"{stem}.{fmt}"
        fig.savefig(path, format=fmt, dpi=100)
        paths.append(path)
    return paths


def gantt_segments(
    result: SimulationResult, merge: bool
) -> dict[tuple[str, Kind], list[tuple[float, float]]]:
    """(request, kind) -> (start, width) bars on the clock, one per step; with merge,
    back-to-back steps of the same kind make one bar (a long decode, one rectangle)."""
    segments: dict[tuple[str, Kind], list[tuple[float, float]]] = {}
    for step in result.steps:
        for entry in step.entries:
            bars = segments.setdefault((entry.request_id, entry.kind), [])
            if merge and bars and abs(bars[-1][0] + bars[-1][1] - step.start) < 1e-12:
                bars[-1] = (bars[-1][0], bars[-1][1] + step.duration)
            else:
                bars.append((step.start, step.duration))
    return segments


def gantt_figure(result: SimulationResult) -> Figure:
    """Which request ran in each iteration, and as what; red ticks mark preemptions."""
    rows = {rid: i for i, rid in enumerate(result.requests)}
    fig = Figure(figsize=(11, max(3.0, min(0.22 * len(rows) + 1.5, 14.0))))
    ax = fig.add_subplot()
    # One collection per kind: a collection per request would cost seconds to draw.
    boxes: dict[Kind, list[list[tuple[float, float]]]] = {}
    # Short runs show every iteration as its own bar (white edges mark the steps).
    merge = len(result.steps) > MAX_STEP_BARS
    for (rid, kind), bars in gantt_segments(result, merge).items():
        low, high = rows[rid] - 0.4, rows[rid] + 0.4
        boxes.setdefault(kind, []).extend(
            [(x, low), (x + w, low), (x + w, high), (x, high)] for x, w in bars
        )
    for kind, verts in boxes.items():
        ax.add_collection(
            PolyCollection(
                verts,
                facecolor=KIND_COLORS[kind],
                edgecolor="white",
                linewidth=0 if merge else 0.4,
                label=kind,
            )
        )
    ax.autoscale_view()
    preempted = [(s.start, rows[rid]) for s in result.steps for rid in s.preempted]
    if preempted:
        xs, ys = zip(*preempted, strict=True)
        ax.scatter(xs, ys, marker="|", color="tab:red", s=80, label="preempted", zorder=3)
    if len(rows) <= LABELLED_ROWS:
        ax.set_yticks(range(len(rows)), list(rows))
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first arrival on top
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("request (arrival order)")
    ax.set_title(f"{result.name}: what each request did in each iteration")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    return fig


def kv_queue_figure(results: Sequence[SimulationResult]) -> Figure:
    """KV usage, the waiting queue and the iteration time after each iteration,
    one line per config (a long step shows as a spike in the last panel)."""
    fig = Figure(figsize=(10, 8))
    kv_ax, queue_ax, step_ax = fig.subplots(3, 1, sharex=True)
    for result in results:
        ends = [s.start + s.duration for s in result.steps]
        kv_ax.step(ends, [100 * s.kv_usage for s in result.steps], where="post", label=result.name)
        queue_ax.step(ends, [s.num_waiting for s in result.steps], where="post", label=result.name)
        # An iteration time holds over the interval that ends with its step.
        step_ax.step(
            ends, [1000 * s.duration for s in result.steps], where="pre", label=result.name
        )
    kv_ax.set_ylabel("KV blocks in use (%)")
    kv_ax.set_ylim(0, 105)
    queue_ax.set_ylabel("waiting requests")
    step_ax.set_ylabel("iteration time (ms)")
    step_ax.set_xlabel("simulated time (s)")
    kv_ax.legend(fontsize="small")
    kv_ax.set_title("KV usage, waiting queue and iteration time")
    fig.tight_layout()
    return fig


def _cdf(ax: Axes, values: Sequence[float], label: str) -> None:
    ordered = sorted(v * 1000 for v in values)
    n = len(ordered)
    ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label)


def latency_cdf_figure(runs: Sequence[tuple[SimulationResult, Sequence[RequestMetrics]]]) -> Figure:
    """CDFs of TTFT, TPOT and the worst gap between tokens, one line per config."""
    fig = Figure(figsize=(14, 4.5))
    axes = fig.subplots(1, 3)
    panels = (
        ("TTFT (ms)", lambda m: m.ttft),
        ("TPOT (ms)", lambda m: m.tpot),
        ("worst gap between tokens (ms)", lambda m: m.worst_gap),
    )
    for ax, (label, metric) in zip(axes, panels, strict=True):
        for result, metrics in runs:
            values = [v for v in map(metric, metrics) if v is not None]
            if values:
                _cdf(ax, values, result.name)
        ax.set_xlabel(label)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    return fig
