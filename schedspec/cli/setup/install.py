"""`schedspec install ENGINE [VENV]`: run the engine's install script (schedspec/install/),
which ships in the package, so the command works wherever schedspec is installed.

VENV defaults to the venv schedspec runs in. Exit status: 0 the engine is installed (or
`--where` printed the script's path), 1 the script failed (its output names the step),
2 a usage error (no venv to install into, a flag the engine's script does not take);
6 and 128 + N as for every command (exit_codes.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from schedspec.install import PROBED, SCRIPTS, TAKES_VERSION, script_path


def current_venv() -> Path | None:
    """The venv this interpreter runs in, or None outside one."""
    return Path(sys.prefix) if sys.prefix != sys.base_prefix else None


def script_arguments(
    engine: str, venv: Path, version: str | None, any_version: bool, no_probe: bool
) -> list[str]:
    """The script's command line; a flag its engine does not take is a usage error."""
    if engine not in TAKES_VERSION and (version is not None or any_version):
        flag = "--version" if version is not None else "--any-version"
        raise click.UsageError(f"{flag}: only vllm installs several releases, not {engine}")
    if engine not in PROBED and no_probe:
        raise click.UsageError(f"--no-probe: {engine} has no probe to skip")
    return [
        *(["--version", version] if version is not None else []),
        *(["--any-version"] if any_version else []),
        *(["--no-probe"] if no_probe else []),
        str(venv),
    ]


@click.command(name="install")
@click.argument("engine", type=click.Choice(list(SCRIPTS)))
@click.argument("venv", required=False, type=click.Path(path_type=Path))
@click.option(
    "--version",
    "version",
    metavar="X",
    default=None,
    help="vllm only: the release to install [default: the newest supported].",
)
@click.option(
    "--any-version",
    is_flag=True,
    help="vllm only: install a --version outside the supported range anyway.",
)
@click.option("--no-probe", is_flag=True, help="Skip the probe that builds and steps the engine.")
@click.option("--where", is_flag=True, help="Print the install script's path, and install nothing.")
def install(
    engine: str,
    venv: Path | None,
    version: str | None,
    any_version: bool,
    no_probe: bool,
    where: bool,
) -> None:
    """Install ENGINE's scheduler (vllm, sglang) or torch's CPU build (torch-cpu) into VENV.

    VENV defaults to the venv schedspec runs in; it is created if missing. The scripts
    ship inside schedspec, so this works in a checkout or not. SGLang wants a venv of its
    own (its pins exclude vLLM's).
    """
    script = script_path(engine)
    if where:
        click.echo(str(script))
        return
    target = venv if venv is not None else current_venv()
    if target is None:
        raise click.UsageError(
            f"VENV: schedspec runs in no venv ({sys.prefix}); name the venv to install "
            f"{engine} into: schedspec install {engine} VENV"
        )
    arguments = script_arguments(engine, target, version, any_version, no_probe)
    # Through bash, not the file's own mode: an installed wheel may not keep it executable.
    done = subprocess.run(["bash", str(script), *arguments], check=False)
    sys.exit(0 if done.returncode == 0 else 1)
