"""Per-user caches pointed at new empty folders while an engine probe runs.

An engine's install probe must fail where the venv lacks a package, and a cache warmed
by another venv can hide one (vLLM caches what importing a model's code told it; SGLang
and Triton cache compiled kernels): each probe names the variables its engine and that
engine's libraries read, and runs with every one of them pointing at an empty folder.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def empty_caches(variables: Sequence[str], prefix: str) -> Iterator[str]:
    """Each of `variables` names its own new empty folder (under the folder yielded,
    whose name starts with `prefix`) until the block ends; then the folders go and the
    variables are as they were."""
    saved = {name: os.environ.get(name) for name in variables}
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        try:
            for name in variables:
                os.environ[name] = os.path.join(root, name.lower())
                os.mkdir(os.environ[name])
            yield root
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
