"""The `schedspec` group: every command, each imported only when it runs.

Command modules import what their work needs (Hypothesis for check and diff,
z3 for prove, torch for swarm mode and --execute, matplotlib for simulate's
pictures), so the group names them as "module:attribute" and loads the one
invoked: `schedspec run` and `schedspec check` start fast and work without
torch, z3 or matplotlib.

The group also keeps the exit-code contract for every command (exit_codes.py), which
it imports only when a command runs: `--help` and `--version` need nothing but click.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, NamedTuple

import click

from schedspec import __version__


class LazyCommand(NamedTuple):
    """Where a command lives ("module:attribute") and the line `schedspec --help` lists
    for it: the first paragraph of its docstring, kept here so that listing the commands
    imports none of them (tests/test_cli_startup.py holds the two equal). A NamedTuple,
    not a dataclass: dataclasses costs --help a sixth of its imports."""

    target: str
    summary: str


# Name -> command, in the order --help lists them.
COMMANDS: dict[str, LazyCommand] = {
    "run": LazyCommand(
        "schedspec.cli.run:run", "Run the built-in mixed workload through the reference scheduler."
    ),
    "check": LazyCommand("schedspec.cli.check:check", "Run the invariant suite against an engine."),
    "conform": LazyCommand(
        "schedspec.cli.check:conform",
        "Check an adapter's own protocol (snapshot shape, ids, queues, block hashes, "
        "refusals) and name the adapter method at fault.",
    ),
    "replay": LazyCommand(
        "schedspec.cli.replay:replay",
        "Re-run a trace file on an engine and name the first event that breaks an invariant.",
    ),
    "diff": LazyCommand(
        "schedspec.cli.diff:diff",
        "Drive two engines in lockstep through random workloads and report the first step "
        "where they disagree.",
    ),
    "diff-replay": LazyCommand(
        "schedspec.cli.diff_replay:diff_replay",
        "Re-run a trace file on two engines in lockstep, side by side, to the first divergence.",
    ),
    "prove": LazyCommand(
        "schedspec.cli.prove:prove_command",
        "Prove the invariants of one scheduling step with Z3, for every N and for N <= max-n.",
    ),
    "simulate": LazyCommand(
        "schedspec.cli.simulate:simulate",
        "Simulate a workload through an engine with a step-time cost model.",
    ),
    "export-test": LazyCommand(
        "schedspec.cli.replay:export_test_command",
        "Write a trace as a pytest file that drives the engine's own scheduler, with no "
        "schedspec import: it fails where the trace's bug is and passes on a fixed engine.",
    ),
    "install": LazyCommand(
        "schedspec.cli.setup.install:install",
        "Install ENGINE's scheduler (vllm, sglang) or torch's CPU build (torch-cpu) into VENV.",
    ),
}


class LazyGroup(click.Group):
    """A click group that imports the commands of COMMANDS on first use, and lists them
    in --help from their summaries without importing any."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = COMMANDS.get(cmd_name)
        if lazy is None:
            return None
        module_name, _, attribute = lazy.target.partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command), lazy.target
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own listing, but from the summaries: click.Group's would import every
        # command (and Hypothesis, z3) to read one line of each.
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=c.summary).get_short_help_str(limit))
            for name, c in COMMANDS.items()
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        # Imported here: `schedspec --help` and `--version` end while parsing, before any
        # command is invoked, and need none of the exit-code machinery.
        from schedspec.cli.exit_codes import keeping_exit_codes

        return keeping_exit_codes(functools.partial(click.Group.invoke, self, ctx))


@click.group(cls=LazyGroup)
@click.version_option(
    __version__, "--version", prog_name="schedspec", message="%(prog)s %(version)s"
)
def main() -> None:
    """schedspec: an executable specification of LLM-serving schedulers."""
