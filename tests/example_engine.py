"""The tutorial's engine (examples/toyserve, a repository of its own) and its adapter
(examples/toyserve_adapter.py), importable from the tests as a user's would be."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
ADAPTER = EXAMPLES / "toyserve_adapter.py"
TOYSERVE = EXAMPLES / "toyserve"
# Where the adapter module and the toyserve package are found.
PATHS = (str(EXAMPLES), str(TOYSERVE))
for path in PATHS:
    if path not in sys.path:
        sys.path.insert(0, path)


def subprocess_env() -> dict[str, str]:
    """The environment a `schedspec` subprocess finds the example in (and this checkout)."""
    paths = [*PATHS, str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
