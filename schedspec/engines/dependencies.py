"""The optional dependencies some engines and commands need, and how to get each.

Installing schedspec gives its core: the reference, the harness, the Z3
proofs and the simulator. torch (the gpu engine, swarm mode, `run --execute`),
vLLM and SGLang (their schedulers under the suite; each in a venv of its own), Ray
(campaigns on a cluster, --ray) and CrossHair (the contract check) come separately.
Asking for one of them where it is missing raises
MissingDependencyError, whose message says what brings it, before anything is
imported: the commands report it as a usage error instead of a traceback. Each hint
names a command that works wherever the user stands, in a checkout or not:
`schedspec install ENGINE` (the scripts ship in the package), or pip with an extra's
own requirements (schedspec is not on PyPI, so `pip install 'schedspec[ray]'` would
find nothing).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from schedspec.install import install_command


@dataclass(frozen=True)
class OptionalDependency:
    module: str  # the import that must succeed
    name: str  # what the user knows it as
    install: str  # what brings it, as a sentence fragment

    def missing(self) -> bool:
        # find_spec looks the module up without importing it (so without its cost),
        # and reports a module set to None in sys.modules as missing.
        return importlib.util.find_spec(self.module) is None


def extra_pip_install(extra: str) -> str:
    """`pip install` of an extra's requirements, read from schedspec's installed metadata
    (pyproject.toml's optional-dependencies), so the command works outside a checkout;
    where that metadata is missing (schedspec imported from a folder, not installed),
    the extra of a checkout."""
    try:
        required = importlib.metadata.requires("schedspec") or []
    except importlib.metadata.PackageNotFoundError:
        required = []
    marker = f'extra == "{extra}"'
    pins = [r.split(";")[0].strip() for r in required if r.replace("'", '"').endswith(marker)]
    if not pins:
        return f"pip install -e '.[{extra}]' in a checkout of schedspec"
    return "pip install " + " ".join(f"'{pin}'" for pin in pins)


TORCH = OptionalDependency(
    "torch",
    "torch",
    f"install torch: on a CPU-only machine its CPU build ({install_command('torch-cpu')}), "
    f"else the gpu extra's ({extra_pip_install('gpu')})",
)
VLLM = OptionalDependency(
    "vllm",
    "vLLM",
    f"install vLLM's scheduler into this venv with {install_command('vllm')}",
)
RAY = OptionalDependency(
    "ray",
    "Ray",
    f"install the ray extra ({extra_pip_install('ray')})",
)
SGLANG = OptionalDependency(
    "sglang",
    "SGLang",
    "install SGLang's scheduler into a venv of its own (its pins exclude vLLM's) with "
    f"{install_command('sglang')} VENV and run schedspec from that venv",
)
CROSSHAIR = OptionalDependency(
    "crosshair",
    "CrossHair (crosshair-tool)",
    f"install the formal extra ({extra_pip_install('formal')})",
)


class MissingDependencyError(ValueError):
    """What was asked for needs an optional dependency this environment lacks."""

    def __init__(self, needed_by: str, dependency: OptionalDependency) -> None:
        super().__init__(
            f"{needed_by} needs {dependency.name}, which is not installed here: "
            f"{dependency.install}"
        )
        self.dependency = dependency


def require(needed_by: str, *dependencies: OptionalDependency) -> None:
    """Raise MissingDependencyError for the first of `dependencies` that is missing;
    `needed_by` names what asked for it (an engine, a flag)."""
    for dependency in dependencies:
        if dependency.missing():
            raise MissingDependencyError(needed_by, dependency)


class BrokenDependencyError(MissingDependencyError):
    """Installed, but importing it fails (a half-installed or mismatched package): as
    good as missing for the run, and said so with the import's own error."""

    def __init__(self, needed_by: str, dependency: OptionalDependency, error: Exception) -> None:
        ValueError.__init__(
            self,
            f"{needed_by} needs {dependency.name}, which is installed here but fails to "
            f"import ({type(error).__name__}: {error}); reinstall it: {dependency.install}",
        )
        self.dependency = dependency


def import_required(needed_by: str, dependency: OptionalDependency) -> ModuleType:
    """The dependency's module, imported: MissingDependencyError where it is missing,
    BrokenDependencyError where importing it fails (find_spec alone finds a broken
    package)."""
    require(needed_by, dependency)
    try:
        return importlib.import_module(dependency.module)
    except Exception as err:
        raise BrokenDependencyError(needed_by, dependency, err) from err
