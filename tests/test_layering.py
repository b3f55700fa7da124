"""The design's one-way dependencies (DESIGN.md, Layout): `spec` depends on nothing of
ours; `reference` and `gpu_impl` each on `spec` only, never on each other: a
differential test between two implementations that share code proves little."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import schedspec

ROOT = Path(schedspec.__file__).parent
ALLOWED = {
    "spec": ("schedspec.spec",),
    "reference": ("schedspec.spec", "schedspec.reference"),
    "gpu_impl": ("schedspec.spec", "schedspec.gpu_impl"),
}


def our_imports(path: Path) -> list[str]:
    """Every schedspec module a file imports, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return [name for name in found if name.split(".")[0] == "schedspec"]


def breaches(part: str) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / part).rglob("*.py"))
        for name in our_imports(path)
        if not name.startswith(ALLOWED[part])
    ]


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_part_imports_only_what_it_may(part: str) -> None:
    assert (ROOT / part).is_dir()
    assert breaches(part) == []


def test_a_breach_is_seen(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from schedspec.reference import sizing\n")
    assert our_imports(bad) == ["schedspec.reference"]
    assert not "schedspec.reference".startswith(ALLOWED["gpu_impl"])
