"""The pipe between the harness and an engine's process: framed pickles, and the hello
that checks on connect that both ends run the same schedspec.

Why pickle is safe here: both ends are schedspec's own code (the child is
`python -m schedspec.engines.remote.server`, started by the harness from an
interpreter the user named), and the bytes travel only over two anonymous pipes that
the two processes alone hold: nothing is read from a file, a socket or another user.
Pickle carries the spec's dataclasses as they are, at C speed, where a format of our
own would mirror them field by field. What it needs is the same classes on both
ends: the hello, the child's first message (builtins only, readable by any version),
names schedspec's version, this protocol's and a fingerprint of the fields of every
class that crosses, and the harness refuses a child that differs (mismatch).

Loading resolves classes only from modules the loading process has imported already
(loads): a value naming a class of the engine's own (a vLLM object left in a State) is
refused as unreadable, never imported into the harness by the way.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import pickle
import struct
import sys
from typing import NamedTuple

import schedspec
from schedspec.engines.capabilities import Capability
from schedspec.spec import (
    CachedRequestData,
    KVState,
    ModelRunnerOutput,
    NewRequestData,
    Request,
    RequestOutput,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    SGLangState,
    State,
)

# Bumped whenever the messages of server.py and process.py change shape (2: a build
# answers with the capabilities too).
PROTOCOL = 2
# Python 3.8 and later read it; it sends large buffers without copies.
PICKLE_PROTOCOL = 5
_HEADER = struct.Struct(">Q")  # each frame: its length, then its pickle
# The classes that cross the pipe, in the calls and the replies (and Request, a plain
# class, by the attributes of an instance).
WIRE_CLASSES: tuple[type, ...] = (
    SchedulerConfig,
    SchedulerOutput,
    NewRequestData,
    CachedRequestData,
    ModelRunnerOutput,
    RequestOutput,
    RequestStatus,
    State,
    RequestState,
    KVState,
    SGLangState,
    Capability,
)


class Call(NamedTuple):
    """A request to the engine's process; it answers each with one reply, in order:
    ("ok", value), ("raised", errors.ErrorRecord), or ("unsendable", why the value
    would not pickle) and ("broken", what went wrong in the server itself)."""

    op: str  # BUILD, or the name of the adapter method to call
    engine: int  # the engine's id (the harness numbers them)
    args: tuple[object, ...]
    dropped: tuple[int, ...] = ()  # engines the harness let go of since its last call


class OutputRef(NamedTuple):
    """A schedule() output handed back by reference: the engine's process passes the
    very object its engine returned, as in-process (an engine may check identity)."""

    handle: int


# Call.op of building an engine (args: the SchedulerConfig); the value is its claimed
# profiles and declared capabilities, or the ErrorRecord of reading them.
BUILD = "build"
# The outputs each side keeps per engine for OutputRef, the oldest let go beyond it
# (both sides alike, so they agree): far more than any pipeline holds in flight.
MAX_HELD_OUTPUTS = 16


class UnreadableError(Exception):
    """A frame that does not load here: it names a class this process has not imported
    (or is not a pickle at all)."""


class Channel:
    """Two pipe ends, one to read frames from and one to write them to.

    Blocking reads go through os.read, so a signal handler that raises (the step
    watchdog's SIGALRM, Ctrl-C) interrupts a wait on the other end as it interrupts an
    engine call in this process. EOFError: the other end closed its side (it exited)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd

    def send(self, message: object) -> None:
        self.send_frame(dumps(message))

    def send_frame(self, payload: bytes) -> None:
        view = memoryview(_HEADER.pack(len(payload)) + payload)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def recv_frame(self, most: int | None = None) -> bytes:
        """The next frame; ValueError if it says it is longer than `most` bytes."""
        (size,) = _HEADER.unpack(self._read_exactly(_HEADER.size))
        if most is not None and size > most:
            raise ValueError(f"a frame of {size} bytes, more than {most}")
        return self._read_exactly(size)

    def recv(self) -> object:
        return loads(self.recv_frame())

    def _read_exactly(self, size: int) -> bytes:
        first = os.read(self.read_fd, size)
        if len(first) == size:  # the common case: the whole frame at once
            return first
        buffer = bytearray(first)
        while len(buffer) < size:
            if not first:
                raise EOFError("the other end of the pipe closed it")
            first = os.read(self.read_fd, size - len(buffer))
            buffer += first
        return bytes(buffer)


def dumps(message: object) -> bytes:
    return pickle.dumps(message, PICKLE_PROTOCOL)


class _LoadedModulesOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if module not in sys.modules:
            raise UnreadableError(f"it names {module}.{name}, and {module} is not imported here")
        return super().find_class(module, name)


def loads(payload: bytes) -> object:
    """A frame's message, with classes only from modules imported here; UnreadableError else."""
    try:
        return _LoadedModulesOnly(io.BytesIO(payload)).load()
    except UnreadableError:
        raise
    except Exception as err:  # what a damaged or foreign pickle raises varies
        raise UnreadableError(f"{type(err).__name__}: {err}") from None


# ------------------------------------------------------------------------- the hello


def _fields(cls: type) -> list[tuple[str, str]]:
    if dataclasses.is_dataclass(cls):
        return [(f.name, str(f.type)) for f in dataclasses.fields(cls)]
    if issubclass(cls, enum.Enum):
        return [(member.name, str(member.value)) for member in cls]
    return [(name, str(kind)) for name, kind in cls.__annotations__.items()]  # NamedTuple


def wire_schema() -> str:
    """The fields of every class that crosses the pipe, as one string: two schedspecs
    that print the same can exchange pickles of them."""
    shapes = [f"{cls.__qualname__}{_fields(cls)}" for cls in WIRE_CLASSES]
    shapes.append(f"Request{sorted(vars(Request('r', (0,), 1)))}")
    return "; ".join(shapes)


def hello() -> dict[str, object]:
    """What the child says first: who it is and what it speaks (builtins only)."""
    return {
        "schedspec": schedspec.__version__,
        "protocol": PROTOCOL,
        "schema": wire_schema(),
        "python": sys.version.split()[0],
        "pid": os.getpid(),
    }


def mismatch(theirs: object) -> str | None:
    """What differs between the child's hello and this process's, or None."""
    if not isinstance(theirs, dict):
        return f"it said {type(theirs).__name__}, not schedspec's hello"
    ours = hello()
    if theirs.get("schema") == ours["schema"] and all(
        theirs.get(key) == ours[key] for key in ("schedspec", "protocol")
    ):
        return None
    detail = "" if theirs.get("schema") == ours["schema"] else ", and other spec classes"
    return (
        f"it runs schedspec {theirs.get('schedspec')} (engine protocol "
        f"{theirs.get('protocol')}{detail}), this process schedspec {ours['schedspec']} "
        f"(engine protocol {ours['protocol']})"
    )
