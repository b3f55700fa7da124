"""The exit-code contract every command keeps, and how an outcome is decided.

| exit | outcome | meaning |
| 0 | passed | every invariant held (and the engines agreed) |
| 1 | violation | an invariant broke (run: the workload did not drain; simulate: the engine
      stalled; prove: a counterexample) |
| 2 | usage-error | a bad flag or input file, an engine that cannot be loaded, an output
      that cannot be written (standard output on a full device too), a fan-out past its
      bound (campaign/bounds.py) |
| 3 | divergence | diff: the engines disagreed (prove: a query was undecided) |
| 4 | engine-error | the engine under test raised, or ended the process, in one of its calls,
      whether or not a replay repeats it (engines/errors.engine_error_in) |
| 5 | hang | an engine call ran past --step-timeout |
| 6 | harness-error | schedspec itself failed: a bug in schedspec, never a finding |
| 128 + N | interrupted | signal N: 130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for SIGHUP;
      141 (SIGPIPE) when the reader of its output went away (`schedspec prove | head`) |

Light on purpose: every command imports it (the group, once a command runs: `--help` and
`--version` do not).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import click

from schedspec.cli.interrupts import interrupt_exit_code, interrupt_name, terminations_interrupt
from schedspec.engines.errors import EngineExitError, EngineHalt, engine_call_of
from schedspec.engines.watchdog import StepTimeoutError


class Outcome(enum.Enum):
    PASSED = "passed"
    VIOLATION = "violation"
    USAGE_ERROR = "usage-error"
    DIVERGENCE = "divergence"
    ENGINE_ERROR = "engine-error"
    HANG = "hang"
    HARNESS_ERROR = "harness-error"
    INTERRUPTED = "interrupted"


# The exit-code contract of every command. 2 is also click's own usage error (a bad
# flag, before a report exists). An interrupt exits 128 + the signal's number, as a
# shell reports a process the signal ended (130 for Ctrl-C, 143 for SIGTERM).
EXIT_CODES: Mapping[Outcome, int] = {
    Outcome.PASSED: 0,
    Outcome.VIOLATION: 1,
    Outcome.USAGE_ERROR: 2,
    Outcome.DIVERGENCE: 3,
    Outcome.ENGINE_ERROR: 4,
    Outcome.HANG: 5,
    Outcome.HARNESS_ERROR: 6,
    Outcome.INTERRUPTED: 130,
}
EXIT_HARNESS_ERROR = EXIT_CODES[Outcome.HARNESS_ERROR]


def error_outcome(error: BaseException) -> Outcome:
    """A failure that is not a finding: the engine's (it hung, or raised or ended the
    process in one of its calls) or, raised anywhere else, the harness's own."""
    if isinstance(error, StepTimeoutError):
        return Outcome.HANG
    if engine_call_of(error) is not None:
        return Outcome.ENGINE_ERROR
    return Outcome.HARNESS_ERROR


def outcome_of(
    violation: object | None, divergence: object | None, error: BaseException | None
) -> Outcome:
    """A finished run's outcome: a finding first, else the error's, else passed."""
    if violation is not None:
        return Outcome.VIOLATION
    if divergence is not None:
        return Outcome.DIVERGENCE
    return Outcome.PASSED if error is None else error_outcome(error)


def exit_code_of(outcome: Outcome, interrupted: KeyboardInterrupt | None = None) -> int:
    if outcome is Outcome.INTERRUPTED and interrupted is not None:
        return interrupt_exit_code(interrupted)
    return EXIT_CODES[outcome]


def crash_verdict(err: BaseException, at: str, who: str = "the engine") -> str:
    """The last line of a replay that a failure other than a finding stopped at `at`."""
    outcome = error_outcome(err)
    if outcome is Outcome.HARNESS_ERROR:
        return (
            f"HARNESS ERROR at {at}: schedspec itself raised {type(err).__name__} "
            "(a bug in schedspec, not a finding about the engine)"
        )
    if outcome is Outcome.HANG:
        return f"FAILED at {at}: {who} hung"
    if isinstance(err, EngineExitError):
        return f"FAILED at {at}: {who} tried to end the process"
    return f"FAILED at {at}: {who} raised"


# ----------------------------------------------- the contract every command keeps
# An interrupt (Ctrl-C, SIGTERM, SIGHUP) exits 128 + the signal, never click's 1; an error
# that escapes a command is schedspec's own (exit 6, with its traceback), never mistaken
# for an invariant that broke (1); a reader of standard output that went away, or an
# output that cannot be written, ends the run quietly with the exit code that says so.


def keeping_exit_codes(invoke: Callable[[], Any]) -> Any:
    """Run a command's invocation, turning whatever escapes it into its exit code."""
    with terminations_interrupt():
        try:
            return invoke()
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt as err:
            code = interrupt_exit_code(err)
            click.echo(f"\ninterrupted by {interrupt_name(err)} (exit {code})", err=True)
            raise SystemExit(code) from None
        except BrokenPipeError as err:
            if engine_call_of(err) is not None:  # the engine's own pipe: its error
                raise SystemExit(_escaped(err)) from None
            raise SystemExit(_stdout_gone()) from None
        except OSError as err:
            if engine_call_of(err) is None and _while_printing(err):
                raise SystemExit(_output_unwritable(err)) from None
            raise SystemExit(_escaped(err)) from None
        except (Exception, EngineHalt) as err:
            raise SystemExit(_escaped(err)) from None


def _stdout_gone() -> int:
    """The reader of standard output went away (`schedspec prove | head`): exit as a
    process that SIGPIPE ended (128 + 13, what a shell reports), quietly."""
    _silence(sys.stdout)
    return 128 + signal.SIGPIPE


def _while_printing(err: OSError) -> bool:
    """Whether err came out of printing (click.echo) to standard output or error: every
    file schedspec writes itself turns a failed write into a warning, so this is the
    one place a full device (`> /dev/full`) or a quota meets an output stream."""
    frame = err.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if code.co_name == "echo" and code.co_filename.endswith(os.path.join("click", "utils.py")):
            return True
        frame = frame.tb_next
    return False


def _output_unwritable(err: OSError) -> int:
    """Standard output (or error) cannot be written: the usage error of an output path
    that cannot be written (exit 2), said in one line where it can still be said, and
    no traceback."""
    _silence(sys.stdout)
    with contextlib.suppress(OSError):
        sys.stderr.write(f"schedspec: cannot write its output: {err.strerror or err}\n")
        sys.stderr.flush()
    return EXIT_CODES[Outcome.USAGE_ERROR]


def _silence(stream: Any) -> None:
    """Point a standard stream at /dev/null, so that the interpreter's last flush on the
    way out does not fail again (and print a traceback of its own)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def _escaped(err: BaseException) -> int:
    """Print an error no command handled and return the exit code its outcome has: the
    engine's (loading its module raised, or tried to exit), or schedspec's own."""
    outcome = error_outcome(err)
    if outcome is Outcome.HARNESS_ERROR:
        click.echo(harness_error_text(err), err=True)
    else:
        from schedspec.properties.failure_report import crash_report  # Hypothesis: only now

        click.echo("FAILED: " + "\n".join(crash_report(err)))
    return EXIT_CODES[outcome]


def harness_error_text(err: BaseException) -> str:
    """What is printed when schedspec itself fails: not a finding about the engine."""
    return (
        "".join(traceback.format_exception(err)).rstrip("\n")
        + f"\nHARNESS ERROR: schedspec itself raised {type(err).__name__} (exit "
        f"{EXIT_HARNESS_ERROR}); this is a bug in schedspec, not a finding about the engine: "
        "please report it with the traceback above"
    )
