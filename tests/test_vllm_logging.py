"""Quiet vLLM commands: unless the user configured vLLM's logging, the adapter keeps only
errors from vLLM's logger and from torch's "Triton not available" warning."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from schedspec.adapters.vllm.runtime import (
    QUIETED_LOGGERS,
    VLLM_LOGGING_VARIABLES,
    quiet_vllm_logging,
)


@pytest.fixture
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No VLLM_LOGGING_* variable and no level on the quieted loggers; levels restored after."""
    for name in VLLM_LOGGING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    saved = {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}
    for name in QUIETED_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def _levels() -> dict[str, int]:
    return {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}


@pytest.mark.usefixtures("unconfigured")
def test_unconfigured_loggers_keep_only_errors() -> None:
    quiet_vllm_logging()
    assert _levels() == {"vllm": logging.ERROR, "torch._library.triton": logging.ERROR}
    assert not logging.getLogger("torch._library.triton").isEnabledFor(logging.WARNING)
    assert logging.getLogger("vllm.config.model").isEnabledFor(logging.ERROR)


@pytest.mark.usefixtures("unconfigured")
@pytest.mark.parametrize("variable", VLLM_LOGGING_VARIABLES)
def test_a_vllm_logging_variable_leaves_every_logger_alone(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, "1")
    quiet_vllm_logging()
    assert _levels() == {"vllm": logging.NOTSET, "torch._library.triton": logging.NOTSET}


@pytest.mark.usefixtures("unconfigured")
def test_a_logger_the_user_gave_a_level_keeps_it() -> None:
    logging.getLogger("vllm").setLevel(logging.DEBUG)
    quiet_vllm_logging()
    assert _levels() == {"vllm": logging.DEBUG, "torch._library.triton": logging.ERROR}
