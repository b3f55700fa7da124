"""What needs an optional dependency says, where it is missing, what brings it: a usage
error (exit 2), no traceback. The dependency is made missing in this process (an
import of it fails), so no second venv is needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.cli.main import main

FINDING = str(
    Path(__file__).resolve().parent.parent / "docs/findings/vllm-spec-decode-padding.json"
)
# Each hint names a command that works outside a checkout too.
GPU_EXTRA = ("needs torch", "pip install 'torch", "schedspec install torch-cpu")
VLLM_SCRIPT = ("needs vLLM", "schedspec install vllm")
SGLANG_SCRIPT = ("needs SGLang", "schedspec install sglang VENV", "a venv of its own")
FORMAL_EXTRA = ("needs CrossHair (crosshair-tool)", "pip install 'crosshair-tool")


@pytest.mark.parametrize(
    ("module", "args", "says"),
    [
        ("torch", ["check", "--engine", "gpu"], ("'--engine'", *GPU_EXTRA)),
        ("torch", ["check", "--engine", "gpu", "--instances", "64"], GPU_EXTRA),
        ("torch", ["replay", FINDING, "--engine", "gpu"], GPU_EXTRA),
        ("torch", ["diff", "--right", "gpu"], ("'--right'", *GPU_EXTRA)),
        ("torch", ["run", "--execute"], ("--execute needs torch", *GPU_EXTRA)),
        ("torch", ["simulate", "--engine", "gpu", "--no-plots"], GPU_EXTRA),
        ("vllm", ["check", "--engine", "vllm"], ("engine 'vllm'", *VLLM_SCRIPT)),
        ("vllm", ["diff-replay", FINDING, "--left", "vllm", "--right", "gpu"], VLLM_SCRIPT),
        ("vllm", ["simulate", "--engine", "vllm", "--no-plots"], VLLM_SCRIPT),
        ("sglang", ["check", "--engine", "sglang"], ("engine 'sglang'", *SGLANG_SCRIPT)),
        ("sglang", ["diff", "--right", "sglang"], ("engine 'sglang'", *SGLANG_SCRIPT)),
        ("sglang", ["simulate", "--engine", "sglang", "--no-plots"], SGLANG_SCRIPT),
        ("crosshair", ["prove", "--contracts"], ("--contracts", *FORMAL_EXTRA)),
    ],
)
def test_a_missing_dependency_is_a_usage_error_naming_what_brings_it(
    module: str,
    args: list[str],
    says: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import` of it fails here
    monkeypatch.chdir(tmp_path)  # nothing is written, but if it were it would land here
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(
        result.exception, ModuleNotFoundError
    )
    error = " ".join(result.stderr.split())
    assert error.startswith("Usage: ") and "Error: " in error
    assert all(part in error for part in says), error


def test_the_module_factory_of_a_registered_engine_needs_what_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    result = CliRunner().invoke(
        main, ["check", "--engine", "schedspec.adapters.vllm.engine:VllmEngine"]
    )
    assert result.exit_code == 2
    assert "schedspec install vllm" in result.stderr
