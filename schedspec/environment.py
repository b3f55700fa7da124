"""Environment variables set for the duration of a block, and put back as they were.

Shared by what must hand values to child processes or to libraries that read them when
first imported: the install probe's empty per-user caches (properties/probe.py) and the
mark every process of a local Ray cluster inherits (campaign/ray_cluster.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def environment_set(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `values` set until the block ends (children started meanwhile keep
    them); then each variable is as it was, unset again where it was unset."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
