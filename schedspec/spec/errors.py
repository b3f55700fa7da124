"""Errors raised where bad input enters: configs, requests, model outputs."""

from __future__ import annotations


class SpecInputError(ValueError):
    """A value that the spec refuses, naming the offending field and its bound.

    It subclasses ValueError so callers that only know the standard library
    can still catch it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ConfigError(SpecInputError):
    """A SchedulerConfig field out of its bounds."""


class RequestError(SpecInputError):
    """A request (or an operation on one) that the scheduler refuses at the door."""


class OutputError(SpecInputError):
    """A ModelRunnerOutput or draft proposal that does not match the step it answers."""
