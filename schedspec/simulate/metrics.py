"""Latency metrics per request and their summary per run (p50, p90, p99).

TTFT: arrival to the end of the step that emitted the first token.
TPOT: mean time per output token after the first, (last - first) / (n - 1).
Worst gap: the longest wait between two steps that emitted tokens for the
request (a stall that a mean TPOT hides; the time-between-tokens tail).
E2E: arrival to the end of the step that finished it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from schedspec.simulate.simulator import RequestTimeline, SimulationResult


@dataclass(frozen=True)
class RequestMetrics:
    request_id: str
    arrival_time: float
    ttft: float  # s
    tpot: float | None  # s; None with a single output token
    worst_gap: float | None  # s; None with a single emitting step
    e2e: float  # s
    num_output_tokens: int
    num_preemptions: int
    recomputed_tokens: int
    finish_status: str


def request_metrics(t: RequestTimeline) -> RequestMetrics:
    if t.finish_time is None or t.finish_status is None or not t.emit_times:
        raise ValueError(f"request {t.request_id!r} did not finish")
    n = t.num_output_tokens
    first, last = t.emit_times[0], t.emit_times[-1]
    gaps = [b - a for a, b in zip(t.emit_times, t.emit_times[1:], strict=False)]
    return RequestMetrics(
        request_id=t.request_id,
        arrival_time=t.arrival_time,
        ttft=first - t.arrival_time,
        tpot=(last - first) / (n - 1) if n > 1 else None,
        worst_gap=max(gaps) if gaps else None,
        e2e=t.finish_time - t.arrival_time,
        num_output_tokens=n,
        num_preemptions=t.num_preemptions,
        recomputed_tokens=t.recomputed_tokens,
        finish_status=t.finish_status,
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Percentiles:
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        return cls(
            percentile(values, 50),
            percentile(values, 90),
            percentile(values, 99),
            max(values) if values else None,
        )


@dataclass(frozen=True)
class Summary:
    name: str
    num_requests: int
    steps: int
    makespan_s: float  # first arrival to last finish
    output_tokens_per_s: float
    requests_per_s: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    worst_gap_s: Percentiles
    e2e_s: Percentiles
    preemptions: int
    recomputed_tokens: int
    prefix_cache_hit_rate: float | None  # None when prefix caching is off
    kv_usage_mean: float  # weighted by step duration
    kv_usage_peak: float
    waiting_peak: int


def summarize(result: SimulationResult, metrics: Sequence[RequestMetrics]) -> Summary:
    steps = result.steps
    first = min(m.arrival_time for m in metrics)
    makespan = max(m.arrival_time + m.e2e for m in metrics) - first
    busy = sum(s.duration for s in steps)
    queried = sum(t.queried_tokens for t in result.requests.values())
    cached = sum(t.cached_tokens for t in result.requests.values())
    caching = result.config.enable_prefix_caching
    return Summary(
        name=result.name,
        num_requests=len(metrics),
        steps=len(steps),
        makespan_s=makespan,
        output_tokens_per_s=sum(m.num_output_tokens for m in metrics) / makespan,
        requests_per_s=len(metrics) / makespan,
        ttft_s=Percentiles.of([m.ttft for m in metrics]),
        tpot_s=Percentiles.of([m.tpot for m in metrics if m.tpot is not None]),
        worst_gap_s=Percentiles.of([m.worst_gap for m in metrics if m.worst_gap is not None]),
        e2e_s=Percentiles.of([m.e2e for m in metrics]),
        preemptions=sum(m.num_preemptions for m in metrics),
        recomputed_tokens=sum(m.recomputed_tokens for m in metrics),
        prefix_cache_hit_rate=cached / queried if caching and queried else None,
        kv_usage_mean=sum(s.kv_usage * s.duration for s in steps) / busy if busy else 0.0,
        kv_usage_peak=max((s.kv_usage for s in steps), default=0.0),
        waiting_peak=max((s.num_waiting for s in steps), default=0),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def table_rows(summary: Summary) -> list[tuple[str, str]]:
    """(label, value) rows: one column of the summary table."""
    rows = [("requests", str(summary.num_requests)), ("steps", str(summary.steps))]
    for label, p in (
        ("TTFT", summary.ttft_s),
        ("TPOT", summary.tpot_s),
        ("worst gap", summary.worst_gap_s),
        ("E2E", summary.e2e_s),
    ):
        rows += [
            (f"{label} p50 (ms)", _ms(p.p50)),
            (f"{label} p90 (ms)", _ms(p.p90)),
            (f"{label} p99 (ms)", _ms(p.p99)),
        ]
    return [
        *rows,
        ("makespan (s)", f"{summary.makespan_s:.2f}"),
        ("output tokens/s", f"{summary.output_tokens_per_s:.0f}"),
        ("requests/s", f"{summary.requests_per_s:.2f}"),
        ("preemptions", str(summary.preemptions)),
        ("recomputed tokens", str(summary.recomputed_tokens)),
        ("prefix-cache hit rate", _rate(summary.prefix_cache_hit_rate)),
        ("KV usage mean / peak", f"{summary.kv_usage_mean:.0%} / {summary.kv_usage_peak:.0%}"),
        ("waiting peak", str(summary.waiting_peak)),
    ]


def format_table(summaries: Sequence[Summary]) -> list[str]:
    """Metrics down, one column per config."""
    columns = [table_rows(s) for s in summaries]
    labels = [label for label, _ in columns[0]]
    width = max(len(label) for label in labels)
    widths = [
        max(len(s.name), *(len(v) for _, v in col))
        for s, col in zip(summaries, columns, strict=True)
    ]
    header = " " * width + "".join(
        f"  {s.name:>{w}}" for s, w in zip(summaries, widths, strict=True)
    )
    lines = [header]
    for i, label in enumerate(labels):
        cells = "".join(f"  {col[i][1]:>{w}}" for col, w in zip(columns, widths, strict=True))
        lines.append(f"{label:<{width}}{cells}")
    return lines


def summary_document(
    result: SimulationResult, summary: Summary, metrics: Sequence[RequestMetrics]
) -> dict[str, object]:
    """One config's run as JSON-ready data: config, cost model, summary, per request."""
    return {
        "name": result.name,
        "config": dataclasses.asdict(result.config),
        "cost_model": result.cost_model.as_dict(),
        "summary": dataclasses.asdict(summary),
        "requests": [dataclasses.asdict(m) for m in metrics],
    }
