"""The `schedspec` group: every command, each imported only when it runs.

Command modules import what their work needs (Hypothesis for check and diff,
z3 for prove, torch for swarm mode and --execute, matplotlib for simulate's
pictures), so the group names them as "module:attribute" and loads the one
invoked: `schedspec run` and `schedspec check` start fast and work without
torch, z3 or matplotlib.

The group also keeps the exit-code contract for every command (reports.EXIT_CODES):
an interrupt (Ctrl-C, SIGTERM, SIGHUP) exits 128 + the signal, never click's 1, and
an error that escapes a command is schedspec's own (exit 6, with its traceback),
never mistaken for an invariant that broke (1).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import traceback
from typing import Any

import click

from schedspec.cli.exit_codes import EXIT_CODES, EXIT_HARNESS_ERROR, Outcome, error_outcome
from schedspec.cli.interrupts import interrupt_exit_code, interrupt_name, terminations_interrupt
from schedspec.engines.errors import EngineHalt, engine_call_of

# Name -> "module:attribute" of a click command, in the order --help lists them.
COMMANDS: dict[str, str] = {
    "run": "schedspec.cli.run:run",
    "check": "schedspec.cli.check:check",
    "replay": "schedspec.cli.replay:replay",
    "diff": "schedspec.cli.diff:diff",
    "diff-replay": "schedspec.cli.diff_replay:diff_replay",
    "prove": "schedspec.cli.prove:prove_command",
    "simulate": "schedspec.cli.simulate:simulate",
    "export-test": "schedspec.cli.replay:export_test_command",
}


class LazyGroup(click.Group):
    """A click group that imports the commands of COMMANDS on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command), target
        return command

    def invoke(self, ctx: click.Context) -> Any:
        with terminations_interrupt():
            try:
                return super().invoke(ctx)
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


@click.group(cls=LazyGroup)
def main() -> None:
    """schedspec: an executable specification of LLM-serving schedulers."""
