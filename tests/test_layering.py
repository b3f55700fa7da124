"""The design's one-way dependencies: `spec` depends on nothing of ours; `reference` and
`gpu_impl` each on `spec` only, never on each other (a differential test between two
implementations that share code proves little); and the command line, schedspec/cli,
sits on top: no library module imports it, and every command lives in it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import schedspec

ROOT = Path(schedspec.__file__).parent
ALLOWED = {
    "spec": ("schedspec.spec",),
    "reference": ("schedspec.spec", "schedspec.reference"),
    "gpu_impl": ("schedspec.spec", "schedspec.gpu_impl"),
}
CLI = ROOT / "cli"
# `python -m schedspec` must be schedspec/__main__.py: the one way in from outside cli/.
ENTRY_POINT = ROOT / "__main__.py"


def imports(path: Path) -> list[str]:
    """Every absolute import of a file, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def our_imports(path: Path) -> list[str]:
    """Every schedspec module a file imports, at any depth of the file."""
    return [name for name in imports(path) if name.split(".")[0] == "schedspec"]


def breaches(part: str) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / part).rglob("*.py"))
        for name in our_imports(path)
        if not name.startswith(ALLOWED[part])
    ]


def library_modules() -> list[Path]:
    """Every module outside schedspec/cli (and the entry point)."""
    return [
        path
        for path in sorted(ROOT.rglob("*.py"))
        if CLI not in path.parents and path != ENTRY_POINT
    ]


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


def cli_imports_outside_cli(paths: list[Path]) -> list[str]:
    return [
        f"{shown(path)} imports {name}"
        for path in paths
        for name in our_imports(path)
        if name == "schedspec.cli" or name.startswith("schedspec.cli.")
    ]


def commands_outside_cli(paths: list[Path]) -> list[str]:
    """Modules that build a command line (they import click) but sit outside cli/."""
    return [
        shown(path)
        for path in paths
        if any(name.split(".")[0] == "click" for name in imports(path))
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


def test_no_library_module_imports_the_command_line() -> None:
    assert CLI.is_dir()
    assert cli_imports_outside_cli(library_modules()) == []


def test_every_command_module_sits_in_cli() -> None:
    modules = library_modules()
    assert any(path.parent.name == "properties" for path in modules)  # the walk found them
    assert commands_outside_cli(modules) == []


def test_a_library_module_importing_a_command_is_seen(tmp_path: Path) -> None:
    """Worked example: a helper in properties/ that reaches up for a report, and one
    that defines a click command, are each caught."""
    helper = tmp_path / "helper.py"
    helper.write_text("def f():\n    from schedspec.cli.check_report import format_table\n")
    command = tmp_path / "command.py"
    command.write_text("import click\n\n\n@click.command()\ndef go() -> None: ...\n")
    tidy = tmp_path / "tidy.py"
    tidy.write_text("from schedspec.properties.engines import ENGINES\n")
    paths = [command, helper, tidy]
    assert cli_imports_outside_cli(paths) == [f"{helper} imports schedspec.cli.check_report"]
    assert commands_outside_cli(paths) == [str(command)]


def test_run_and_check_start_without_torch_z3_or_matplotlib() -> None:
    """The group imports a command's module only when it runs (cli/main.py)."""
    script = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from schedspec.cli.main import main\n"
        "for args in (['run', '--quiet'], ['check', '--examples', '2', '--seed', '1']):\n"
        "    result = CliRunner().invoke(main, args)\n"
        "    assert result.exit_code == 0, result.output\n"
        "print(sorted(m for m in ('torch', 'z3', 'matplotlib') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT.parent, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def top_level_imports(path: Path) -> list[str]:
    """The absolute imports a file runs when it is imported (outside any function)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def test_ray_is_imported_only_once_a_local_cluster_can_keep_it_on_loopback() -> None:
    """Ray fixes the node's address when it is first imported (ray_cluster.py): only the
    two Ray modules import it, ray_cluster.py inside its functions, and ray_workers.py
    (which imports Ray at its top) is itself imported only inside functions."""
    every_module = sorted(ROOT.rglob("*.py"))
    importing_ray = [
        shown(path) for path in every_module if any(n.split(".")[0] == "ray" for n in imports(path))
    ]
    assert importing_ray == ["properties/ray_cluster.py", "properties/ray_workers.py"]
    assert "ray" not in top_level_imports(ROOT / "properties" / "ray_cluster.py")
    workers_module = "schedspec.properties.ray_workers"
    at_top = [shown(p) for p in every_module if workers_module in top_level_imports(p)]
    assert at_top == []
    assert any(workers_module in imports(p) for p in every_module)  # the test sees imports
