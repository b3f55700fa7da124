"""pytest run in another process on files outside the repository (a generated test and
its conftest.py, say), with no configuration but its own: the repository's pytest
settings (xdist workers, this suite's conftest) stay out of it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def run_pytest(python: str, folder: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    """`python -m pytest targets` in `folder`, quiet, its output captured."""
    command = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-c", os.devnull]
    return subprocess.run(
        [python, *command, "--rootdir", str(folder), *targets],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
