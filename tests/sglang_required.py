"""Skip an SGLang test where SGLang is not installed, with the install step as the reason;
in CI, where the SGLang tests must run, fail instead.

SGLang lives in a venv of its own (its pins exclude vLLM's: docs/ENGINES.md), so CI runs the
suite twice: in .venv (vLLM's), where the SGLang tests are skipped, and in the SGLang
venv, which CI names in SCHEDSPEC_SGLANG_VENV, where a missing SGLang is a failure. A CI
run that names no SGLang venv fails too: it would run no SGLang test anywhere.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from schedspec.adapters.sglang.runtime import INSTALL_STEP

SGLANG_VENV_VARIABLE = "SCHEDSPEC_SGLANG_VENV"


def _is_this_venv(venv: str) -> bool:
    return Path(sys.prefix).resolve() == Path(venv).resolve()


def require_sglang(what: str) -> None:
    """Call at a test module's top level or in a test: `what` names what needs SGLang."""
    if importlib.util.find_spec("sglang") is not None:
        return
    venv = os.environ.get(SGLANG_VENV_VARIABLE)
    if os.environ.get("CI") and (venv is None or _is_this_venv(venv)):
        where = f"in {venv}" if venv else f"anywhere ({SGLANG_VENV_VARIABLE} is not set)"
        pytest.fail(
            f"CI runs {what}, but SGLang is not installed {where}: run {INSTALL_STEP}",
            pytrace=False,
        )
    if venv is not None and not _is_this_venv(venv):
        reason = f"SGLang runs from its own venv, {venv}, where {what} run"
    else:
        reason = f"SGLang is not installed: run {INSTALL_STEP} to run {what}"
    pytest.skip(reason, allow_module_level=True)
