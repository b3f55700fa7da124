"""The processes a run started, from /proc (Linux): the tests that stop a run with its
workers find the workers by their parent link, read as the Ray reaper reads it."""

from __future__ import annotations

from schedspec.campaign.ray_reaper import process_table


def children(pid: int, *, zombies: bool) -> list[int]:
    """The processes whose parent is `pid`; with zombies=False, only those not yet ended
    (a zombie has ended and waits for its parent to collect its status)."""
    return [
        child
        for child, entry in process_table().items()
        if entry.parent == pid and (zombies or entry.state != "Z")
    ]
