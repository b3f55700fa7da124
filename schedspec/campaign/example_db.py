"""Hypothesis' example database across a campaign: a failure found once is tried first
the next time.

Hypothesis saves every failing example it finds (and the smaller ones it meets while
shrinking) under the test's key, and replays what it holds before generating anything
new (Phase.reuse). A campaign shares one database: its workers, local or on a Ray
cluster, open it through a DatabaseSource, which pickles (a path, or a handle to the
Ray actor that serves the directory from the driver's machine, campaign/ray_workers.py) where an
open database need not.

Every engine, pair of engines and profile gets a namespace of its own within the
directory (NamespacedDatabase): Hypothesis' key is the state machine's, the same for
every engine, and one engine's failures would otherwise be replayed on another first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase


class DatabaseSource(Protocol):
    def open(self) -> ExampleDatabase:
        """The database, opened in the process that runs examples."""
        ...


class NamespacedDatabase(ExampleDatabase):
    """Another database with every key put under `namespace`."""

    def __init__(self, inner: ExampleDatabase, namespace: str) -> None:
        super().__init__()
        self.inner = inner
        self.prefix = namespace.encode() + b"\x00"

    def __repr__(self) -> str:
        return f"NamespacedDatabase({self.inner!r}, {self.prefix[:-1].decode()!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, NamespacedDatabase)
            and self.inner == other.inner
            and self.prefix == other.prefix
        )

    def __hash__(self) -> int:
        return hash((self.prefix, repr(self.inner)))

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.inner.fetch(self.prefix + key)

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self.prefix + src, self.prefix + dest, value)


@dataclass(frozen=True)
class LocalDirectory:
    """A directory on this machine (forked workers, or one process), under a namespace."""

    path: Path
    namespace: str

    def open(self) -> ExampleDatabase:
        return NamespacedDatabase(DirectoryBasedExampleDatabase(self.path), self.namespace)


def campaign_namespace(
    command: str, engines: Iterable[str], profile: str, configs: str | None
) -> str:
    """The namespace of a run's examples: what it checks, on which configs."""
    return ":".join([command, *engines, profile, configs or "suite-configs"])
