"""The reaper of a local Ray cluster: ends every process the cluster started once the
driver is done with it, or gone.

campaign/ray_cluster.py starts this file as a script (it imports nothing of schedspec), in a
session of its own, before the cluster, with a token that every process of the cluster
inherits in its environment (RUN_VARIABLE), and a pipe on its standard input. When the
pipe closes (the driver closed it after shutting the cluster down, or the driver is gone,
even killed with SIGKILL, which nothing in it can handle), the reaper sends SIGTERM to
every process of the cluster, SIGKILL to those still there after a grace period, and
removes the cluster's temporary directory. Ray ends its own head processes and workers
with a driver that is killed, but not its agents (seen with Ray 2.58: the dashboard and
runtime-env agents outlived a SIGKILLed driver by minutes).

The token alone does not find every process of the cluster: Ray's agents set their
process title, which overwrites the start of the memory that /proc/PID/environ reads,
and the token goes with it when it sits there (seen in a CI run: both agents outlived
the reaper). So while the cluster runs, the reaper watches it every WATCH_SECONDS and
remembers each process that carries the token or descends from one it remembers, by pid
and start time (a pid the system gives again to another process is not taken for the
old one): an agent is remembered as the raylet's child, whatever its title did to its
environment, and still swept once the raylet is gone and the agent is an orphan.

Linux only (it reads /proc); campaign/ray_cluster.py starts it only there.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# The variable that marks the processes of one local cluster: its value is the run's token.
RUN_VARIABLE = "SCHEDSPEC_RAY_RUN"
# How long the processes get to end on SIGTERM before SIGKILL (seconds).
GRACE_SECONDS = 2.0
POLL_SECONDS = 0.1
# How often the reaper looks at the running cluster for processes to remember (seconds):
# a scan of /proc takes a few milliseconds.
WATCH_SECONDS = 1.0
# The reaper sweeps again until no process of the cluster has been seen for QUIET_SECONDS
# (a raylet that is dying may still start an agent: seen on a loaded machine), for at most
# SWEEP_SECONDS.
QUIET_SECONDS = 2.0
SWEEP_SECONDS = 30.0


@dataclass(frozen=True)
class ProcessEntry:
    parent: int
    start: int  # clock ticks after boot: with the pid, names one process for good
    state: str  # R running, S sleeping, Z a zombie (ended, not yet waited for), ...


def process_table() -> dict[int, ProcessEntry]:
    """Every live process: pid -> its parent and start time (from /proc/PID/stat)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            table[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except OSError:
            continue  # gone meanwhile
    return table


def parse_stat(stat: str) -> ProcessEntry:
    """The parent, start time and state in the text of /proc/PID/stat."""
    # The command name (field 2) is in parentheses and may hold spaces and parentheses
    # itself: the fields after the last ')' are plain. Field 3 is the state, 4 the parent,
    # 22 the start time: after the name, the 1st, the 2nd and the 20th.
    fields = stat[stat.rindex(")") + 2 :].split()
    return ProcessEntry(parent=int(fields[1]), start=int(fields[19]), state=fields[0])


def is_marked(pid: int, token: str) -> bool:
    """Whether the environment of process `pid` holds RUN_VARIABLE=token (False when it
    cannot be read: gone, or not ours)."""
    try:
        environment = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{RUN_VARIABLE}={token}".encode() in environment.split(b"\0")


@dataclass
class Cluster:
    """The processes of one cluster, as far as the reaper has seen them: those that carry
    the token, and every descendant of one (the module docstring says why). Never this
    process or the `spared`."""

    token: str
    spared: frozenset[int] = frozenset()
    remembered: dict[int, int] = field(default_factory=dict)  # pid -> start time

    def refresh(self) -> list[int]:
        """Look at /proc again: the live processes of the cluster, sorted."""
        table = process_table()
        excluded = self.spared | {os.getpid()}
        self.remembered = {
            pid: start
            for pid, start in self.remembered.items()
            if pid in table and table[pid].start == start
        }
        for pid, entry in table.items():
            if pid not in excluded and pid not in self.remembered and is_marked(pid, self.token):
                self.remembered[pid] = entry.start
        grown = True
        while grown:  # the descendants of the remembered, generation by generation
            grown = False
            for pid, entry in table.items():
                known = pid in excluded or pid in self.remembered
                if not known and entry.parent in self.remembered:
                    self.remembered[pid] = entry.start
                    grown = True
        return sorted(self.remembered)


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def sweep(cluster: Cluster) -> list[int]:
    """End every process of the cluster: SIGTERM, then SIGKILL after GRACE_SECONDS; the
    ones that were found."""
    found = cluster.refresh()
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    left = found
    while left and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        left = cluster.refresh()
    _signal_all(left, signal.SIGKILL)
    return found


def sweep_until_quiet(cluster: Cluster) -> None:
    """sweep() again and again until no process of the cluster has been seen for
    QUIET_SECONDS, or SWEEP_SECONDS have passed."""
    deadline = time.monotonic() + SWEEP_SECONDS
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        if sweep(cluster):
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_SECONDS:
            return
        time.sleep(POLL_SECONDS)


def watch_until_closed(cluster: Cluster, pipe: int) -> None:
    """cluster.refresh() every WATCH_SECONDS until the end of file on `pipe` (the driver
    closed it, or is gone)."""
    while True:
        readable, _, _ = select.select([pipe], [], [], WATCH_SECONDS)
        if readable and not os.read(pipe, 4096):
            return
        cluster.refresh()


def main(argv: list[str]) -> int:
    """argv: the token, the cluster's temporary directory, the driver's pid (spared: it
    set the token in its own environment to start the cluster)."""
    token, temp_dir, driver = argv
    # The terminal's Ctrl-C goes to the driver's process group, not this session's; a
    # stray one must not end the reaper before it has done its work.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cluster = Cluster(token, frozenset({int(driver)}))
    watch_until_closed(cluster, sys.stdin.fileno())
    sweep_until_quiet(cluster)
    shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
