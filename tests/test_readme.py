"""The README's code runs: the usage example prints what it says, and the documented
adapter for someone else's engine passes the suite."""

from __future__ import annotations

import contextlib
import io
import re
import types
from pathlib import Path

from schedspec.properties.suite import SuiteSettings, run_suite

README = Path(__file__).resolve().parent.parent / "README.md"


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
