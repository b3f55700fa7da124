"""Run one workload under several configs and gather what the report needs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from schedspec.engines.errors import EngineHalt
from schedspec.engines.protocol import EngineFactory
from schedspec.simulate.configs import NamedConfig
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.metrics import (
    RequestMetrics,
    Summary,
    request_metrics,
    summarize,
    summary_document,
)
from schedspec.simulate.simulator import SimulationResult, simulate
from schedspec.simulate.workloads import SimRequest

if TYPE_CHECKING:  # matplotlib is imported only when pictures are drawn
    from matplotlib.figure import Figure

FORMATS = ("png", "svg")
DEFAULT_OUT = Path("simulate-out")  # where `schedspec simulate` writes; .gitignore has it

# Told (config name, requests finished in that config) as a simulation advances.
ProgressCallback = Callable[[str, int], None]


@dataclass(frozen=True)
class ConfigRun:
    result: SimulationResult
    metrics: list[RequestMetrics]  # in arrival order
    summary: Summary


def run_configs(
    configs: Sequence[NamedConfig],
    workload: Iterable[SimRequest],
    factory: EngineFactory,
    cost_model: CostModel,
    seed: int,
    max_steps: int,
    progress: ProgressCallback | None = None,
) -> list[ConfigRun]:
    runs = []
    for named in configs:
        on_step = None if progress is None else functools.partial(progress, named.name)
        try:
            result = simulate(
                named.name, factory, named.config, workload, cost_model, seed, max_steps, on_step
            )
        except (Exception, EngineHalt) as err:
            err.add_note(f"simulating config {named.name!r}")
            raise
        metrics = [request_metrics(t) for t in result.requests.values()]
        runs.append(ConfigRun(result, metrics, summarize(result, metrics)))
    return runs


def pictures(runs: Sequence[ConfigRun]) -> list[tuple[str, Callable[[], Figure]]]:
    """(file stem, what draws it) for every picture: a Gantt chart per config; KV/queue
    and latency CDFs overlaying all configs. Drawn one at a time, as they are written,
    so a large comparison never holds every figure at once."""
    # Imported here: a simulation without pictures must not need matplotlib.
    from schedspec.simulate.plots import gantt_figure, kv_queue_figure, latency_cdf_figure

    listed: list[tuple[str, Callable[[], Figure]]] = [
        (f"gantt-{run.result.name}", functools.partial(gantt_figure, run.result)) for run in runs
    ]
    results = [r.result for r in runs]
    listed.append(("kv-queue", functools.partial(kv_queue_figure, results)))
    cdf_runs = [(r.result, r.metrics) for r in runs]
    listed.append(("latency-cdf", functools.partial(latency_cdf_figure, cdf_runs)))
    return listed


def write_plots(runs: Sequence[ConfigRun], out_dir: Path, formats: Sequence[str]) -> list[Path]:
    """Every picture (pictures()) in each format."""
    from schedspec.simulate.plots import save_figure

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, draw in pictures(runs):
        paths += save_figure(draw(), out_dir, stem, formats)
    return paths


def runs_document(runs: Sequence[ConfigRun], seed: int, workload: str) -> dict[str, object]:
    return {
        "workload": workload,
        "seed": seed,
        "runs": [summary_document(r.result, r.summary, r.metrics) for r in runs],
    }
