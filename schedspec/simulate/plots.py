"""Pictures of a simulation: Gantt timeline, KV and queue over time, latency CDFs.

matplotlib's object API renders through Agg without pyplot, so no screen or
global backend state is involved; every figure is written as each requested
format (png, svg). Several runs on one workload overlay in the same axes, in
the same colour per config in every panel, except iteration time: one strip
per config, since six overlaid series of thousands of spikes hide each other.
Legends sit outside every axes (constrained layout makes room), so they never
cover data.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from schedspec.files import write_atomically
from schedspec.simulate.log_ticks import use_readable_log_ticks
from schedspec.simulate.metrics import RequestMetrics
from schedspec.simulate.simulator import SimulationResult
from schedspec.simulate.timeline import Kind

KIND_COLORS: dict[Kind, str] = {"prefill": "tab:blue", "decode": "tab:green", "spec": "tab:orange"}
WAIT_COLOR = "0.7"  # grey: not one of the work colours
BAR_HALF_HEIGHT = 0.4  # of a row, for iterations a request ran in
WAIT_HALF_HEIGHT = 0.2  # a thinner band, so a wait reads as not working in greyscale too
LABELLED_ROWS = 40  # up to this many requests, a row each, named; past it, packed lanes
LANE_GAP = 1e-9  # seconds: a lane takes a request that starts after the last one ended
# A prefill is one short iteration beside a decode of hundreds: drawn to scale over a run
# of seconds it is under a pixel, and every bar reads as decode. Short phases are drawn at
# least this share of the time axis wide, over the phase after them.
MIN_PHASE_SHARE = 0.004
SHORT_PHASES: tuple[Kind, ...] = ("prefill", "spec")
LEGEND_COLUMNS = 6  # a legend of more entries wraps onto another row
PANEL_HEIGHT = 2.2  # inches, for the KV and the queue panel
STRIP_HEIGHT = 1.1  # inches, for each config's iteration-time strip
MAX_STEP_BARS = 400  # above this many steps, a Gantt bar spans back-to-back steps
DPI = 100  # of a PNG, and of the Gantt's bars in an SVG (drawn as an image there)


# The same simulation draws the same bytes: SVG element ids are hashed with this salt
# (matplotlib's default salt is random per process) and no creation date is stamped.
SVG_HASH_SALT = "schedspec"
_METADATA: dict[str, dict[str, str | None]] = {"svg": {"Date": None}}


def save_figure(fig: Figure, out_dir: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    """Write the figure in each format, atomically, the same bytes for the same figure.

    The layout is computed once, by the first format's draw, and kept for the others:
    it is in figure fractions, the same for every format, and constrained layout
    measures every tick label again on each draw (a third of an SVG's time)."""
    paths = []
    engine = fig.get_layout_engine()
    try:
        for fmt in formats:
            path = out_dir / f"{stem}.{fmt}"
            drawn = io.BytesIO()
            with rc_context({"svg.hashsalt": SVG_HASH_SALT}):
                fig.savefig(drawn, format=fmt, dpi=DPI, metadata=_METADATA.get(fmt))
            fig.set_layout_engine("none")  # keeps the axes where the layout put them
            write_atomically(path, drawn.getvalue())
            paths.append(path)
    finally:
        fig.set_layout_engine(engine)
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


def wait_spans(result: SimulationResult) -> dict[str, list[tuple[float, float]]]:
    """request -> (start, width) of each time it waited in the queue: from its
    arrival to the first iteration that scheduled it, and from each preemption
    (at the start of the iteration that preempted it) to the next iteration that
    scheduled it. A wait still open when the steps end lasts to the last one's end."""
    spans: dict[str, list[tuple[float, float]]] = {rid: [] for rid in result.requests}
    waiting_since = {rid: t.arrival_time for rid, t in result.requests.items()}
    for step in result.steps:
        for entry in step.entries:
            since = waiting_since.pop(entry.request_id, None)
            if since is not None and step.start > since:
                spans[entry.request_id].append((since, step.start - since))
        for rid in step.preempted:
            waiting_since[rid] = step.start
    end = result.steps[-1].start + result.steps[-1].duration if result.steps else 0.0
    for rid, since in waiting_since.items():
        if end > since:
            spans[rid].append((since, end - since))
    return spans


def _boxes(
    spans: Sequence[tuple[float, float]], row: int, half_height: float
) -> list[list[tuple[float, float]]]:
    low, high = row - half_height, row + half_height
    return [[(x, low), (x + w, low), (x + w, high), (x, high)] for x, w in spans]


def legend_above(fig: Figure, ax: Axes) -> None:
    """ax's labelled artists as one row above every axes of fig (which must use
    constrained layout, which makes the room): inside the axes it would cover data."""
    handles, labels = ax.get_legend_handles_labels()
    columns = min(len(labels), LEGEND_COLUMNS)
    fig.legend(handles, labels, loc="outside upper center", ncols=columns, fontsize="small")


def _time_span(result: SimulationResult) -> float:
    """Seconds from the first arrival to the end of the last iteration."""
    if not result.steps:
        return 0.0
    first = min((t.arrival_time for t in result.requests.values()), default=0.0)
    last = result.steps[-1]
    return max(0.0, last.start + last.duration - first)


def lifetimes(
    result: SimulationResult,
    segments: dict[tuple[str, Kind], list[tuple[float, float]]],
    waits: dict[str, list[tuple[float, float]]],
) -> dict[str, tuple[float, float]]:
    """request -> (arrival, end of the last thing drawn for it): the span its lane holds."""
    ends = {rid: t.arrival_time for rid, t in result.requests.items()}
    drawn = [(rid, spans) for (rid, _), spans in segments.items()] + list(waits.items())
    for rid, spans in drawn:
        for start, width in spans:
            ends[rid] = max(ends[rid], start + width)
    return {rid: (t.arrival_time, ends[rid]) for rid, t in result.requests.items()}


def pack_lanes(spans: dict[str, tuple[float, float]]) -> dict[str, int]:
    """request -> lane, first fit in arrival order: a request goes to the lowest lane
    whose last request ended before it arrived, so lanes are as few as the most
    requests alive at once (400 requests at 20/s need a few dozen, not 400 rows)."""
    lane_ends: list[float] = []
    lanes: dict[str, int] = {}
    for rid, (start, end) in sorted(spans.items(), key=lambda item: item[1]):
        lane = next((i for i, e in enumerate(lane_ends) if e + LANE_GAP < start), None)
        if lane is None:
            lane = len(lane_ends)
            lane_ends.append(end)
        lane_ends[lane] = end
        lanes[rid] = lane
    return lanes


def gantt_figure(result: SimulationResult) -> Figure:
    """Which request ran in each iteration, and as what; grey bands are waits in
    the queue (before admission and after a preemption), red ticks preemptions.

    Up to LABELLED_ROWS requests get a named row each, in arrival order. More are packed
    into lanes (pack_lanes): a row each would leave 400 requests a few pixels apiece,
    and their bars a single smear of the decode colour; a white edge marks where one
    request's bar ends and the next one's begins in a lane."""
    # Short runs show every iteration as its own bar (white edges mark the steps).
    merge = len(result.steps) > MAX_STEP_BARS
    segments = gantt_segments(result, merge)
    spans_waiting = wait_spans(result)
    packed = len(result.requests) > LABELLED_ROWS
    if packed:
        rows = pack_lanes(lifetimes(result, segments, spans_waiting))
    else:
        rows = {rid: i for i, rid in enumerate(result.requests)}
    num_rows = max(rows.values(), default=-1) + 1
    height = max(3.0, min(0.22 * num_rows + 1.8, 14.0))
    fig = Figure(figsize=(11, height), layout="constrained")
    ax = fig.add_subplot()
    waits = [
        box
        for rid, spans in spans_waiting.items()
        for box in _boxes(spans, rows[rid], WAIT_HALF_HEIGHT)
    ]
    if waits:
        ax.add_collection(
            PolyCollection(
                waits,
                facecolor=WAIT_COLOR,
                linewidth=0,
                label="waiting in queue",
                rasterized=True,
            )
        )
    # One collection per kind: a collection per request would cost seconds to draw.
    # Rasterized: in an SVG, the bars (thousands: SGLang's decodes sit out every prefill
    # step, so theirs do not merge) are one image at the PNG's resolution, not one
    # element each, which took seconds to write and to open. Axes, text and the
    # legend stay vector; a PNG is drawn the same either way.
    boxes: dict[Kind, list[list[tuple[float, float]]]] = {}
    least = MIN_PHASE_SHARE * _time_span(result)
    for (rid, kind), bars in segments.items():
        if kind in SHORT_PHASES:
            bars = [(start, max(width, least)) for start, width in bars]
        boxes.setdefault(kind, []).extend(_boxes(bars, rows[rid], BAR_HALF_HEIGHT))
    for kind, verts in boxes.items():
        ax.add_collection(
            PolyCollection(
                verts,
                facecolor=KIND_COLORS[kind],
                edgecolor="white",
                linewidth=0.4 if packed or not merge else 0,
                label=kind,
                zorder=2.5 if kind in SHORT_PHASES else 2,  # over the decode they widen onto
                rasterized=True,
            )
        )
    ax.autoscale_view()
    preempted = [(s.start, rows[rid]) for s in result.steps for rid in s.preempted]
    if preempted:
        xs, ys = zip(*preempted, strict=True)
        ax.scatter(xs, ys, marker="|", color="tab:red", s=80, label="preempted", zorder=3)
    if not packed:
        ax.set_yticks(range(num_rows), list(rows))
    ax.set_ylim(num_rows - 0.5, -0.5)  # first arrival on top
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel(
        f"lane ({len(rows)} requests, packed by lifetime)" if packed else "request (arrival order)"
    )
    ax.set_title(f"{result.name}: what each request did in each iteration")
    legend_above(fig, ax)
    return fig


def config_color(index: int) -> str:
    """The colour of the index-th config in every panel that tells configs apart."""
    return f"C{index}"


def kv_queue_figure(results: Sequence[SimulationResult]) -> Figure:
    """KV usage and the waiting queue after each iteration, one line per config,
    then the iteration time, one strip per config on a shared scale (a long step
    shows as a spike)."""
    heights = [PANEL_HEIGHT, PANEL_HEIGHT] + [STRIP_HEIGHT] * len(results)
    fig = Figure(figsize=(10, sum(heights) + 1.0), layout="constrained")  # + title, legend, axis
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights)
    kv_ax = fig.add_subplot(grid[0])
    queue_ax = fig.add_subplot(grid[1], sharex=kv_ax)
    strips: list[Axes] = []
    for i, result in enumerate(results):
        strips.append(
            fig.add_subplot(grid[2 + i], sharex=kv_ax, sharey=strips[0] if strips else None)
        )
        color = config_color(i)
        ends = [s.start + s.duration for s in result.steps]
        for ax, values in (
            (kv_ax, [100 * s.kv_usage for s in result.steps]),
            (queue_ax, [s.num_waiting for s in result.steps]),
        ):
            ax.step(ends, values, where="post", color=color, label=result.name)
        # An iteration time holds over the interval that ends with its step.
        strips[i].step(
            ends,
            [1000 * s.duration for s in result.steps],
            where="pre",
            color=color,
            label=result.name,
        )
        strips[i].set_ylim(bottom=0)  # heights compare as lengths
        strips[i].set_title(f"iteration time: {result.name}", loc="left", fontsize="small")
        strips[i].set_ylabel("ms")
    for ax in (kv_ax, queue_ax, *strips[:-1]):
        ax.tick_params(labelbottom=False)
    kv_ax.set_ylabel("KV blocks in use (%)")
    kv_ax.set_ylim(0, 105)
    queue_ax.set_ylabel("waiting requests")
    (strips[-1] if strips else queue_ax).set_xlabel("simulated time (s)")
    kv_ax.set_title("KV usage, waiting queue and iteration time")
    legend_above(fig, kv_ax)
    return fig


def _cdf(ax: Axes, values: Sequence[float], label: str, color: str) -> None:
    ordered = sorted(v * 1000 for v in values)
    n = len(ordered)
    ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label, color=color)


def latency_cdf_figure(runs: Sequence[tuple[SimulationResult, Sequence[RequestMetrics]]]) -> Figure:
    """CDFs of TTFT, TPOT and the worst gap between tokens, one line per config."""
    fig = Figure(figsize=(14, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = (
        ("TTFT (ms)", lambda m: m.ttft),
        ("TPOT (ms)", lambda m: m.tpot),
        ("worst gap between tokens (ms)", lambda m: m.worst_gap),
    )
    for ax, (label, metric) in zip(axes, panels, strict=True):
        for i, (result, metrics) in enumerate(runs):
            values = [v for v in map(metric, metrics) if v is not None]
            if values:
                _cdf(ax, values, result.name, config_color(i))
        ax.set_xlabel(label)
        ax.set_xscale("log")
        use_readable_log_ticks(ax.xaxis)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    legend_above(fig, axes[0])
    return fig
