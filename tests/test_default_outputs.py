"""What the commands write by default (traces in the working directory, simulate's
folder) is git-ignored, so a run from the repository leaves `git status` clean.

The names come from the code that writes them, so a renamed output fails here
until .gitignore follows.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from schedspec.simulate.runs import DEFAULT_OUT
from schedspec.traces.trace import FORMAL_TRACE_STEM, TRACE_STEMS, trace_file_name

REPO = Path(__file__).resolve().parent.parent


def default_outputs() -> list[str]:
    """A name of every kind the commands write by default, as a path in the repository."""
    names = [trace_file_name(stem, 4262961808) for stem in TRACE_STEMS]
    names.append(trace_file_name(FORMAL_TRACE_STEM, "KV-COVER", "preempt-keeps-blocks"))
    names.append(str(DEFAULT_OUT / "summary.json"))
    names.append(str(DEFAULT_OUT / "gantt-chunked.png"))
    # Run from a folder below the root, the traces land there.
    names.append(str(Path("tests") / trace_file_name(TRACE_STEMS[0], 1)))
    return names


def check_ignore(names: list[str]) -> set[str]:
    """The names git ignores (`git check-ignore` prints exactly those)."""
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *names],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr  # 1: none ignored
    return set(done.stdout.splitlines())


pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(),
    reason="needs git and a git checkout of schedspec",
)


def test_every_default_output_is_ignored() -> None:
    names = default_outputs()
    assert "schedspec-swarm-4262961808.json" in names  # worked example of a name
    assert check_ignore(names) == set(names)


def test_the_check_sees_what_is_not_ignored() -> None:
    """The sources and the findings' committed traces stay visible."""
    kept = ["schedspec/cli/main.py", "docs/findings/vllm-spec-decode-padding.json"]
    assert check_ignore(kept) == set()
