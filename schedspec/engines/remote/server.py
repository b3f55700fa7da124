"""The engine's process: `python -m schedspec.engines.remote.server ENGINE`.

process.py starts it from the interpreter named with --left-python, --right-python or
--python; ENGINE is read as --engine reads it (engines/registry.py), in this
interpreter. It says hello (wire.py), then how loading the engine went, then answers
each wire.Call with one reply, in order, until the harness closes the pipe.

Every engine call goes through the same door as in-process (engines/boundary.py): an
exit the engine attempts in Python (sys.exit, os._exit) is trapped and answered as
EngineExitError, and what the engine raises is answered as raised. The step time
limit is the harness's: it times the whole round trip and, past it, stops this
process after asking for its stack.

File descriptors: the harness's pipes arrive on stdin and stdout and move at once to
descriptors of their own; 0 becomes /dev/null, and 1 and 2 the harness's stderr
(--stderr-fd), so what the engine prints, from Python or native code, reaches the
terminal and never the channel. Until then (Python's start, importing this module)
stderr is a pipe the harness reads if no hello comes: "No module named schedspec".
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

from schedspec.engines import boundary
from schedspec.engines.boundary import through_the_door
from schedspec.engines.capabilities import claimed_capabilities
from schedspec.engines.dependencies import MissingDependencyError
from schedspec.engines.errors import BUILDING
from schedspec.engines.profiles import claimed_profiles
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.engines.registry import load_engine_factory
from schedspec.engines.remote.errors import ErrorRecord, pack_error
from schedspec.engines.remote.wire import (
    BUILD,
    MAX_HELD_OUTPUTS,
    Call,
    Channel,
    OutputRef,
    UnreadableError,
    dumps,
    hello,
)
from schedspec.spec import SchedulerOutput

# How often the process checks that the harness is alive (seconds): one killed with
# SIGKILL cannot close the pipe in time for a call that hangs here.
PARENT_POLL_SECONDS = 0.5
# Taken before any engine call: the door stands in for os._exit during each one.
_exit_now = os._exit
# The frames a traceback sent back leaves out: this module's and the door's.
_OWN_FILES = frozenset({__file__, boundary.__file__})
# The adapter methods a Call may name: the protocol's, nothing else.
METHODS = frozenset(
    {
        "add_request",
        "schedule",
        "update_from_output",
        "update_draft_token_ids",
        "finish_requests",
        "snapshot",
    }
)


@dataclass
class Hosted:
    """An engine built here, and its schedule() outputs the harness may hand back."""

    adapter: EngineAdapter
    outputs: dict[int, SchedulerOutput] = field(default_factory=dict)
    next_handle: int = 0

    def hold(self, output: SchedulerOutput) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.outputs[handle] = output
        if len(self.outputs) > MAX_HELD_OUTPUTS:
            del self.outputs[next(iter(self.outputs))]
        return handle


class ServerError(Exception):
    """The harness asked for something the protocol does not have (a bug of ours)."""


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    channel = _take_pipes(args.stderr_fd)
    _exit_with(os.getppid())
    # Ctrl-C is the harness's to handle (it stops this process); a hang's stack is
    # written where the harness reads it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, file=args.stack_fd, all_threads=True)
    channel.send(hello())
    factory = _load(channel, args.engine)
    if factory is not None:
        _serve(channel, factory)
    return 0


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m schedspec.engines.remote.server")
    parser.add_argument("engine", help="a registered engine or module:factory")
    parser.add_argument("--stderr-fd", type=int, required=True)
    parser.add_argument("--stack-fd", type=int, required=True)
    return parser.parse_args(argv)


def _take_pipes(stderr_fd: int) -> Channel:
    """The harness's pipes on descriptors of their own (os.dup's are not inherited by
    what the engine starts); stdin from /dev/null; stdout and stderr to the terminal."""
    channel = Channel(os.dup(0), os.dup(1))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(stderr_fd, 1)
    os.dup2(stderr_fd, 2)
    os.close(stderr_fd)
    return channel


def _exit_with(parent: int) -> None:
    """End this process when the harness's ends, even mid-call."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        _exit_now(1)

    threading.Thread(target=watch, name="schedspec-parent-watch", daemon=True).start()


def _load(channel: Channel, engine: str) -> EngineFactory | None:
    """The engine's factory, having told the harness how loading it went: ("loaded",),
    ("usage", blame, message) for what the run plan refuses, or ("raised", record)
    for what importing the engine's module raised (the engine's failure)."""
    try:
        factory = load_engine_factory(engine)
    except MissingDependencyError as err:  # this interpreter lacks what it needs
        channel.send(("usage", "python", str(err)))
    except ValueError as err:  # a name that does not resolve here
        channel.send(("usage", "engine", str(err)))
    except BaseException as err:
        channel.send(("raised", _packed(err)))
    else:
        channel.send(("loaded",))
        return factory
    return None


def _serve(channel: Channel, factory: EngineFactory) -> None:
    engines: dict[int, Hosted] = {}
    while True:
        try:
            call = channel.recv()
        except EOFError:  # the harness is done with us
            return
        except UnreadableError as err:
            channel.send(("broken", f"a call this process cannot read: {err}"))
            continue
        if not isinstance(call, Call):
            channel.send(("broken", f"a {type(call).__name__}, not a Call"))
            continue
        for engine in call.dropped:
            engines.pop(engine, None)
        channel.send_frame(_answer(engines, factory, call))


def _answer(engines: dict[int, Hosted], factory: EngineFactory, call: Call) -> bytes:
    """The reply to `call`, pickled: the value, or what the engine raised."""
    try:
        value = _run(engines, factory, call)
    except ServerError as err:
        return dumps(("broken", str(err)))
    except BaseException as err:  # the engine's, the door's EngineExitError included
        return dumps(("raised", _packed(err)))
    try:
        return dumps(("ok", value))
    except Exception as err:  # what pickling a stranger's object raises varies
        return dumps(("unsendable", f"{type(err).__name__}: {err}"))


def _packed(err: BaseException) -> ErrorRecord:
    """`err` packed with its traceback from the engine's own first frame: this
    server's and the door's say nothing about the engine."""
    tb: TracebackType | None = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return pack_error(err.with_traceback(tb))


def _run(engines: dict[int, Hosted], factory: EngineFactory, call: Call) -> object:
    if call.op == BUILD:
        adapter = through_the_door(BUILDING, factory, *call.args)
        engines[call.engine] = Hosted(adapter)
        try:  # read as GuardedEngine reads them, so a refusal names the adapter's class
            profiles = through_the_door(BUILDING, claimed_profiles, adapter)
            return profiles, through_the_door(BUILDING, claimed_capabilities, adapter)
        except BaseException as err:
            return _packed(err)
    hosted = engines.get(call.engine)
    if hosted is None or call.op not in METHODS:
        raise ServerError(f"no engine {call.engine} or no method {call.op!r} here")
    args = call.args
    if call.op == "update_from_output" and isinstance(args[0], OutputRef):
        held = hosted.outputs.pop(args[0].handle, None)
        if held is None:
            raise ServerError(f"no schedule() output {args[0].handle} held here")
        args = (held, *args[1:])
    value = through_the_door(f"{call.op}()", getattr(hosted.adapter, call.op), *args)
    if call.op == "schedule":  # and a handle to hand it back by (not to a stranger)
        return value, hosted.hold(value) if isinstance(value, SchedulerOutput) else None
    return value


if __name__ == "__main__":
    sys.exit(main())
