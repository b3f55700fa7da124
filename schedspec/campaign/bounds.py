"""The most a run may fan out to, named and derived from the machine or stated here, so
that a typo (`--workers 1000000000`) is a usage error naming the option and its bound
rather than a fork bomb, a full process table or a TypeError deep in torch.

- Local workers (forked processes, or a local Ray cluster of that many CPUs) run on this
  machine: at most WORKERS_PER_CORE per usable core (never below MIN_WORKERS_BOUND, so
  that a small CI runner can still try a few), and at most one per WORKER_MEMORY_BYTES of
  its memory (a worker's peak in a long campaign: docs/CAMPAIGNS.md).
- Workers on a Ray cluster at an address run there, whose size schedspec learns only
  once joined: at most MAX_CLUSTER_WORKERS tasks at a time.
- Swarm mode's instances share one process's tensors: at most MAX_SWARM_INSTANCES.
- --duration: at most a week (cli/options.MAX_DURATION_SECONDS).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from schedspec.properties.run_plan import BackendChoice, RunPlanError

WORKERS_PER_CORE = 4
MIN_WORKERS_BOUND = 8
WORKER_MEMORY_BYTES = 640 * 2**20
MAX_CLUSTER_WORKERS = 4096
MAX_SWARM_INSTANCES = 65_536


@dataclass(frozen=True)
class Bound:
    """The most an option may ask for, and why that much (for the error message)."""

    field: str  # the RunRequest field, so usage_error names its flag
    most: int
    reason: str

    def check(self, value: int) -> None:
        """RunPlanError naming the option, the bound and its reason, above it."""
        if value > self.most:
            shown = f"{value:,}" if value < 10**15 else f"a {len(str(value))}-digit number"
            raise RunPlanError(self.field, f"at most {self.most:,} ({self.reason}), got {shown}")


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory() -> int | None:
    """This machine's memory in bytes, where the system says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def local_workers_bound() -> Bound:
    """The most workers this machine runs: by its cores, and by its memory."""
    cores = usable_cores()
    by_cores = max(MIN_WORKERS_BOUND, WORKERS_PER_CORE * cores)
    reason = f"{WORKERS_PER_CORE} per core on this machine's {cores} cores"
    memory = machine_memory()
    if memory is not None and memory // WORKER_MEMORY_BYTES < by_cores:
        gib = memory / 2**30
        return Bound(
            "workers",
            max(1, memory // WORKER_MEMORY_BYTES),
            f"one per {WORKER_MEMORY_BYTES // 2**20} MiB of this machine's {gib:.1f} GiB",
        )
    return Bound("workers", by_cores, reason)


def workers_bound(choice: BackendChoice) -> Bound:
    """The bound on --workers for the backend chosen."""
    if choice.ray is None or choice.ray == "local":
        return local_workers_bound()
    return Bound("workers", MAX_CLUSTER_WORKERS, "tasks at a time on a Ray cluster")


def check_fan_out(choice: BackendChoice) -> None:
    """RunPlanError if --workers asks for more than its bound."""
    if choice.workers is not None:
        workers_bound(choice).check(choice.workers)


def check_instances(instances: int) -> None:
    """RunPlanError if swarm mode's --instances asks for more than its bound."""
    Bound("instances", MAX_SWARM_INSTANCES, "instances stepped at once in one process").check(
        instances
    )
