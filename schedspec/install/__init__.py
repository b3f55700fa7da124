"""The engine install scripts, shipped inside the package so that they run wherever
schedspec is installed: `schedspec install vllm` (cli/setup/install.py) runs this folder's
install_vllm.sh, and a checkout's scripts/install_vllm.sh is a wrapper around the same
file. Each script puts one engine's scheduler (or torch's CPU build) into a venv with
only what it needs; lib/ holds what they share.

INSTALL_COMMANDS are the commands every hint names: they work from any folder, in a
checkout or not, for the venv schedspec runs in (or the VENV named after them).
"""

from __future__ import annotations

import importlib.metadata
import json
import shlex
from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parent

# The engine's name on the command line -> its script in SCRIPTS_DIR.
SCRIPTS: dict[str, str] = {
    "vllm": "install_vllm.sh",
    "sglang": "install_sglang.sh",
    "torch-cpu": "install_torch_cpu.sh",
}
# Only install_vllm.sh installs several releases (--version, --any-version).
TAKES_VERSION = frozenset({"vllm"})
# The probe (schedspec.properties.probe) runs after an engine's install; torch has none.
PROBED = frozenset({"vllm", "sglang"})


def script_path(engine: str) -> Path:
    """The install script of `engine` (a key of SCRIPTS)."""
    return SCRIPTS_DIR / SCRIPTS[engine]


def install_command(engine: str, *, version: str | None = None) -> str:
    """The command a hint names to install `engine` into the venv schedspec runs in."""
    release = f" --version {version}" if version is not None else ""
    return f"schedspec install {engine}{release}"


def pip_source() -> str | None:
    """What `pip install` takes to install this schedspec into another venv: `-e CHECKOUT`
    when it runs from a checkout, else the URL it was installed from (PEP 610's
    direct_url.json: a git URL at its commit, or a local path), else None (where it came
    from is unknown; it is not on PyPI)."""
    root = SCRIPTS_DIR.parent.parent
    if (root / "pyproject.toml").is_file() and (root / "schedspec" / "__init__.py").is_file():
        return f"-e {shlex.quote(str(root))}"
    try:
        recorded = importlib.metadata.distribution("schedspec").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    return source_of(recorded) if recorded is not None else None


def source_of(direct_url: str) -> str | None:
    """The `pip install` argument that installs schedspec again from where a PEP 610
    direct_url.json says it came from: a git URL at the commit installed, or the URL of
    an archive or a folder; None for a record with no URL."""
    origin = json.loads(direct_url)
    url = origin.get("url") if isinstance(origin, dict) else None
    if not isinstance(url, str) or not url:
        return None
    vcs = origin.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") and vcs.get("commit_id"):
        url = f"{vcs['vcs']}+{url}@{vcs['commit_id']}"
    return shlex.quote(f"schedspec @ {url}")
