"""The install scripts refuse a bad command line before touching anything, and say how
to call them; install_vllm.sh takes the releases the adapter supports, and no other."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schedspec.adapters.vllm.releases import SUPPORTED
from schedspec.install import script_path

# Run as a checkout runs them: scripts/ wraps the packaged ones (schedspec/install/).
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
USAGE = {
    "install_torch_cpu.sh": "VENV_DIR",
    "install_vllm.sh": "[--version X] VENV_DIR",
    "install_sglang.sh": "VENV_DIR",
}


def run(script: str, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPTS / script), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("script", "args"),
    [
        *((script, args) for script in USAGE for args in ([], ["one-venv", "another"])),
        *((script, ["--nonsense", "venv"]) for script in ("install_vllm.sh", "install_sglang.sh")),
        ("install_sglang.sh", ["--version", "0.5.23", "venv"]),  # one release: no --version
    ],
)
def test_a_script_wants_exactly_one_venv(script: str, args: list[str], tmp_path: Path) -> None:
    result = run(script, args, tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == f"{script}: error: usage: scripts/{script} {USAGE[script]}\n"
    assert list(tmp_path.iterdir()) == []  # no venv created


def test_install_vllm_supports_the_adapters_releases() -> None:
    """One list in two languages: the script's SUPPORTED_VERSIONS is releases.SUPPORTED."""
    text = script_path("vllm").read_text()
    found = re.search(r"^SUPPORTED_VERSIONS=\(([^)]*)\)$", text, re.MULTILINE)
    assert found is not None
    assert found.group(1).split() == [release.version for release in SUPPORTED]


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--version", "0.35.0", "venv"], {}), (["venv"], {"VERSION": "0.35.0"})],
    ids=["flag", "environment"],
)
def test_install_vllm_refuses_another_version_naming_the_range(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    result = run("install_vllm.sh", args, tmp_path, **env)
    assert result.returncode == 1
    assert result.stderr.startswith(
        "install_vllm.sh: error: vllm 0.35.0 is not supported; schedspec supports "
        "0.33.0 to 0.34.0 (--version: one of 0.33.0 0.34.0; --any-version installs"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_version_flag_wins_over_the_environment(tmp_path: Path) -> None:
    result = run("install_vllm.sh", ["--version", "0.1.0", "venv"], tmp_path, VERSION="0.34.0")
    assert "vllm 0.1.0 is not supported" in result.stderr


@pytest.mark.parametrize("script", ["install_vllm.sh", "install_sglang.sh"])
def test_outside_a_checkout_a_venv_without_schedspec_is_refused_first(
    script: str, tmp_path: Path
) -> None:
    """Run from an installed schedspec (no checkout above the scripts), the script has no
    source to install schedspec from: it says so before it downloads anything."""
    installed = tmp_path / "site-packages" / "schedspec" / "install"
    shutil.copytree(script_path("vllm").parent, installed, ignore=shutil.ignore_patterns("*.pyc"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    result = subprocess.run(
        ["bash", str(installed / script), str(venv)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert result.stdout == ""
    engine = script.removeprefix("install_").removesuffix(".sh")
    assert result.stderr == (
        f"{script}: error: schedspec is not installed in {venv} (or lacks its dependencies): "
        f"install it there first ({venv}/bin/pip install, from where you installed schedspec), "
        f"then run `{venv}/bin/schedspec install {engine}`\n"
    )
