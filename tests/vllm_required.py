"""Skip a vLLM test where vLLM is not installed, with the install step as the reason;
in CI (CI set), where the vLLM tests must run, fail instead."""

from __future__ import annotations

import importlib.util
import os

import pytest

from schedspec.adapters.vllm.runtime import INSTALL_STEP


def require_vllm(what: str) -> None:
    """Call at a test module's top level or in a test: `what` names what needs vLLM."""
    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI runs {what}, but vLLM is not installed: run {INSTALL_STEP}", pytrace=False)
    pytest.skip(f"vLLM is not installed: run {INSTALL_STEP} to run {what}", allow_module_level=True)
