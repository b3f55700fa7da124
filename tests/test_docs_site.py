"""The docs site's shape, checked without building it (.ci/run builds it with
`mkdocs build --strict`, where a broken link fails): every page of docs/ is in
mkdocs.yml's nav, the page the README's workflow is shown on includes it from the
README (one copy), and the README stays short (its first screen is the three jobs)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MOST_README_LINES = 300


def nav_pages(mkdocs_yml: str) -> set[str]:
    """The .md files mkdocs.yml's nav names."""
    nav = mkdocs_yml.split("\nnav:\n", 1)[1]
    return set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, flags=re.MULTILINE))


def test_nav_pages_worked_example() -> None:
    text = "site_name: x\nnav:\n  - Home: index.md\n  - Part:\n      - A: a/A.md\n"
    assert nav_pages(text) == {"index.md", "a/A.md"}


def test_every_docs_page_is_in_the_nav() -> None:
    pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert pages - nav_pages((REPO / "mkdocs.yml").read_text()) == set()


def test_the_ci_page_includes_the_readmes_workflow() -> None:
    readme = README.read_text()
    assert "<!-- --8<-- [start:ci-workflow] -->" in readme
    assert "<!-- --8<-- [end:ci-workflow] -->" in readme
    assert '--8<-- "README.md:ci-workflow"' in (REPO / "docs" / "CI.md").read_text()


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= MOST_README_LINES
