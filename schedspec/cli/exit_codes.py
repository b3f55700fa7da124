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

Light on purpose (the command group imports it for every command).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from schedspec.cli.interrupts import interrupt_exit_code
from schedspec.engines.errors import EngineExitError, engine_call_of
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
