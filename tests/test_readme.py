"""The README's code runs: the usage example prints what it says, the documented
adapter for someone else's engine passes the suite, and CI runs the README's test command."""

from __future__ import annotations

import contextlib
import io
import re
import types
from pathlib import Path

from schedspec.properties.suite import SuiteSettings, run_suite

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_usage_example_runs() -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_python_blocks()[0], str(README), "exec"), {})
    assert printed.getvalue().strip() == "{'A': 400}"


def test_readme_adapter_example_passes_the_suite() -> None:
    (adapter_block,) = [b for b in _python_blocks() if "class MyEngineAdapter" in b]
    module = types.ModuleType("my_engine_adapter")
    exec(compile(adapter_block, str(README), "exec"), module.__dict__)
    result = run_suite(module.MyEngineAdapter, "safety", SuiteSettings(examples=15, seed=5))
    assert result.passed, result.error or result.other_error
    assert result.stats.steps > 100


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
