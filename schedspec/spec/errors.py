"""Errors raised where bad input enters: configs, requests, model outputs."""

from __future__ import annotations

import reprlib

# How much of a bad value an error message shows: enough to recognise it, never a
# whole megabyte list from a damaged file, and never deeper than a few levels
# (a deeply nested value must not make the message itself overflow the stack).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 3
_SHOWN.maxtuple = _SHOWN.maxlist = 8
_SHOWN.maxdict = _SHOWN.maxset = 6
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlong = 40


def shown(value: object) -> str:
    """A short repr of a value for an error message: long and deep values are elided."""
    try:
        return _SHOWN.repr(value)
    except ValueError:  # an int past the interpreter's digit limit for str()
        return f"<{type(value).__name__} too large to show>"


def named(key: object) -> str:
    """A key of a damaged input as a field name: itself when it is a plain name, else its
    short repr (an empty, long or odd key still names something readable)."""
    if isinstance(key, str) and key.isidentifier() and len(key) <= 60:
        return key
    return shown(key)


class SpecInputError(ValueError):
    """A value that the spec refuses, naming the offending field and its bound.

    It subclasses ValueError so callers that only know the standard library
    can still catch it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message  # the message without the field, to re-raise under a longer name


class ConfigError(SpecInputError):
    """A SchedulerConfig field out of its bounds."""


class RequestError(SpecInputError):
    """A request (or an operation on one) that the scheduler refuses at the door."""


class OutputError(SpecInputError):
    """A ModelRunnerOutput or draft proposal that does not match the step it answers."""
