"""scripts/try_ci_workflow.py reads the README's workflow as a runner would. Running it
(fresh venvs, pip downloads: minutes) is .ci/run's; these are its parts, with worked
examples, and what the workflow must hold for the issue's failures not to come back:
schedspec installed from a source pip can reach (it is not on PyPI), pytest installed
where pytest runs, and an artifact glob over the folder every trace is sent to."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.script_modules import load_script

REPO = Path(__file__).resolve().parent.parent


ci = load_script(REPO / "scripts" / "try_ci_workflow.py", "try_ci_workflow")

WORKED = """name: w
on: [push]
env:
  SOURCE: "x"
jobs:
  j:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - name: One
        run: echo one
      - name: Keep
        if: failure()
        uses: actions/upload-artifact@v4
        with:
          name: out
          path: out/*.json
"""


def test_parse_workflow_worked_example() -> None:
    workflow = ci.parse_workflow(WORKED)
    assert workflow.env == {"SOURCE": "x"}
    checkout, one, keep = workflow.steps
    assert checkout.run is None and checkout.upload_path is None
    assert (one.name, one.run, one.condition) == ("One", "echo one", None)
    assert (keep.condition, keep.upload_path) == ("failure()", "out/*.json")


def test_a_multi_line_run_is_refused() -> None:
    text = WORKED.replace("run: echo one", "run: |\n          echo one")
    with pytest.raises(ValueError, match="run has a multi-line value"):
        ci.parse_workflow(text)


def test_a_readme_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="no workflow between"):
        ci.workflow_text("# a README\n")


def test_run_workflow_stops_at_the_first_failure_and_uploads(tmp_path: Path) -> None:
    steps = (
        ci.Step("a", "mkdir out && echo '{}' > out/t.json", None, None),
        ci.Step("b", "exit 3", None, None),
        ci.Step("c", "touch never", None, None),
        ci.Step("keep", None, "failure()", "out/*.json"),
    )
    runs, uploaded = ci.run_workflow(ci.Workflow({}, steps), tmp_path, {"PATH": "/usr/bin:/bin"})
    assert [(run.step.name, run.returncode) for run in runs] == [("a", 0), ("b", 3)]
    assert uploaded == [tmp_path / "out" / "t.json"]
    assert not (tmp_path / "never").exists()


def test_the_readmes_workflow_installs_what_it_runs() -> None:
    workflow = ci.parse_workflow(ci.workflow_text((REPO / "README.md").read_text()))
    commands = [step.run for step in workflow.steps if step.run is not None]
    install, *rest = commands
    assert '"schedspec @ $SCHEDSPEC_SOURCE"' in install and " pytest" in install
    assert any("pytest" in command for command in rest)
    assert all("--schedspec-trace-dir schedspec-traces" in c for c in rest if "pytest" in c)
    assert all("--trace-dir schedspec-traces" in c for c in rest if "schedspec check" in c)
    (upload,) = [step for step in workflow.steps if step.upload_path is not None]
    assert (upload.condition, upload.upload_path) == ("failure()", "schedspec-traces/*.json")
    assert workflow.env["SCHEDSPEC_SOURCE"].startswith("git+https://")


def test_the_source_copy_holds_what_a_build_needs(tmp_path: Path) -> None:
    copied = ci.copy_distribution_sources(REPO, tmp_path / "source")
    assert (copied / "pyproject.toml").is_file() and (copied / "README.md").is_file()
    assert (copied / "schedspec" / "install" / "install_vllm.sh").is_file()
    assert not list(copied.rglob("__pycache__"))
