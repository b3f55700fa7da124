"""Where SGLang is missing, its tests skip with the install step as the reason, except in
the venv CI names for them (or in a CI run that names none), where they fail."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.sglang_required import SGLANG_VENV_VARIABLE, require_sglang


@pytest.fixture
def sglang_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "sglang" else real(name, *args),
    )
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(SGLANG_VENV_VARIABLE, raising=False)


@pytest.mark.usefixtures("sglang_missing")
class TestWhereSGLangIsMissing:
    def test_a_developer_run_skips_naming_the_script(self) -> None:
        with pytest.raises(pytest.skip.Exception, match=r"schedspec install sglang VENV"):
            require_sglang("the SGLang tests")

    def test_ci_in_another_venv_skips_naming_the_sglang_venv(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        monkeypatch.setenv("CI", "1")
        monkeypatch.setenv(SGLANG_VENV_VARIABLE, str(tmp_path / ".venv-sglang"))
        with pytest.raises(pytest.skip.Exception, match="runs from its own venv"):
            require_sglang("the SGLang tests")

    def test_ci_in_the_sglang_venv_fails(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CI", "1")
        monkeypatch.setenv(SGLANG_VENV_VARIABLE, sys.prefix)
        with pytest.raises(pytest.fail.Exception, match="SGLang is not installed in"):
            require_sglang("the SGLang tests")

    def test_ci_that_names_no_sglang_venv_fails(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("CI", "1")
        with pytest.raises(pytest.fail.Exception, match="anywhere"):
            require_sglang("the SGLang tests")
