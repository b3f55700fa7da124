"""The tutorial's example: toyserve (its own engine, not the reference in disguise) and
its adapter on the kit, under 100 lines, pass `schedspec conform` and `schedspec check`
under safety, and the check has teeth on a planted toyserve bug."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from schedspec.properties.suite import SuiteSettings, run_suite
from tests.example_engine import ADAPTER, EXAMPLES, TOYSERVE, subprocess_env

import toyserve  # isort: skip  (on the path tests.example_engine sets)
import toyserve_adapter  # isort: skip


def _schedspec(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it from the examples folder."""
    return subprocess.run(
        [sys.executable, "-m", "schedspec", *args],
        cwd=EXAMPLES,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_adapter_is_under_100_lines() -> None:
    assert len(ADAPTER.read_text().splitlines()) < 100


def test_toyserve_is_a_package_of_its_own_that_never_imports_schedspec() -> None:
    assert (TOYSERVE / "pyproject.toml").is_file()
    for path in (TOYSERVE / "toyserve").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "schedspec" for n in names), path


def test_the_adapter_keeps_its_protocol() -> None:
    done = _schedspec("conform", "--engine", "toyserve_adapter:ToyServeAdapter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED" in done.stdout


def test_check_passes_the_adapter_under_safety_within_its_capabilities(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    done = _schedspec(
        "check",
        "--engine",
        "toyserve_adapter:ToyServeAdapter",
        "--examples",
        "15",
        "--seed",
        "2",
        "--json",
        str(report),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "against profile safety" in done.stdout
    assert "within the capabilities the adapter declares (chunked-prefill, prefix-caching)" in (
        done.stdout
    )
    assert "PASSED" in done.stdout
    written = json.loads(report.read_text())
    assert written["capabilities"] == ["chunked-prefill", "prefix-caching"]
    assert "drafts-scheduled" in written["corners_not_applicable"]
    assert "drafts-scheduled" not in written["corners"]
    assert "prefix-hit" in written["corners"]


def test_the_check_catches_a_bug_planted_in_toyserve(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A release that forgets the sequence's last block: it leaks, and the ledger shows it.
    def leaky_release(self: toyserve.BlockManager, seq_id: str) -> None:
        table = self.tables.pop(seq_id, [])
        for block in table[:-1]:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)
        self.seq_keys.pop(seq_id, None)

    monkeypatch.setattr(toyserve.BlockManager, "release", leaky_release)
    quick = SuiteSettings.quick()
    settings = dataclasses.replace(quick, examples=20, seed=1, shrink=False)
    result = run_suite(toyserve_adapter.ToyServeAdapter, "safety", settings, trace_dir=tmp_path)
    assert result.error is not None
    assert {"CONSERVATION"} & {v.invariant for v in result.error.violations}
