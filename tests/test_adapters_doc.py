"""docs/ADAPTERS.md teaches the adapter in examples/: each snippet it shows is that file's
text, line for line, and the conform output it shows is what the command prints."""

from __future__ import annotations

import re

from click.testing import CliRunner

from schedspec.cli.main import main
from tests.example_engine import ADAPTER, REPO

DOC = REPO / "docs" / "ADAPTERS.md"
# Each snippet is marked with its file, and kept out of ruff's formatting of Markdown code
# (which would dedent a method shown outside its class).
MARKER = "<!-- from examples/toyserve_adapter.py -->\n<!-- fmt:off -->"


def _snippets() -> list[str]:
    return re.findall(re.escape(MARKER) + r"\n```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_every_adapter_snippet_is_the_files_own_text() -> None:
    source = ADAPTER.read_text()
    snippets = _snippets()
    assert len(snippets) == DOC.read_text().count("<!-- from examples/") == 3
    for snippet in snippets:
        assert snippet in source, snippet.splitlines()[0]


def test_the_snippets_cover_the_whole_adapter_class() -> None:
    lines = ADAPTER.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class ToyServeAdapter"))
    shown = {line for snippet in _snippets() for line in snippet.splitlines()}
    left_out = [line for line in lines[start:] if line.strip() and line not in shown]
    assert left_out == []


def test_the_doc_states_the_adapters_length() -> None:
    assert f"the adapter, {len(ADAPTER.read_text().splitlines())} lines" in DOC.read_text()


def test_the_conform_output_shown_is_what_the_command_prints() -> None:
    doc = DOC.read_text()
    shown = doc.split("schedspec conform --engine toyserve_adapter:ToyServeAdapter\n```\n", 1)[1]
    expected = shown.split("```text\n", 1)[1].split("```", 1)[0]
    printed = CliRunner().invoke(main, ["conform", "--engine", "toyserve_adapter:ToyServeAdapter"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == expected
