"""The house's one-way dependencies: each folder of schedspec imports only the folders
below it, so the folder names are the architecture.

    install                    the engine install scripts (shell, shipped in the
                               package) and the commands that run them: nothing of ours
    spec                       the abstract model, the invariants, the Z3 model
    reference, gpu_impl        two implementations, each on spec only, never on each
                               other (a differential test between two implementations
                               that share code proves little)
    engines                    the engine protocol, the guarded door, the registry, the
                               engine loop: spec only (and install, for its hints)
    adapters                   real engines (and the reference and gpu_impl) as engines:
                               never the harness, traces or campaigns
    traces                     the trace format and what lockstep compares: engines only
    properties                 the checked engine, the state machine, the suite
    campaign                   chunks on workers, Ray, swarm mode
    simulate                   timing an engine's decisions: engines, never properties
    export                     a trace as a pytest file for an engine's own suite: the
                               adapters' translations, never the harness
    cli                        on top: no library module imports it, and every command
                               lives in it

No import circle is left between modules either, and no folder holds more than
MOST_MODULES modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import schedspec

ROOT = Path(schedspec.__file__).parent
# Two modules sit at the top of the package, utilities rather than parts: files (bounded
# input files read, outputs written atomically) and environment (variables set for a
# block). A part that uses one names it below.
# What each folder may import, besides itself.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "install": frozenset(),
    "spec": frozenset(),
    "reference": frozenset({"spec"}),
    "gpu_impl": frozenset({"spec"}),
    "engines": frozenset({"spec", "install"}),
    "adapters": frozenset({"spec", "engines", "reference", "gpu_impl", "install"}),
    "traces": frozenset({"spec", "engines", "files"}),
    "properties": frozenset({"spec", "engines", "adapters", "traces", "environment", "files"}),
    "campaign": frozenset(
        {"spec", "engines", "adapters", "traces", "properties", "gpu_impl", "files", "environment"}
    ),
    "simulate": frozenset({"spec", "engines", "files"}),
    "export": frozenset({"spec", "engines", "adapters", "traces", "files"}),
}
CLI = ROOT / "cli"
# `python -m schedspec` must be schedspec/__main__.py: the one way in from outside cli/.
ENTRY_POINT = ROOT / "__main__.py"
MOST_MODULES = 16  # per folder, its __init__.py aside


def imports(path: Path) -> list[str]:
    """Every absolute import of a file, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            # `from schedspec.campaign import ray_reaper` imports a module, too
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def our_imports(path: Path) -> list[str]:
    """Every schedspec module a file imports, at any depth of the file."""
    return [name for name in imports(path) if name.split(".")[0] == "schedspec"]


def folder_of(module: str) -> str | None:
    """The top folder of schedspec a dotted name lies in ("files" for schedspec.files),
    None for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def breaches_in(part: str, paths: Iterable[Path]) -> list[str]:
    """Each import of the files (in folder `part`) that reaches a folder it may not."""
    allowed = MAY_IMPORT[part] | {part}
    found = []
    for path in paths:
        for name in sorted(set(our_imports(path))):
            folder = folder_of(name)
            if folder is not None and folder not in allowed and _is_module_or_package(name):
                found.append(f"{shown(path)} imports {name}")
    return found


def _is_module_or_package(name: str) -> bool:
    """`from schedspec.engines.events import Step` lists schedspec.engines.events.Step,
    which is no module: only names that are modules or packages count."""
    relative = Path(*name.split(".")[1:])
    return (ROOT / relative).with_suffix(".py").is_file() or (ROOT / relative).is_dir()


def breaches(part: str) -> list[str]:
    return breaches_in(part, sorted((ROOT / part).rglob("*.py")))


def library_modules() -> list[Path]:
    """Every module outside schedspec/cli (and the entry point)."""
    return [
        path
        for path in sorted(ROOT.rglob("*.py"))
        if CLI not in path.parents and path != ENTRY_POINT
    ]


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(paths: Iterable[Path]) -> dict[str, set[str]]:
    """Module -> the schedspec modules it imports (at any depth), packages included."""
    paths = list(paths)
    known = {module_name(path) for path in paths}
    return {
        module_name(path): {name for name in our_imports(path) if name in known}
        - {module_name(path)}
        for path in paths
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), as sorted lists.

    A package's __init__ importing its own modules is no circle of the design: edges
    from a package to the modules inside it are left out."""
    edges = {
        module: {to for to in targets if not to.startswith(module + ".")}
        for module, targets in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for to in sorted(edges.get(module, ())):
            if to not in index:
                visit(to)
                low[module] = min(low[module], low[to])
            elif to in on_stack:
                low[module] = min(low[module], index[to])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def crowded_folders(root: Path, most: int) -> list[str]:
    """Folders (packages) holding more than `most` modules, __init__.py aside."""
    return [
        f"{shown(folder) if folder != root else '.'}: {count} modules"
        for folder in sorted({root, *(p.parent for p in root.rglob("*.py"))})
        if (count := len([p for p in folder.glob("*.py") if p.name != "__init__.py"])) > most
    ]


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


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_part_imports_only_what_it_may(part: str) -> None:
    assert (ROOT / part).is_dir()
    assert breaches(part) == []


def test_every_folder_has_its_rule() -> None:
    """A new folder must say what it may import: every folder of schedspec is in
    MAY_IMPORT, or is cli."""
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(MAY_IMPORT) | {"cli"}


def test_the_rules_have_no_circle() -> None:
    """The folders themselves form a one-way order: no folder may import one that may
    import it, directly or through others."""
    graph = {
        f"schedspec.{part}": {f"schedspec.{to}" for to in allowed if to in MAY_IMPORT}
        for part, allowed in MAY_IMPORT.items()
    }
    assert circles(graph) == []


def test_a_planted_wrong_import_is_seen(tmp_path: Path) -> None:
    """Worked examples of the nevers: simulate and adapters importing properties, the
    engine layer reaching up for a trace, gpu_impl reaching across to the reference.
    Each is caught; a tidy import is not."""
    planted = {
        "simulate": "def f():\n    from schedspec.properties.suite import run_suite\n",
        "adapters": "from schedspec.properties import checked_engine\n",
        "engines": "from schedspec.traces.trace import Trace\n",
        "gpu_impl": "def f():\n    from schedspec.reference.vllm import scheduler\n",
        "traces": "import schedspec.campaign.parallel\n",
    }
    for part, source in planted.items():
        bad = tmp_path / f"bad_{part}.py"
        bad.write_text(source)
        assert breaches_in(part, [bad]), part
    tidy = tmp_path / "tidy.py"
    tidy.write_text("from schedspec.engines.events import Step\nfrom schedspec.spec import State\n")
    assert breaches_in("traces", [tidy]) == []


def test_no_import_circle_between_modules() -> None:
    assert circles(import_graph(sorted(ROOT.rglob("*.py")))) == []


def test_a_circle_is_seen(tmp_path: Path) -> None:
    """Worked example: two modules that import each other (one inside a function, as a
    circle is usually hidden) are one circle; a package importing its own module is none."""
    package = tmp_path / "schedspec" / "demo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from schedspec.demo import a\n")
    (package / "a.py").write_text("from schedspec.demo.b import g\n")
    (package / "b.py").write_text("def g():\n    from schedspec.demo import a\n")
    paths = sorted(package.rglob("*.py"))
    graph = {
        ".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): {
            name for name in our_imports(p) if name.count(".") >= 2
        }
        for p in paths
    }
    assert circles(graph) == [["schedspec.demo.a", "schedspec.demo.b"]]


def test_no_folder_is_crowded() -> None:
    assert crowded_folders(ROOT, MOST_MODULES) == []


def test_a_crowded_folder_is_seen(tmp_path: Path) -> None:
    for i in range(MOST_MODULES + 1):
        (tmp_path / f"m{i}.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    assert crowded_folders(tmp_path, MOST_MODULES) == [f".: {MOST_MODULES + 1} modules"]


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
    helper.write_text("def f():\n    from schedspec.cli.printing import check_report\n")
    command = tmp_path / "command.py"
    command.write_text("import click\n\n\n@click.command()\ndef go() -> None: ...\n")
    tidy = tmp_path / "tidy.py"
    tidy.write_text("from schedspec.engines.registry import ENGINES\n")
    paths = [command, helper, tidy]
    assert cli_imports_outside_cli(paths) == [
        f"{helper} imports schedspec.cli.printing",
        f"{helper} imports schedspec.cli.printing.check_report",
    ]
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
    """Ray fixes the node's address when it is first imported (campaign/ray_cluster.py):
    only the two Ray modules import it, ray_cluster.py inside its functions, and
    ray_workers.py (which imports Ray at its top) is itself imported only inside
    functions."""
    every_module = sorted(ROOT.rglob("*.py"))
    importing_ray = [
        shown(path) for path in every_module if any(n.split(".")[0] == "ray" for n in imports(path))
    ]
    assert importing_ray == ["campaign/ray_cluster.py", "campaign/ray_workers.py"]
    assert "ray" not in top_level_imports(ROOT / "campaign" / "ray_cluster.py")
    workers_module = "schedspec.campaign.ray_workers"
    at_top = [shown(p) for p in every_module if workers_module in top_level_imports(p)]
    assert at_top == []
    assert any(workers_module in imports(p) for p in every_module)  # the test sees imports
