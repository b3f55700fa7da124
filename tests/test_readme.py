"""The README's and the docs' code runs: the usage example prints what it says, the
documented adapter for someone else's engine passes the suite, every `$ schedspec ...`
sample of the pages below shows what the command prints, and CI runs the README's test
command. The README keeps the set-up section; the rest moved to docs/."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

from schedspec.properties.suite import SuiteSettings, run_suite

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
# The reference's usage and async examples; the complete adapter.
REFERENCE_DOC = DOCS / "REFERENCE.md"
ADAPTER_DOC = DOCS / "ADAPTER_PROTOCOL.md"
# The pages, or a page's section (from its heading to the next "## "), whose
# `$ schedspec ...` samples run, in this order: a later one may read what an earlier
# one wrote (`replay` the trace of `check`, `diff-replay` that of `diff`).
SAMPLED: tuple[tuple[Path, str | None], ...] = (
    (README, None),
    (REFERENCE_DOC, None),
    (DOCS / "CHECK.md", None),
    (DOCS / "DIFF.md", None),
    (DOCS / "FORMAL.md", "## `schedspec prove`"),
    (DOCS / "EXECUTION.md", "## `schedspec run --execute`"),
)


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)


def test_readme_usage_example_runs() -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_python_blocks(REFERENCE_DOC)[0], str(REFERENCE_DOC), "exec"), {})
    assert printed.getvalue().strip() == "{'A': 400}"


def test_readme_async_example_prints_what_its_comments_say() -> None:
    """Each print's trailing comment is the line it prints."""
    (block,) = [b for b in _python_blocks(REFERENCE_DOC) if "async_scheduling=True" in b]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, str(REFERENCE_DOC), "exec"), {})
    expected = [line.split("# ", 1)[1] for line in block.splitlines() if line.startswith("print(")]
    assert printed.getvalue().splitlines() == expected


def test_readme_adapter_example_passes_the_suite() -> None:
    (adapter_block,) = [b for b in _python_blocks(ADAPTER_DOC) if "class MyEngineAdapter" in b]
    module = types.ModuleType("my_engine_adapter")
    exec(compile(adapter_block, str(ADAPTER_DOC), "exec"), module.__dict__)
    result = run_suite(module.MyEngineAdapter, "safety", SuiteSettings(examples=15, seed=5))
    assert result.passed, result.error or result.other_error
    assert result.stats.steps > 100


# ------------------------------------------------- command samples: `$ schedspec ...`

ELIDED = "..."
TIMING = re.compile(r"time: [\d.]+ s  steps/s: \d+")
# Samples whose command needs an optional dependency: flag -> the module.
NEEDS = {"--execute": "torch", "--contracts": "crosshair"}


def sampled_text(page: Path, heading: str | None) -> str:
    """The page, or its section under `heading` (up to the next "## " heading)."""
    text = page.read_text()
    if heading is None:
        return text
    assert heading in text, f"{page.name} has no section {heading!r}"
    return heading + text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_sampled_text_worked_example(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# T\n\n## `a` thing\none\n\n## b\ntwo\n")
    assert sampled_text(page, None) == page.read_text()
    assert sampled_text(page, "## `a`") == "## `a` thing\none\n"


def command_samples() -> list[tuple[str, list[str]]]:
    """Each ```text block that starts with `$ schedspec ...`: the command line, and the
    lines it prints, in SAMPLED's order (a later sample may read what an earlier wrote)."""
    text = "\n".join(sampled_text(page, heading) for page, heading in SAMPLED)
    blocks = re.findall(r"```text\n(.*?)```", text, flags=re.DOTALL)
    samples = []
    for block in blocks:
        first, *rest = block.rstrip("\n").split("\n")
        if first.startswith("$ schedspec "):
            samples.append((first.removeprefix("$ "), rest))
    return samples


def _normalized(line: str) -> str:
    """Timings vary from run to run, the checkout's path from machine to machine."""
    return TIMING.sub("time: T s  steps/s: R", line).replace(str(REPO), ELIDED)


def shows(expected: list[str], printed: list[str]) -> bool:
    """Whether `printed` is `expected` with each `...` line standing for any lines: the
    runs between them appear whole and in order, anchored at both ends unless elided."""
    runs: list[list[str]] = [[]]
    for line in map(_normalized, expected):
        if line == ELIDED:
            runs.append([])
        else:
            runs[-1].append(line)
    lines = [_normalized(line) for line in printed]
    position = 0
    for index, run in enumerate(runs):
        last = index == len(runs) - 1
        starts = [
            at
            for at in range(position, len(lines) - len(run) + 1)
            if lines[at : at + len(run)] == run
            and (index > 0 or at == 0)  # the first run is anchored at the start
            and (not last or at + len(run) == len(lines))  # the last at the end
        ]
        if not starts:
            return False
        position = starts[0] + len(run)
    return True


def test_shows_worked_example() -> None:
    printed = ["a", "b", "c", "time: 1.5 s  steps/s: 80", "d"]
    assert shows(["a", ELIDED, "c", "time: 9.0 s  steps/s: 3", "d"], printed)
    assert shows(["a", "b", ELIDED, "d"], printed)
    assert not shows(["b", ELIDED, "d"], printed)  # the start is anchored
    assert not shows(["a", ELIDED, "c"], printed)  # so is the end
    assert not shows(["a", "c", ELIDED, "d"], printed)  # a run is whole


def test_the_readme_shows_what_its_commands_print(tmp_path: Path) -> None:
    """Each command runs as a user runs it, in a fresh interpreter, all in one folder, in
    order: `replay` reads the trace `check` wrote, and `diff-replay` the one `diff`
    wrote. The engines under tests/ import from the checkout."""
    samples = command_samples()
    commands = [command for command, _ in samples]
    assert any(c.startswith("schedspec diff-replay ") for c in commands)
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    environment.pop("SCHEDSPEC_LONG", None)
    for command, expected in samples:
        needed = [module for flag, module in NEEDS.items() if flag in command.split()]
        if any(importlib.util.find_spec(module) is None for module in needed):
            continue  # an extra not installed here (the test extra has them all)
        done = subprocess.run(
            [sys.executable, "-m", *shlex.split(command)],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
        assert "Traceback" not in done.stderr, f"{command}\n{done.stderr}"
        assert shows(expected, done.stdout.splitlines()), f"{command}\n{done.stdout}"


def _setup_commands() -> list[str]:
    """The command lines of the README's set-up section's bash block."""
    section = README.read_text().split("## Set-up and the two commands", 1)[1]
    (block,) = re.findall(r"```bash\n(.*?)```", section.split("\n## ", 1)[0], flags=re.DOTALL)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    main_command, test_command = _setup_commands()
    assert main_command.endswith(".venv/bin/schedspec check")
    assert test_command == (
        "python3 -m venv .venv && scripts/install_torch_cpu.sh .venv && "
        ".venv/bin/pip install -q -e '.[test]' && scripts/install_vllm.sh .venv && "
        ".venv/bin/python -m pytest"
    )
    assert test_command in (REPO / ".ci" / "run").read_text().splitlines()


def test_ci_installs_sglang_as_the_docs_say() -> None:
    """docs/ENGINES.md's SGLang set-up line, after its venv is made (.ci/run makes and
    removes .venv-sglang as it does .venv), is a line of .ci/run."""
    section = sampled_text(DOCS / "ENGINES.md", "## SGLang under the spec")
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    setup = block.splitlines()[0]
    make_venv = "python3 -m venv .venv-sglang && "
    assert setup.startswith(make_venv) and "scripts/install_sglang.sh .venv-sglang" in setup
    assert setup.removeprefix(make_venv) in (REPO / ".ci" / "run").read_text().splitlines()
