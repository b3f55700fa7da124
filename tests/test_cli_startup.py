"""`schedspec --help` and `--version` start fast: listing the commands imports none of them
(nor Hypothesis, z3, torch or matplotlib), and the line listed for each is its own
docstring's. benchmarks/bench_cli_startup.py measures the time; nothing here does."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from schedspec import __version__
from schedspec.cli.main import COMMANDS, main

HEAVY = (
    "hypothesis",
    "z3",
    "torch",
    "matplotlib",
    "schedspec.properties",
    "schedspec.cli.check",
    "schedspec.cli.exit_codes",  # only once a command runs
)


def imported_after(code: str) -> set[str]:
    """The top modules of HEAVY that a fresh interpreter holds after running code."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.splitlines()[-1].split())
    return {name for name in HEAVY if name in loaded}


def test_importing_the_entry_point_imports_no_heavy_module() -> None:
    assert imported_after("import schedspec.cli") == set()


def test_help_imports_no_command() -> None:
    code = (
        "import sys\nfrom schedspec.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert imported_after(code) == set()


def test_the_probe_sees_a_heavy_import() -> None:
    """The check above can fail: a command's module does bring Hypothesis."""
    assert "hypothesis" in imported_after("import schedspec.cli.check")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_listed_summary_is_the_commands_own(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert command is not None and command.help is not None
    first_paragraph = " ".join(command.help.split("\n\n")[0].split())
    assert COMMANDS[name].summary == first_paragraph


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"schedspec {__version__}\n"
