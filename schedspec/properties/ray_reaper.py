"""The reaper of a local Ray cluster: ends every process the cluster started once the
driver is done with it, or gone.

ray_cluster.py starts this file as a script (it imports nothing of schedspec), in a
session of its own, before the cluster, with a token that every process of the cluster
inherits in its environment (RUN_VARIABLE), and a pipe on its standard input. When the
pipe closes (the driver closed it after shutting the cluster down, or the driver is gone,
even killed with SIGKILL, which nothing in it can handle), the reaper sends SIGTERM to
every process with the token, SIGKILL to those still there after a grace period, and
removes the cluster's temporary directory. Ray ends its own head processes and workers
with a driver that is killed, but not its agents (seen with Ray 2.58: the dashboard and
runtime-env agents outlived a SIGKILLed driver by minutes).

Linux only (it reads /proc); ray_cluster.py starts it only there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

# The variable that marks the processes of one local cluster: its value is the run's token.
RUN_VARIABLE = "SCHEDSPEC_RAY_RUN"
# How long the processes get to end on SIGTERM before SIGKILL (seconds).
GRACE_SECONDS = 2.0
POLL_SECONDS = 0.1
# The reaper sweeps again until no marked process has been seen for QUIET_SECONDS (a
# raylet that is dying may still start an agent: seen on a loaded machine), for at most
# SWEEP_SECONDS.
QUIET_SECONDS = 2.0
SWEEP_SECONDS = 30.0


def marked_processes(token: str, spared: frozenset[int] = frozenset()) -> list[int]:
    """The live processes (but this one and the `spared`) whose environment holds
    RUN_VARIABLE=token."""
    needle = f"{RUN_VARIABLE}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared | {os.getpid()}:
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if needle in environment.split(b"\0"):
            found.append(int(entry.name))
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def sweep(token: str, spared: frozenset[int] = frozenset()) -> list[int]:
    """End every process marked with `token` but the `spared`: SIGTERM, then SIGKILL after
    GRACE_SECONDS; the ones that were found."""
    found = marked_processes(token, spared)
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    left = found
    while left and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        left = marked_processes(token, spared)
    _signal_all(left, signal.SIGKILL)
    return found


def sweep_until_quiet(token: str, spared: frozenset[int] = frozenset()) -> None:
    """sweep() again and again until none of the marked processes has been seen for
    QUIET_SECONDS, or SWEEP_SECONDS have passed."""
    deadline = time.monotonic() + SWEEP_SECONDS
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        if sweep(token, spared):
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_SECONDS:
            return
        time.sleep(POLL_SECONDS)


def main(argv: list[str]) -> int:
    """argv: the token, the cluster's temporary directory, the driver's pid (spared: it
    set the token in its own environment to start the cluster)."""
    token, temp_dir, driver = argv
    # The terminal's Ctrl-C goes to the driver's process group, not this session's; a
    # stray one must not end the reaper before it has done its work.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.buffer.read()  # until the driver closes the pipe, or is gone
    sweep_until_quiet(token, frozenset({int(driver)}))
    shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
