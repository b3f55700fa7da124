"""pytest run in another process on files outside the repository (a generated test and
its conftest.py, say), with no configuration but its own: the repository's pytest
settings (xdist workers, this suite's conftest) stay out of it. And the interpreter that
has SGLang, which lives in a venv of its own (tests/sglang_required.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from tests.sglang_required import SGLANG_VENV_VARIABLE, require_sglang


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


def sglang_python(what: str) -> str:
    """The interpreter of $SCHEDSPEC_SGLANG_VENV where it is set, else this one where
    SGLang imports; else `what` is skipped (in CI: fails) as require_sglang says."""
    venv = os.environ.get(SGLANG_VENV_VARIABLE)
    if venv and Path(venv, "bin", "python").exists():
        return str(Path(venv, "bin", "python"))
    if importlib.util.find_spec("sglang") is None:
        require_sglang(what)
    return sys.executable
