"""Failures across the pipe, kept to the in-process contract (engines/errors.py).

- What the engine raises in its process is packed there (pack_error) and raised again
  here (rebuild_error) as its own type when this process has that type's module
  imported (ValueError, the spec's errors, EngineExitError for an exit the child's door
  trapped), else as a stand-in of that name deriving from the nearest base this
  process has (ForeignError): a refusal stays a ValueError, so CheckedEngine takes it
  for one, and the harness's door tags it with the call as it would in-process. The
  child's traceback, as text, is a note on it (the reports print notes).
- An engine's process that ends inside a call (a kill, a crash, os._exit from native
  code) is EngineProcessExitError, an EngineExitError: the engine ended its process.
- An interpreter that cannot serve the engine is RemoteSetupError, a ValueError the
  run plan turns into a usage error on the flag to blame.
"""

from __future__ import annotations

import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Literal

from schedspec.engines.errors import EngineExitError
from schedspec.engines.remote.wire import UnreadableError, dumps, loads


@dataclass(frozen=True)
class ErrorRecord:
    """An exception raised in the engine's process, as plain data."""

    lineage: tuple[tuple[str, str], ...]  # (module, qualname) of its type, then its bases
    message: str
    args: bytes | None  # its args, pickled (None: they do not pickle)
    attributes: bytes | None  # its __dict__ (notes, the call it was tagged with), likewise
    traceback: str


class ForeignError:
    """Mixed into the stand-in for an exception type that only the engine's process has."""


class RemoteSetupError(ValueError):
    """The interpreter named cannot serve the engine: it does not start, runs no
    schedspec or another one, or lacks what the engine needs. `blame` is the flag at
    fault: "python" (the interpreter's) or "engine" (a name that does not resolve there)."""

    def __init__(self, message: str, blame: Literal["python", "engine"] = "python") -> None:
        super().__init__(message)
        self.blame = blame


class EngineProcessExitError(EngineExitError):
    """The engine's process ended inside a call: killed, crashed, or ended from native
    code or a thread of its own, where no door can trap it. In-process the run would
    have ended with it; here the engine ended its process all the same (exit 4)."""

    def __init__(self, call: str, status: int | None, process: str) -> None:
        super().__init__(call, status)
        self.args = (f"the engine's process ({process}) {ended(status)} in {call}",)


def ended(status: int | None) -> str:
    """How a process ended, from its exit status (negative: the signal that ended it)."""
    if status is None:
        return "was stopped"
    if status < 0:
        return f"was ended by {signal.Signals(-status).name}"
    return f"exited with status {status}"


def _pickled(value: object) -> bytes | None:
    try:
        return dumps(value)
    except Exception:  # what pickling a stranger's object raises varies
        return None


def _text(err: BaseException) -> str:
    try:
        return str(err)
    except Exception:
        return f"<{type(err).__name__}: str() raised>"


def pack_error(err: BaseException) -> ErrorRecord:
    """`err` as data the harness can rebuild it from (in the engine's process)."""
    lineage = tuple(
        (cls.__module__, cls.__qualname__)
        for cls in type(err).__mro__
        if issubclass(cls, BaseException)
    )
    return ErrorRecord(
        lineage,
        _text(err),
        _pickled(err.args),
        _pickled(vars(err)),
        "".join(traceback.format_exception(err)),
    )


def rebuild_error(record: ErrorRecord, origin: str) -> BaseException:
    """The exception `record` describes, raised in `origin` (the engine's process, in
    words), with that process's traceback as a note."""
    own = _loaded_class(*record.lineage[0])
    message = record.message
    err = None
    if own is not None:  # its own type, with its own args if they load here
        err = _rebuilt(own, _unpickled(record.args), message) or _rebuilt(own, None, message)
    if err is None:
        err = _rebuilt(_stand_in(record.lineage), None, message)
    if err is None:  # a base that would not take even the message alone
        err = _stand_in_type(*record.lineage[0], Exception)(message)
    attributes = _unpickled(record.attributes)
    if isinstance(attributes, dict):
        vars(err).update(attributes)
    err.add_note(f"raised in the engine's process ({origin}):\n{record.traceback.rstrip()}")
    return err


def _rebuilt(cls: type[BaseException], args: object, message: str) -> BaseException | None:
    """An instance of `cls` with `args` (not a tuple: the message alone), built as
    unpickling builds one (no __init__, whose signature may differ from args:
    SpecInputError's takes two), or None where `cls` refuses them."""
    if not isinstance(args, tuple):
        args = (message,)
    try:
        err = cls.__new__(cls, *args)
        err.args = args
    except Exception:
        return None
    return err


def _unpickled(payload: bytes | None) -> object:
    if payload is None:
        return None
    try:
        return loads(payload)
    except UnreadableError:
        return None


def _loaded_class(module: str, qualname: str) -> type[BaseException] | None:
    """The exception class `module`.`qualname`, if its module is imported here."""
    found: object = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return None


def _stand_in(lineage: tuple[tuple[str, str], ...]) -> type[BaseException]:
    """A type named as the first of `lineage`, deriving from the first base this
    process has (BaseException at the latest)."""
    base = next(cls for cls in (_loaded_class(*entry) for entry in lineage[1:]) if cls is not None)
    return _stand_in_type(*lineage[0], base)


# One stand-in type per foreign name and base: refusals recur at every example.
_STAND_INS: dict[tuple[str, str, type[BaseException]], type[BaseException]] = {}


def _stand_in_type(module: str, qualname: str, base: type[BaseException]) -> type[BaseException]:
    key = (module, qualname, base)
    if key not in _STAND_INS:
        name = qualname.rsplit(".", 1)[-1]
        made = type(name, (ForeignError, base), {"__module__": module, "__qualname__": qualname})
        assert issubclass(made, BaseException)
        _STAND_INS[key] = made
    return _STAND_INS[key]
