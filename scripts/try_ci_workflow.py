"""Run the README's GitHub Actions workflow as a runner would, on a planted bug.

    python scripts/try_ci_workflow.py [--keep DIR] [--scenario NAME] [--readme PATH]

The workflow ("Put it in CI" in the README, between its ci-workflow snippet markers;
docs/CI.md shows the same block) must work when copied as is. This script copies a
small engine repository into a temp folder (an adapter at its root, a test of its own
under tests/), makes a fresh venv, and runs the workflow's `run:` steps there in order
with bash -e -o pipefail, as GitHub's runner does, stopping at the first that fails; the
upload step (`if: failure()`) then collects its `path:` glob. SCHEDSPEC_SOURCE, which the
README tells the user to set, points at a copy of this checkout's sources. Three
scenarios, each with every step, in one venv made fresh for the run (the later scenarios'
install steps then rebuild schedspec but download nothing: CI's time):

- green: the adapter and the test pass; every step exits 0 and nothing is uploaded;
- broken-adapter: the adapter miscounts its total; `schedspec check` exits 1 and the
  glob matches its trace;
- broken-test: the adapter passes, a test of the repository's own that calls the
  `schedspec_suite` fixture on a variant fails; pytest exits 1 and the glob matches the
  fixture's trace (which, without --schedspec-trace-dir, would sit in pytest's tmp_path).

Every uploaded file must be a trace schedspec can load, with the mode the umask gives
(0644 under the runner's 022), so the artifact is readable. Exit 0 when all hold, 1 with
what went wrong otherwise. `.ci/run` runs it; it needs the network (or pip's local
wheels) for schedspec's dependencies and pytest.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
START, END = "--8<-- [start:ci-workflow]", "--8<-- [end:ci-workflow]"
RUNNER_UMASK = 0o022
# What `pip install` needs of the checkout to build schedspec; copied, so that the
# build's own files (build/, schedspec.egg-info) never land in the checkout.
DISTRIBUTION_SOURCES = ("pyproject.toml", "README.md", "schedspec")


@dataclass(frozen=True)
class Step:
    name: str
    run: str | None  # the shell command, or None for a `uses:` step
    condition: str | None  # its `if:`
    upload_path: str | None  # an upload-artifact step's `path:`


@dataclass(frozen=True)
class Workflow:
    env: dict[str, str]
    steps: tuple[Step, ...]


def workflow_text(readme: str) -> str:
    """The YAML between the README's ci-workflow snippet markers."""
    if START not in readme or END not in readme:
        raise ValueError(f"README.md: no workflow between {START!r} and {END!r}")
    block = readme.split(START, 1)[1].split(END, 1)[0]
    found = re.search(r"```yaml\n(.*?)```", block, flags=re.DOTALL)
    if found is None:
        raise ValueError("README.md: the ci-workflow section holds no ```yaml block")
    return found.group(1)


def parse_workflow(text: str) -> Workflow:
    """The top-level env and the steps of a workflow written as the README writes it:
    one-line values, `- name:` opening each step. Anything else (a multi-line `run: |`)
    is refused, so that a change to the workflow cannot slip past this script."""
    env: dict[str, str] = {}
    steps: list[dict[str, str]] = []
    section = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            section = line.split(":", 1)[0]
            continue
        key_value = re.match(r"^\s*(?:- )?([A-Za-z_-]+):\s*(.*)$", line)
        if key_value is None:
            raise ValueError(f"workflow: cannot read the line {line!r}")
        key, value = key_value.groups()
        if value in ("|", ">", "|-", ">-"):
            raise ValueError(f"workflow: {key} has a multi-line value; keep each on one line")
        if section == "env":
            env[key] = value.strip('"')
        elif line.lstrip().startswith("- ") and line.startswith("      - "):
            steps.append({key: value})
        elif steps and line.startswith("        "):
            steps[-1][key] = value
    return Workflow(
        env,
        tuple(
            Step(
                name=step.get("name", step.get("uses", step.get("run", "?"))),
                run=step.get("run"),
                condition=step.get("if"),
                upload_path=step.get("path") if "upload-artifact" in step.get("uses", "") else None,
            )
            for step in steps
        ),
    )


# ------------------------------------------------------------ the engine repository

GOOD_ADAPTER = '''"""The engine's adapter; schedspec's reference engine stands in for the engine."""

from schedspec.adapters.reference import ReferenceEngine


class MyEngineAdapter(ReferenceEngine):
    pass
'''

# Wrong on every step that schedules anything: found at once, shrunk in moments.
MISCOUNTING = '''

import dataclasses

from schedspec.adapters.reference import ReferenceEngine


class {name}(ReferenceEngine):
    """Miscounts its total on every step that schedules anything (BUDGET)."""

    def schedule(self):
        output = super().schedule()
        if not output.num_scheduled_tokens:
            return output
        total = output.total_num_scheduled_tokens + 1
        return dataclasses.replace(output, total_num_scheduled_tokens=total)
'''

OWN_TEST = '''"""The repository's own test of its engine, through the schedspec_suite fixture."""

from my_engine_adapter import MyEngineAdapter


def test_my_engine_meets_the_spec(schedspec_suite):
    schedspec_suite(MyEngineAdapter, examples=10)
'''

VARIANT_TEST = (
    MISCOUNTING.format(name="TweakedAdapter")
    + """

def test_the_tweaked_engine_meets_the_spec(schedspec_suite):
    schedspec_suite(TweakedAdapter, examples=10)
"""
)


@dataclass(frozen=True)
class Scenario:
    name: str
    files: dict[str, str]  # path in the repository -> its text
    failing_step: str | None  # the name of the step that must exit 1; None: all pass
    says: str  # what the failing step prints (the planted bug's invariant)


SCENARIOS = (
    Scenario(
        "green",
        {"my_engine_adapter.py": GOOD_ADAPTER, "tests/test_my_engine.py": OWN_TEST},
        None,
        "",
    ),
    Scenario(
        "broken-adapter",
        {
            "my_engine_adapter.py": MISCOUNTING.format(name="MyEngineAdapter").lstrip(),
            "tests/test_my_engine.py": OWN_TEST,
        },
        "Hold the engine to the spec",
        "[BUDGET]",
    ),
    Scenario(
        "broken-test",
        {
            "my_engine_adapter.py": GOOD_ADAPTER,
            "tests/test_my_engine.py": OWN_TEST,
            "tests/test_variant.py": VARIANT_TEST.lstrip(),
        },
        "Your tests, and the suite as one of them",
        "[BUDGET]",
    ),
)


def copy_distribution_sources(repo: Path, destination: Path) -> Path:
    """A copy of what building schedspec needs, without caches; its folder."""
    destination.mkdir(parents=True)
    for name in DISTRIBUTION_SOURCES:
        source = repo / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(source, destination / name, ignore=ignore)
        else:
            shutil.copy(source, destination / name)
    return destination


def runner_environment(venv: Path, workflow: Workflow, source: Path) -> dict[str, str]:
    """A runner's environment: the venv first on PATH (setup-python's python), the
    workflow's env with SCHEDSPEC_SOURCE set as the README says, CI=true, and nothing of
    this process's Python set-up (PYTHONPATH would import this checkout instead)."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV", "SCHEDSPEC_LONG", "PYTHONHOME")
    }
    environment.update(workflow.env)
    environment.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{environment.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        SCHEDSPEC_SOURCE=source.as_uri(),
        CI="true",
    )
    return environment


@dataclass(frozen=True)
class StepRun:
    step: Step
    returncode: int
    output: str
    seconds: float


def run_workflow(
    workflow: Workflow, repository: Path, environment: dict[str, str]
) -> tuple[list[StepRun], list[Path] | None]:
    """The `run:` steps in order until one fails, as a runner runs them; then what the
    upload step's glob matches if its condition holds (None when it does not run)."""
    runs: list[StepRun] = []
    failed = False
    uploaded: list[Path] | None = None
    for step in workflow.steps:
        if step.upload_path is not None:
            if step.condition == "failure()" and failed:
                uploaded = [Path(p) for p in sorted(glob.glob(str(repository / step.upload_path)))]
            continue
        if step.run is None or failed:
            continue  # a `uses:` step (checkout, setup-python) is the runner's own
        print(f"   $ {step.run}", flush=True)
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", step.run],
            cwd=repository,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        runs.append(StepRun(step, done.returncode, done.stdout, time.monotonic() - started))
        failed = done.returncode != 0
    return runs, uploaded


def problems_with_traces(paths: list[Path], python: Path, environment: dict[str, str]) -> list[str]:
    """What is wrong with the uploaded files: none, unreadable, not a trace. Loaded by
    the venv's schedspec, run where no schedspec sources lie (-c puts the working
    directory on the import path)."""
    if not paths:
        return ["the upload's glob matched no file"]
    found = []
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode != 0o666 & ~RUNNER_UMASK:
            found.append(f"{path.name}: mode {mode:o}, not {0o666 & ~RUNNER_UMASK:o}")
        load = (
            "import sys; from pathlib import Path; from schedspec.traces.trace import Trace; "
            "Trace.load(Path(sys.argv[1]))"
        )
        loaded = subprocess.run(
            [str(python), "-c", load, str(path)],
            cwd=path.parent,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
        if loaded.returncode != 0:
            found.append(f"{path.name}: not a trace schedspec loads: {loaded.stderr.strip()}")
    return found


def try_scenario(
    scenario: Scenario, workflow: Workflow, root: Path, source: Path, venv: Path
) -> list[str]:
    """Run the workflow on the scenario's repository with the venv; what went wrong."""
    repository = root / scenario.name
    for name, text in scenario.files.items():
        (repository / name).parent.mkdir(parents=True, exist_ok=True)
        (repository / name).write_text(text)
    environment = runner_environment(venv, workflow, source)
    runs, uploaded = run_workflow(workflow, repository, environment)
    problems = []
    for run in runs:
        print(f"   {run.step.name}: exit {run.returncode} ({run.seconds:.0f} s)", flush=True)
    failing = [run for run in runs if run.returncode != 0]
    if scenario.failing_step is None:
        if failing:
            problems.append(f"{failing[0].step.name} failed:\n{failing[0].output}")
        elif uploaded is not None:
            problems.append("the upload step ran on a green run")
        return problems
    if not failing or failing[0].step.name != scenario.failing_step:
        shown = failing[0].step.name if failing else "no step"
        output = failing[0].output if failing else runs[-1].output if runs else ""
        return [f"{scenario.failing_step} should fail; {shown} did:\n{output}"]
    (run,) = failing
    if run.returncode != 1 or scenario.says not in run.output:
        problems.append(
            f"{run.step.name}: exit {run.returncode}, not 1 with {scenario.says}:\n{run.output}"
        )
    problems += problems_with_traces(uploaded or [], venv / "bin" / "python", environment)
    named = {(repository / p).resolve() for p in re.findall(r"trace written to (\S+)", run.output)}
    missing = named - {path.resolve() for path in uploaded or []}
    if missing:
        problems.append(f"traces the step wrote that the upload misses: {sorted(missing)}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work in this (new) folder and keep it")
    parser.add_argument(
        "--scenario", choices=[s.name for s in SCENARIOS], help="only this one [default: all]"
    )
    parser.add_argument(
        "--readme",
        type=Path,
        default=README,
        help="take the workflow from this file [default: the checkout's README.md]",
    )
    arguments = parser.parse_args()
    chosen = [s for s in SCENARIOS if arguments.scenario in (None, s.name)]
    workflow = parse_workflow(workflow_text(arguments.readme.read_text()))
    os.umask(RUNNER_UMASK)  # the runner's; the steps inherit it
    with tempfile.TemporaryDirectory(prefix="schedspec-ci-workflow-") as temporary:
        root = arguments.keep or Path(temporary)
        source = copy_distribution_sources(REPO, root / "schedspec-source")
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        failures = {}
        for scenario in chosen:
            print(f"== scenario {scenario.name}", flush=True)
            problems = try_scenario(scenario, workflow, root, source, venv)
            if problems:
                failures[scenario.name] = problems
    if failures:
        print(json.dumps(failures, indent=2), file=sys.stderr)
        print("try_ci_workflow.py: the README's workflow does not work as copied", file=sys.stderr)
        return 1
    print(f"try_ci_workflow.py: the README's workflow works as copied ({len(chosen)} scenarios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
