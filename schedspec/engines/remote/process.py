"""The engine's process, seen from the harness: started, spoken to, stopped, reaped.

EngineProcess.start runs `PYTHON -m schedspec.engines.remote.server ENGINE` in a
session of its own (Ctrl-C at the terminal is the harness's to handle), checks its
hello (wire.mismatch) and waits while it loads the engine. Anything short of a loaded
engine is refused clearly: an interpreter that does not run, runs no schedspec (what
it printed is in the message) or another one, or lacks what the engine needs, is a
RemoteSetupError naming the flag to blame; an engine module that raises on import is
the engine's failure, raised as it raised.

request() is one round trip. However it ends, the pipe stays in step or the process
goes: end of file (the process ended: killed, crashed, os._exit from native code) is
EngineProcessExitError for the call; the step watchdog's StepTimeoutError, Ctrl-C or
anything else that interrupts the wait stops the process first (a hang's stack, which
faulthandler writes on SIGUSR1, is added to the timeout as a note). The process is
always reaped: by stop() and close(), when the EngineProcess is collected, and at exit
(weakref.finalize); never by a forked copy of this process, which shares the pipes
but not the child.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import tempfile
import time
import weakref
from typing import IO

from schedspec.engines.errors import EngineContractError
from schedspec.engines.remote.errors import (
    EngineProcessExitError,
    ErrorRecord,
    RemoteSetupError,
    ended,
    rebuild_error,
)
from schedspec.engines.remote.wire import (
    Call,
    Channel,
    UnreadableError,
    dumps,
    loads,
    mismatch,
)
from schedspec.engines.watchdog import StepTimeoutError
from schedspec.install import pip_source

SERVER_MODULE = "schedspec.engines.remote.server"
# How long a fresh interpreter may take to say hello: its start and schedspec's import,
# not the engine's (that is waited for as long as it takes, as in-process).
HELLO_SECONDS = 60.0
# A hello is a few kilobytes; a larger frame is not schedspec talking.
HELLO_MOST_BYTES = 1 << 16
# How long a process told to finish (its pipe closed) gets before SIGKILL, and how
# long a hung one gets to write its stack.
CLOSE_GRACE_SECONDS = 5.0
STACK_WAIT_SECONDS = 1.0


class EngineProcess:
    """One engine server process and the pipe to it."""

    def __init__(self, popen: subprocess.Popen[bytes], stack: IO[bytes], python: str) -> None:
        assert popen.stdin is not None and popen.stdout is not None
        self.popen = popen
        self.python = python
        self.channel = Channel(popen.stdout.fileno(), popen.stdin.fileno())
        self._stack = stack
        self._dropped: list[int] = []
        self._finalizer = weakref.finalize(self, _shut_down, popen, stack, os.getpid())

    @classmethod
    def start(cls, python: str, engine: str) -> EngineProcess:
        """A process of `python` serving `engine`, loaded (see the module docstring)."""
        process = cls(*_spawn(python, engine), python)
        try:
            process._greet()
            process._load(engine)
        except BaseException:
            process.stop()
            raise
        return process

    @property
    def running(self) -> bool:
        return self._finalizer.alive and self.popen.poll() is None

    def describe(self) -> str:
        return f"pid {self.popen.pid}, {self.python}"

    def forget(self, engine: int) -> None:
        """The harness let go of `engine`: the next call tells the process to drop it
        (nothing is sent from here: this runs in __del__, maybe mid-call)."""
        self._dropped.append(engine)

    def request(self, call: str, message: Call) -> object:
        """The reply's value to `message`, for the engine call named `call`; what the
        engine raised, raised here (see the module docstring for the rest)."""
        if not self.running:
            raise EngineProcessExitError(call, self.popen.returncode, self.describe())
        # Swapped before anything allocates: a __del__ that runs meanwhile (the garbage
        # collector) appends to one list or the other, and is sent now or next time.
        dropped, self._dropped = self._dropped, []
        # Pickled first: what fails to pickle leaves the pipe as it was.
        payload = dumps(message._replace(dropped=tuple(dropped)))
        try:
            self.channel.send_frame(payload)
            frame = self.channel.recv_frame()
        except (EOFError, BrokenPipeError):
            raise EngineProcessExitError(call, self._reap(), self.describe()) from None
        except StepTimeoutError as err:
            err.add_note(self._stuck_at())
            self.stop()
            raise
        except BaseException:
            self.stop()
            raise
        return self._value(call, frame)

    def _value(self, call: str, frame: bytes) -> object:
        try:
            reply = loads(frame)
        except UnreadableError as err:
            detail = f"returned what this process cannot read: {err}"
            raise EngineContractError(call, detail) from None
        match reply:
            case ("ok", value):
                return value
            case ("raised", ErrorRecord() as record):
                raise rebuild_error(record, self.describe())
            case ("unsendable", str(detail)):
                raise EngineContractError(call, f"returned what cannot leave its process: {detail}")
        raise RuntimeError(f"the engine server answered {call} with {reply!r}")

    def stop(self) -> None:
        """Kill the process now, and reap it."""
        if self.popen.poll() is None:
            self.popen.kill()
        self._finalizer()

    def close(self) -> None:
        """Let the process finish (its pipe closed), kill it if it does not, and reap it."""
        self._finalizer()

    # ------------------------------------------------------------------ starting

    def _greet(self) -> None:
        """Read the hello; refuse a process that says none, or another schedspec's."""
        ready, _, _ = select.select([self.channel.read_fd], [], [], HELLO_SECONDS)
        if not ready:
            raise RemoteSetupError(
                f"{self.python} did not start schedspec's engine server in {HELLO_SECONDS:g} s"
            )
        try:
            theirs = loads(self.channel.recv_frame(HELLO_MOST_BYTES))
        except (EOFError, UnreadableError, ValueError):
            raise RemoteSetupError(self._no_server()) from None
        problem = mismatch(theirs)
        if problem is not None:
            raise RemoteSetupError(
                f"{self.python} runs another schedspec: {problem}. Both ends must run the "
                f"same (the spec's classes cross the pipe as pickles): {_install_hint(self)}"
            )
        assert self.popen.stderr is not None
        self.popen.stderr.close()  # the server writes to the harness's stderr from now on

    def _no_server(self) -> str:
        """Why the process said no hello, from what it printed before it ended."""
        assert self.popen.stderr is not None
        _wait_or_kill(self.popen)
        printed = self.popen.stderr.read().decode(errors="replace").strip().splitlines()
        said = printed[-1] if printed else f"it {ended(self.popen.returncode)}"
        return f"{self.python} cannot run schedspec's engine server ({said}): {_install_hint(self)}"

    def _load(self, engine: str) -> None:
        """Wait while the process loads the engine (no time limit: a real engine's
        import may take long), and raise what it refused or what the engine raised."""
        call = f"loading engine {engine!r}"
        try:
            outcome = self.channel.recv()
        except EOFError:
            raise EngineProcessExitError(call, self._reap(), self.describe()) from None
        match outcome:
            case ("loaded",):
                return
            case ("usage", "python" | "engine" as blame, str(message)):
                raise RemoteSetupError(f"in {self.python}, {message}", blame)
            case ("raised", ErrorRecord() as record):
                raise rebuild_error(record, self.describe())
        raise RuntimeError(f"the engine server answered {call} with {outcome!r}")

    # ------------------------------------------------------------------ stopping

    def _reap(self) -> int | None:
        """The status of a process whose pipe closed (it is ending), once reaped."""
        _wait_or_kill(self.popen)
        self._finalizer()
        return self.popen.returncode

    def _stuck_at(self) -> str:
        """Where the hung process is, in its own words (faulthandler, on SIGUSR1)."""
        try:
            os.kill(self.popen.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return f"the engine's process ({self.describe()}) had ended"
        deadline = time.monotonic() + STACK_WAIT_SECONDS
        text, size = b"", -1
        while time.monotonic() < deadline and (not text or len(text) != size):
            size = len(text)
            time.sleep(0.05)
            text = os.pread(self._stack.fileno(), 1 << 20, 0)
        where = text.decode(errors="replace").rstrip() or "(it wrote no stack)"
        return f"the engine's process ({self.describe()}) was stuck here:\n{where}"


def _spawn(python: str, engine: str) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """The server process, with the pipes, the harness's stderr and the file for its
    stack; RemoteSetupError for an interpreter that does not run at all."""
    stack = tempfile.TemporaryFile()  # noqa: SIM115  (it lives as long as the process)
    stderr = os.dup(2)
    command = [python, "-m", SERVER_MODULE, engine, "--stderr-fd", str(stderr)]
    try:
        popen = subprocess.Popen(
            [*command, "--stack-fd", str(stack.fileno())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(stderr, stack.fileno()),
            start_new_session=True,
        )
    except OSError as err:
        stack.close()
        raise RemoteSetupError(f"{python}: {err.strerror or err}") from None
    finally:
        os.close(stderr)
    return popen, stack


def _install_hint(process: EngineProcess) -> str:
    source = pip_source()
    if source is None:
        return "install this schedspec there, from where it was installed here"
    return f"install this schedspec there ({process.python} -m pip install {source})"


def _shut_down(popen: subprocess.Popen[bytes], stack: IO[bytes], owner: int) -> None:
    """Close the pipe, give the process CLOSE_GRACE_SECONDS to finish, kill it if it
    has not, and reap it. Only in the process that started it: a forked worker holds
    a copy of this object, not the child."""
    if os.getpid() != owner:
        return
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:  # a broken pipe while flushing: the process is gone already
            pass
    _wait_or_kill(popen)
    stack.close()


def _wait_or_kill(popen: subprocess.Popen[bytes]) -> None:
    """Reap the process once it ends (it is ending, or was told to), killing it if it
    has not within CLOSE_GRACE_SECONDS."""
    try:
        popen.wait(CLOSE_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
