"""The execution layer's input error: a bad value named where it enters."""

from __future__ import annotations

from schedspec.spec import SpecInputError


class ExecutionError(SpecInputError):
    """A model config, token id or scheduler output the runner cannot execute."""
