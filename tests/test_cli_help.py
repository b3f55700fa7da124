"""Every command's help: each option says what it does, and every engine option lists
the engines by name."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from schedspec.cli.main import COMMANDS, main
from schedspec.engines.registry import ENGINE_FORMS, ENGINES


def command(name: str) -> click.Command:
    found = main.get_command(click.Context(main), name)
    assert found is not None, name
    return found


def options_of(name: str) -> list[click.Option]:
    return [p for p in command(name).params if isinstance(p, click.Option)]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_has_help(name: str) -> None:
    missing = [o.opts[0] for o in options_of(name) if not (o.help or "").strip()]
    assert missing == []


ENGINE_OPTIONS = [
    ("check", "--engine"),
    ("conform", "--engine"),
    ("replay", "--engine"),
    ("diff", "--left"),
    ("diff", "--right"),
    ("diff-replay", "--left"),
    ("diff-replay", "--right"),
    ("simulate", "--engine"),
]


def test_the_engine_options_are_all_there() -> None:
    """Every option that takes an engine, on every command: none is left out below."""
    found = [
        (n, o.opts[0])
        for n in COMMANDS
        for o in options_of(n)
        if o.help and "EngineAdapter" in o.help
    ]
    assert sorted(found) == sorted(ENGINE_OPTIONS)


@pytest.mark.parametrize(("name", "flag"), ENGINE_OPTIONS)
def test_engine_options_list_the_engines_by_name(name: str, flag: str) -> None:
    (option,) = [o for o in options_of(name) if flag in o.opts]
    assert ENGINE_FORMS in (option.help or "")
    assert all(f"'{engine}'" in ENGINE_FORMS for engine in ENGINES)
    # And the rendered --help shows them (click rewraps the text).
    shown = " ".join(CliRunner().invoke(main, [name, "--help"]).output.split())
    assert ENGINE_FORMS in shown


def test_the_group_lists_every_command() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert all(f"  {name} " in result.output for name in COMMANDS)


def test_swarm_defaults_in_the_help_are_the_ones_it_uses() -> None:
    from schedspec.campaign.swarm_plan import SWARM_LONG, SWARM_QUICK

    (instances,) = [o for o in options_of("check") if "--instances" in o.opts]
    text = instances.help or ""
    configs = f"[default: {SWARM_QUICK[0]}, {SWARM_LONG[0]} with --long]"
    ticks = f"[default: {SWARM_QUICK[1]}, {SWARM_LONG[1]} with --long]"
    assert f"--examples counts configs {configs}" in text
    assert f"--max-steps ticks per config {ticks}" in text


def test_run_shape_defaults_in_the_help_are_the_suites() -> None:
    from schedspec.campaign.swarm_plan import SWARM_LONG, SWARM_QUICK
    from schedspec.properties.suite import SuiteSettings

    quick, long = SuiteSettings.quick(), SuiteSettings.long()
    helps = {o.opts[0]: o.help or "" for o in options_of("check")}
    assert (
        f"[default: {quick.examples}, {long.examples} with --long; "
        f"swarm mode: configs, {SWARM_QUICK[0]}, {SWARM_LONG[0]} with --long]"
    ) in helps["--examples"]
    assert (
        f"[default: {quick.rules_per_example}, {long.rules_per_example} with --long; "
        "swarm mode: ticks per config, the same]"
    ) in helps["--max-steps"]
    assert (quick.rules_per_example, long.rules_per_example) == (SWARM_QUICK[1], SWARM_LONG[1])
