"""The `schedspec` group: every command, each imported only when it runs.

Command modules import what their work needs (Hypothesis for check and diff,
z3 for prove, torch for swarm mode and --execute, matplotlib for simulate's
pictures), so the group names them as "module:attribute" and loads the one
invoked: `schedspec run` and `schedspec check` start fast and work without
torch, z3 or matplotlib.
"""

from __future__ import annotations

import importlib

import click

# Name -> "module:attribute" of a click command, in the order --help lists them.
COMMANDS: dict[str, str] = {
    "run": "schedspec.cli.run:run",
    "check": "schedspec.cli.check:check",
    "replay": "schedspec.cli.replay:replay",
    "diff": "schedspec.cli.diff:diff",
    "diff-replay": "schedspec.cli.diff_replay:diff_replay",
    "prove": "schedspec.cli.prove:prove_command",
    "simulate": "schedspec.cli.simulate:simulate",
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


@click.group(cls=LazyGroup)
def main() -> None:
    """schedspec: an executable specification of LLM-serving schedulers."""
