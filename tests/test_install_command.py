"""`schedspec install ENGINE [VENV]`: the engine install scripts ship in the package, so
the command (and every hint that names an install step) works wherever schedspec is
installed, in a checkout or not; a checkout's scripts/ are wrappers of the same files."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.adapters.sglang.runtime import INSTALL_STEP as SGLANG_STEP
from schedspec.adapters.vllm.releases import INSTALL_HINT as VLLM_RELEASE_HINT
from schedspec.adapters.vllm.runtime import INSTALL_STEP as VLLM_STEP
from schedspec.cli.main import main
from schedspec.cli.setup import install as install_cli
from schedspec.engines.dependencies import CROSSHAIR, RAY, SGLANG, TORCH, VLLM
from schedspec.install import (
    SCRIPTS,
    SCRIPTS_DIR,
    install_command,
    pip_source,
    script_path,
    source_of,
)
from tests.script_modules import load_script

REPO = Path(__file__).resolve().parent.parent
HINTS = {
    "torch": TORCH.install,
    "vllm": VLLM.install,
    "ray": RAY.install,
    "sglang": SGLANG.install,
    "crosshair": CROSSHAIR.install,
    "vllm runtime": VLLM_STEP,
    "sglang runtime": SGLANG_STEP,
    "vllm release": VLLM_RELEASE_HINT,
}


def test_install_help_lists_the_engines() -> None:
    result = CliRunner().invoke(main, ["install", "--help"])
    assert result.exit_code == 0
    assert "{vllm|sglang|torch-cpu}" in result.output
    listed = CliRunner().invoke(main, ["--help"]).output
    assert re.search(r"^  install +Install ENGINE's scheduler", listed, flags=re.MULTILINE)


@pytest.mark.parametrize("engine", sorted(SCRIPTS))
def test_where_prints_the_packaged_script(engine: str) -> None:
    result = CliRunner().invoke(main, ["install", "--where", engine])
    assert result.exit_code == 0, result.output
    path = Path(result.output.strip())
    assert path == script_path(engine) and path.parent == SCRIPTS_DIR
    assert path.read_text().startswith("#!/usr/bin/env bash")


def test_the_checkouts_scripts_are_wrappers_of_the_packaged_ones() -> None:
    """One copy of each script: scripts/X only executes schedspec/install/X."""
    for name in SCRIPTS.values():
        wrapper = (REPO / "scripts" / name).read_text().splitlines()
        assert wrapper[-1] == f'exec "$(dirname "$0")/../schedspec/install/{name}" "$@"'
        assert all(line.startswith("#") for line in wrapper[:-1])


class TestScriptArguments:
    def test_worked_example(self) -> None:
        args = install_cli.script_arguments("vllm", Path("v"), "0.33.0", False, True)
        assert args == ["--version", "0.33.0", "--no-probe", "v"]
        assert install_cli.script_arguments("sglang", Path("v"), None, False, False) == ["v"]

    @pytest.mark.parametrize(
        ("engine", "version", "any_version", "no_probe", "says"),
        [
            ("sglang", "0.5.23", False, False, "--version: only vllm installs several releases"),
            ("torch-cpu", None, True, False, "--any-version: only vllm"),
            ("torch-cpu", None, False, True, "--no-probe: torch-cpu has no probe"),
        ],
    )
    def test_a_flag_the_engine_does_not_take_is_a_usage_error(
        self, engine: str, version: str | None, any_version: bool, no_probe: bool, says: str
    ) -> None:
        args = [engine, "venv", *(["--version", version] if version else [])]
        args += ["--any-version"] * any_version + ["--no-probe"] * no_probe
        result = CliRunner().invoke(main, ["install", *args])
        assert result.exit_code == 2
        assert says in result.output


def test_venv_defaults_to_the_one_schedspec_runs_in(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def run(command: list[str], check: bool) -> subprocess.CompletedProcess[bytes]:
        ran.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)  # the module install.py calls it through
    monkeypatch.setattr(sys, "prefix", "/opt/some-venv")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    result = CliRunner().invoke(main, ["install", "vllm", "--version", "0.33.0"])
    assert result.exit_code == 0, result.output
    assert ran == [["bash", str(script_path("vllm")), "--version", "0.33.0", "/opt/some-venv"]]


def test_outside_a_venv_the_venv_must_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    result = CliRunner().invoke(main, ["install", "sglang"])
    assert result.exit_code == 2
    assert "VENV: schedspec runs in no venv" in result.output
    assert "schedspec install sglang VENV" in result.output


# ------------------------------------------------------------------------- the hints


def extras_requirements() -> set[str]:
    """Every requirement of schedspec's extras, as pip takes it."""
    required = importlib.metadata.requires("schedspec") or []
    return {r.split(";")[0].strip() for r in required if "extra ==" in r}


@pytest.mark.parametrize("name", sorted(HINTS))
def test_every_install_hint_works_wherever_the_user_stands(name: str) -> None:
    """No hint names a checkout's path (scripts/..., `pip install -e '.[x]'`): each names
    `schedspec install ENGINE` for a packaged script, or `pip install` of an extra's own
    requirements (schedspec is not on PyPI, so `schedspec[x]` would find nothing)."""
    hint = HINTS[name]
    assert "scripts/" not in hint and "'.[" not in hint and "schedspec[" not in hint
    engines = re.findall(r"schedspec install ([a-z-]+)", hint)
    pins = re.findall(r"pip install ((?:'[^']+' ?)+)", hint)
    assert engines or pins, hint
    assert set(engines) <= set(SCRIPTS)
    for group in pins:
        assert set(re.findall(r"'([^']+)'", group)) <= extras_requirements(), hint


def test_install_command_worked_example() -> None:
    assert install_command("vllm") == "schedspec install vllm"
    assert install_command("vllm", version="0.33.0") == "schedspec install vllm --version 0.33.0"


class TestSourceForAnotherVenv:
    def test_from_a_checkout_it_is_the_checkout_editable(self) -> None:
        assert pip_source() == f"-e {REPO}"

    def test_a_git_install_is_that_url_at_its_commit(self) -> None:
        recorded = (
            '{"url": "https://example.org/x/schedspec", '
            '"vcs_info": {"vcs": "git", "commit_id": "abc123"}}'
        )
        expected = "'schedspec @ git+https://example.org/x/schedspec@abc123'"
        assert source_of(recorded) == expected

    def test_a_folder_or_an_archive_is_its_url(self) -> None:
        recorded = '{"url": "file:///src/schedspec", "dir_info": {}}'
        assert source_of(recorded) == "'schedspec @ file:///src/schedspec'"
        assert source_of('{"dir_info": {}}') is None


# ------------------------------------------------------------------------- the wheel


@pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None, reason="building a wheel needs setuptools"
)
def test_a_built_wheel_holds_the_install_scripts(tmp_path: Path) -> None:
    """`pip wheel --no-deps` of the checkout (with this venv's setuptools: no download)
    ships every file of schedspec/install/, the scripts executable. Built from a copy:
    a build writes build/ and schedspec.egg-info beside the sources, which the checkout's
    editable installs own."""
    ci = load_script(REPO / "scripts" / "try_ci_workflow.py", "try_ci_workflow")
    source = ci.copy_distribution_sources(REPO, tmp_path / "source")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip_wheel, "--wheel-dir", str(tmp_path), str(source)], check=True)
    (wheel,) = tmp_path.glob("schedspec-*.whl")
    packaged = sorted(
        str(path.relative_to(REPO))
        for path in SCRIPTS_DIR.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert set(packaged) <= names, sorted(set(packaged) - names)
        for name in SCRIPTS.values():
            mode = archive.getinfo(f"schedspec/install/{name}").external_attr >> 16
            assert mode & stat.S_IXUSR, name
