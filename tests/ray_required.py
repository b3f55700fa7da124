"""Skip a Ray test where Ray is not installed, with the extra that brings it as the reason;
in CI (CI set), where the Ray tests must run, fail instead."""

from __future__ import annotations

import importlib.util
import os

import pytest

from schedspec.engines.dependencies import RAY


def require_ray(what: str) -> None:
    """Call at a test module's top level or in a test: `what` names what needs Ray."""
    if importlib.util.find_spec("ray") is not None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI runs {what}, but Ray is not installed: {RAY.install}", pytrace=False)
    pytest.skip(f"Ray is not installed: {RAY.install} to run {what}", allow_module_level=True)
