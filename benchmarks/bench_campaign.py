"""Campaign throughput: checked steps per second for 1, 2, ... workers, on local processes
and on a local Ray cluster, in one run, with the scaling efficiency of each.

Each point is a campaign of `schedspec check` on the reference (the suite's own
configs, seed 1) for a fixed wall time (--seconds), run through the same code as the
command line (parallel.run_campaign over timed_chunks, NamedEngines as the work): its
rate is the steps checked by the chunks over the wall time, counting the chunks' start
and their partial last chunk. Scaling efficiency ("scaling") is rate(n) / (n * rate(1))
on the same backend; "ray/local" divides the two backends' rates at the same n.

Wall-clock scaling needs idle cores: on a machine other work shares, the columns that
still hold are the CPU ones: the CPU seconds the workers spent (forked: this process's
reaped children; Ray: its worker processes, read from /proc), the steps checked per
worker CPU second (what a step costs on each backend, and whether it grows with n; on
Ray the progress actor's CPU counts as the workers'), the
driver's own CPU seconds (merging, progress, Ray's client), and the load average.

The Ray cluster is started once (its start time is printed apart) and its workers warmed
up (one example per worker: Ray starts a worker process, which imports schedspec, on
its first task) before each Ray point, so the rates are those of a running campaign;
forked workers need no warm-up (fork copies the imported driver). Needs the ray extra.

    .venv/bin/python benchmarks/bench_campaign.py                  # 1 .. CPUs workers, 20 s each
    .venv/bin/python benchmarks/bench_campaign.py --quick          # a smoke run (5 s points)
    .venv/bin/python benchmarks/bench_campaign.py --workers 1,2,4,8 --seconds 60

The numbers are for reading, never for asserting: nothing here checks a time.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from schedspec.adapters.reference import reference_engine
from schedspec.campaign.chunk_work import NamedEngines
from schedspec.campaign.parallel import run_campaign, timed_chunks
from schedspec.campaign.workers import ChunkRunner, ForkedWorkers
from schedspec.properties.harness import SingleEngine
from schedspec.properties.suite import Chunk, SuiteSettings

RECIPE = NamedEngines("check", ("reference",), "vllm-v1")
SEED = 1


@dataclass(frozen=True)
class Point:
    backend: str
    workers: int
    steps: int
    examples: int
    seconds: float  # wall time
    worker_cpu: float  # CPU seconds the worker processes spent
    driver_cpu: float  # CPU seconds this process spent
    load: float  # the 1-minute load average at the end

    @property
    def rate(self) -> float:
        return self.steps / self.seconds

    @property
    def cpu_rate(self) -> float:
        """Steps per CPU second of the workers: what the work costs, whatever else the
        machine runs meanwhile."""
        return self.steps / self.worker_cpu if self.worker_cpu else 0.0


def ray_worker_cpu() -> dict[int, float]:
    """CPU seconds so far of each Ray worker process on this machine (`ray::` titles but
    its agents), from /proc: they are the raylet's children, not this process's."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if title.startswith("ray::") and "Agent" not in title:
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(backend: str, runner: ChunkRunner, workers: int, seconds: float) -> Point:
    """A campaign of `seconds` on the runner: its steps and examples over its wall time,
    and the CPU time its workers and the driver spent."""
    deadline = time.time() + seconds
    settings = SuiteSettings(examples=1, seed=SEED, deadline=deadline)
    local = SingleEngine(reference_engine, RECIPE.profile)
    chunks = timed_chunks(SEED, deadline, parts=workers)
    on_ray = backend == "ray"
    ray_before = ray_worker_cpu() if on_ray else {}
    forked_before, driver_before = children_cpu(), own_cpu()
    started = time.perf_counter()
    campaign = run_campaign(RECIPE, local, settings, chunks, runner, keep_going=True)
    wall = time.perf_counter() - started
    if on_ray:
        after = ray_worker_cpu()
        worker_cpu = sum(cpu - ray_before.get(pid, 0.0) for pid, cpu in after.items())
    else:
        worker_cpu = children_cpu() - forked_before
    result = campaign.result
    assert result.passed, f"the reference failed on {backend}: {campaign.findings}"
    return Point(
        backend,
        workers,
        result.stats.steps,
        result.examples,
        wall,
        worker_cpu,
        own_cpu() - driver_before,
        os.getloadavg()[0],
    )


def warm_up(runner: ChunkRunner, workers: int) -> None:
    """One example per worker, so each Ray worker process is started and has imported."""
    settings = SuiteSettings(examples=1, seed=SEED)
    local = SingleEngine(reference_engine, RECIPE.profile)
    chunks = [Chunk(i, SEED + i, 1) for i in range(workers)]
    run_campaign(RECIPE, local, settings, chunks, runner, keep_going=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workers",
        default=None,
        help="comma-separated worker counts [default: 1 .. this machine's CPUs]",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="wall time of each point")
    parser.add_argument("--quick", action="store_true", help="5 s points, 1 and 2 workers")
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    counts = (
        [int(n) for n in args.workers.split(",")]
        if args.workers
        else ([1, 2] if args.quick else list(range(1, cpus + 1)))
    )
    seconds = 5.0 if args.quick else args.seconds
    print(f"{platform.processor() or platform.machine()}, {cpus} CPUs; {seconds:g} s a point")
    points = [measure("local", ForkedWorkers(n), n, seconds) for n in counts]

    from schedspec.campaign.ray_cluster import ray_cluster

    started = time.perf_counter()
    with ray_cluster(None, max(counts)) as cluster:
        print(f"{cluster.describe()} started in {time.perf_counter() - started:.1f} s")
        from schedspec.campaign.ray_workers import RayWorkers

        for n in counts:
            warm_up(RayWorkers(n), n)
            points.append(measure("ray", RayWorkers(n), n, seconds))

    print(
        f"{'backend':>7} {'workers':>7} {'examples':>8} {'steps':>8} {'steps/s':>8} "
        f"{'scaling':>7} {'ray/local':>9} {'worker CPU s':>12} {'steps/CPU s':>11} "
        f"{'driver CPU s':>12} {'load':>5}"
    )
    single = {p.backend: p.rate for p in points if p.workers == counts[0]}
    local_rate = {p.workers: p.rate for p in points if p.backend == "local"}
    for point in points:
        efficiency = point.rate / (point.workers / counts[0] * single[point.backend])
        versus = point.rate / local_rate[point.workers]
        print(
            f"{point.backend:>7} {point.workers:7d} {point.examples:8d} {point.steps:8d} "
            f"{point.rate:8,.0f} {efficiency:7.0%} {versus:9.2f} {point.worker_cpu:12.1f} "
            f"{point.cpu_rate:11,.0f} {point.driver_cpu:12.2f} {point.load:5.1f}"
        )


if __name__ == "__main__":
    main()
