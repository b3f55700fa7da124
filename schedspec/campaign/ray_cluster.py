"""A Ray cluster for the duration of a run: a running one, or a local one started here.

ray_cluster() connects for the duration of a run. With no address it starts a local
cluster sized for this machine and keeps it to itself: every Ray process listens on
loopback only (Ray takes the loopback address for the node's when it believes clusters
are off, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which it reads once, when it is first
imported: so this module imports Ray only once that is set), in a temporary directory of
its own that is removed afterwards, with a small object store (chunks hand back
kilobytes) and its logs rotated at a few MB. Its processes do not see Ctrl-C (a
terminal sends it to the whole process group; here only the driver handles it, and
shuts the cluster down), and all of them are gone when the context exits, however it
exits. Every node of a cluster must have schedspec and the engines under test
installed; a local cluster's workers get this process's import path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from schedspec.campaign import ray_reaper
from schedspec.engines.dependencies import RAY, import_required, require
from schedspec.environment import environment_set

# A local cluster's object store (Ray's least is 75 MiB): results are a chunk's counts
# and at most one trace, kilobytes each.
LOCAL_OBJECT_STORE_BYTES = 80 * 2**20
# Each Ray process's log file is rotated past this size, keeping one old file.
LOCAL_LOG_BYTES = 4 * 2**20
LOCAL_LOG_BACKUPS = 1
# Ray takes the node's address to be loopback when it believes it runs without a
# cluster: read when Ray is first imported, and by every process it starts.
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class RayClusterError(RuntimeError):
    """The cluster could not be started or joined as schedspec needs it."""


@dataclass(frozen=True)
class RayCluster:
    """The cluster a run is connected to."""

    address: str | None  # None: the local one this process started
    cpus: int  # CPUs the cluster offers: the default number of workers

    def describe(self) -> str:
        where = "a local Ray cluster" if self.address is None else f"Ray at {self.address}"
        return f"{where} ({self.cpus} CPUs)"


def require_ray() -> None:
    """MissingDependencyError, saying what brings Ray, where it is not installed."""
    require("--ray", RAY)


@contextmanager
def ray_cluster(address: str | None, cpus: int | None = None) -> Iterator[RayCluster]:
    """Connected to Ray for the duration: the cluster at `address`, or (None) a local one
    of `cpus` CPUs [default: this machine's], started here and shut down on exit."""
    require_ray()
    if address is None and "ray" not in sys.modules:
        os.environ.update(LOOPBACK_ONLY)  # before Ray's first import (the module docstring)
    ray = import_required("--ray", RAY)  # a broken install: a usage error, not exit 6

    if ray.is_initialized():
        raise RayClusterError("Ray is already initialized in this process")
    if address is not None:
        with _signal_handlers_kept():
            _join(address)
        try:
            yield RayCluster(address, max(1, int(ray.cluster_resources().get("CPU", 1))))
        finally:
            ray.shutdown()
        return
    temp_dir = tempfile.mkdtemp(prefix="schedspec-ray-")
    try:
        # The mark stays in this process's environment while the cluster lives: whatever
        # Ray starts from here later (not only during ray.init) is the reaper's too.
        with _reaper(temp_dir) as marker, environment_set(marker):
            with _signal_handlers_kept():
                _start_local(cpus or os.cpu_count() or 1, temp_dir)
            try:
                yield RayCluster(None, max(1, int(ray.cluster_resources().get("CPU", 1))))
            finally:
                ray.shutdown()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


# How long the driver waits for the reaper to sweep after a shutdown (seconds): its
# grace period and a few scans of /proc.
REAPER_WAIT_SECONDS = 15.0


@contextmanager
def _reaper(temp_dir: str) -> Iterator[dict[str, str]]:
    """The reaper (campaign/ray_reaper.py) of a local cluster for the duration: yields the
    environment that marks the cluster's processes; on exit, once the cluster is shut
    down, it ends whatever of them is left. Nothing on a system without /proc."""
    if not Path("/proc").is_dir():
        yield {}
        return
    token = uuid.uuid4().hex
    reaper = subprocess.Popen(
        [sys.executable, ray_reaper.__file__, token, temp_dir, str(os.getpid())],
        stdin=subprocess.PIPE,
        start_new_session=True,  # out of reach of the terminal's Ctrl-C
    )
    assert reaper.stdin is not None
    try:
        yield {ray_reaper.RUN_VARIABLE: token}
    finally:
        reaper.stdin.close()  # it sweeps now (or when this process is gone)
        with contextlib.suppress(subprocess.TimeoutExpired):  # past that, it goes on alone
            reaper.wait(REAPER_WAIT_SECONDS)


def _start_local(cpus: int, temp_dir: str) -> None:
    import ray

    import_path = os.pathsep.join(p for p in sys.path if p)
    environment = {
        **LOOPBACK_ONLY,
        "RAY_ROTATION_MAX_BYTES": str(LOCAL_LOG_BYTES),
        "RAY_ROTATION_BACKUP_COUNT": str(LOCAL_LOG_BACKUPS),
        # The workers import schedspec and the engines as this process does.
        "PYTHONPATH": import_path,
    }
    with environment_set(environment), _interrupts_blocked():
        # Processes started now inherit the blocked Ctrl-C (a terminal sends it to the
        # whole process group): the driver alone handles it, and shuts them down.
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            log_to_driver=False,
            logging_level=logging.WARNING,
            namespace="schedspec",
            _temp_dir=temp_dir,
        )
    node = ray.util.get_node_ip_address()
    if not node.startswith("127.") and node != "::1":
        ray.shutdown()
        raise RayClusterError(
            f"the local Ray cluster took {node} for its address, not loopback: Ray was "
            "imported before schedspec could keep it on loopback (set "
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before it is)"
        )


# How long joining a cluster waits for its address to answer before it is refused (Ray's
# own client retries an unreachable address for minutes).
CONNECT_TIMEOUT_SECONDS = 10.0


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """RayClusterError unless something accepts a TCP connection at `address` (HOST:PORT or
    ray://HOST:PORT; `auto`, which Ray resolves from this machine's running cluster, is
    left to Ray)."""
    if address == "auto":
        return
    where = address.removeprefix("ray://")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise RayClusterError(
            f"the Ray address must be auto, HOST:PORT or ray://HOST:PORT, got {address!r}"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise RayClusterError(f"no Ray cluster answers at {address}: {reason}") from None


def _join(address: str) -> None:
    import ray

    check_reachable(address)
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            logging_level=logging.WARNING,
            namespace="schedspec",
        )
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise RayClusterError(f"could not join the Ray cluster at {address}: {err}") from err


# The signals whose handlers this process keeps through ray.init: Ray's core installs
# its own for SIGTERM in the driver (it logs and exits 1), which would end a run without
# its report; the command line's (interrupts.py) turn them into an interrupt.
KEPT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """The Python handlers of KEPT_SIGNALS installed again after the body (Python still
    believes them installed when native code has replaced them, so set them anew)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.getsignal(signum) for signum in KEPT_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                signal.signal(signum, handler)


@contextmanager
def _interrupts_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread for the duration: processes started meanwhile
    inherit the mask (across exec too), and this one gets a pending Ctrl-C after."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
