"""The install scripts refuse a bad command line before touching anything, and say how
to call them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.mark.parametrize("script", ["install_torch_cpu.sh", "install_vllm.sh", "install_sglang.sh"])
@pytest.mark.parametrize("args", [[], ["one-venv", "another"]])
def test_a_script_wants_exactly_one_venv(script: str, args: list[str], tmp_path: Path) -> None:
    result = subprocess.run(
        [str(SCRIPTS / script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == f"{script}: error: usage: scripts/{script} VENV_DIR\n"
    assert list(tmp_path.iterdir()) == []  # no venv created
