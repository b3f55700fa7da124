"""Where a parallel run's chunks go: forked local processes, or Ray tasks on a cluster.

A BackendChoice (properties/run_plan.py) names it: --ray absent, `workers` forked local
processes; --ray, a local Ray cluster started for the run ("local") or the one at an
address, with `workers` tasks at a time (by default the cluster's CPUs). Every parallel
run goes through open_backend: `check` and `diff` (campaign/plan.py) and swarm mode
(campaign/swarm_chunks.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from schedspec.campaign.bounds import check_fan_out
from schedspec.campaign.ray_cluster import RayClusterError, ray_cluster, require_ray
from schedspec.campaign.workers import ChunkRunner, ForkedWorkers
from schedspec.properties.failure_report import plural
from schedspec.properties.run_plan import BackendChoice, RunPlanError


@dataclass(frozen=True)
class Backend:
    """A runner, open, and how to name where it runs."""

    runner: ChunkRunner
    name: str  # "2 local processes", "a local Ray cluster (2 CPUs), 2 workers", ...
    workers: int
    on_ray: bool


def ran_on(backend: Backend, chunks: int) -> str:
    """Where a finished run ran, as it ran: the backend's name, and how many of its
    workers had a chunk where fewer did than were asked for (`--workers 8 --examples 3`
    starts 3 processes, not 8)."""
    if chunks >= backend.workers:
        return backend.name
    return f"{backend.name} ({plural(chunks, 'worker')} used: one a chunk)"


def require_backend(choice: BackendChoice) -> None:
    """What the backend needs, checked before anything runs: a run on Ray needs Ray
    (MissingDependencyError, saying what brings it), and --workers stays within its
    bound (campaign/bounds.py; RunPlanError naming the bound)."""
    check_fan_out(choice)
    if choice.ray is not None:
        require_ray()


@contextmanager
def open_backend(choice: BackendChoice) -> Iterator[Backend]:
    """The runner the choice names, open for the duration. A cluster at an address that
    does not answer (or cannot be joined) is the request's fault: RunPlanError on "ray";
    a local cluster that does not start is not, and its RayClusterError goes on."""
    if choice.ray is None:
        workers = choice.workers or 1
        name = f"{workers} local process" + ("es" if workers != 1 else "")
        yield Backend(ForkedWorkers(workers), name, workers, on_ray=False)
        return
    address = None if choice.ray == "local" else choice.ray
    try:
        with ray_cluster(address, choice.workers) as cluster:
            # Only now: importing Ray's runner before the cluster is up would fix its address.
            from schedspec.campaign.ray_workers import RayWorkers

            workers = choice.workers or cluster.cpus
            name = f"{cluster.describe()}, {plural(workers, 'worker')}"
            yield Backend(RayWorkers(workers), name, workers, on_ray=True)
    except RayClusterError as err:
        if address is None:
            raise
        raise RunPlanError("ray", str(err)) from err
