"""Every command's help: each option says what it does, and every engine option lists
the engines by name."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from schedspec.cli.main import COMMANDS, main
from schedspec.engines.registry import ENGINE_FORMS, ENGINES
from schedspec.simulate.workloads import LengthDistribution, SyntheticWorkload
from schedspec.spec import SchedulerConfig


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


# ------------------------------------------- help that names only real behaviour

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
STATED_DEFAULT = re.compile(r"\[default: ([^\]]*)\]")


def flags_of(name: str) -> set[str]:
    return {flag for p in command(name).params for flag in [*p.opts, *p.secondary_opts]}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_flags_named_in_help_exist_on_the_command(name: str) -> None:
    """An option's help that refers to another flag refers to one the command has (diff's
    help once described swarm mode's --instances defaults, which diff has not)."""
    known = flags_of(name) | {"--help"}
    strangers = {
        (o.opts[0], flag)
        for o in options_of(name)
        for flag in FLAG.findall(o.help or "")
        if flag not in known
    }
    assert strangers == set()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_swarm_mode_is_described_only_where_it_exists(name: str) -> None:
    mentions = [o.opts[0] for o in options_of(name) if "swarm" in (o.help or "").lower()]
    assert not mentions or "--instances" in flags_of(name), mentions


SIMULATE_BRACKET = re.compile(r"\[([^\]]*)\]\.$")


def stated_workload_default(option: click.Option) -> object:
    """The default a simulate mixed-workload option's help states (`... [400].`), read as
    the option reads its value."""
    (stated,) = SIMULATE_BRACKET.findall(option.help or "")
    name = option.name or ""
    if name in ("prompt_len", "output_len"):
        return LengthDistribution.parse(stated, name)
    assert isinstance(option.type, click.ParamType)
    return option.type.convert(stated, option, None)


@pytest.mark.parametrize(
    "flag",
    ["--num-requests", "--rate", "--prompt-len", "--output-len", "--prefix-groups",
     "--prefix-len", "--prefix-share"],
)  # fmt: skip
def test_simulate_states_the_workloads_real_defaults(flag: str) -> None:
    """simulate's mixed-workload options default to SyntheticWorkload's fields; each help
    states that default, and states it right."""
    (option,) = [o for o in options_of("simulate") if flag in o.opts]
    assert option.name is not None
    assert stated_workload_default(option) == getattr(SyntheticWorkload(), option.name)


@pytest.mark.parametrize("name", ["check", "diff"])
def test_run_shape_defaults_in_every_suite_commands_help(name: str) -> None:
    """--examples and --max-steps state the suite's quick and long settings, on check and
    on diff alike (diff once stated swarm mode's too, which it has not)."""
    from schedspec.properties.suite import SuiteSettings

    quick, long = SuiteSettings.quick(), SuiteSettings.long()
    helps = {o.opts[0]: o.help or "" for o in options_of(name)}
    examples = STATED_DEFAULT.findall(helps["--examples"])[0]
    steps = STATED_DEFAULT.findall(helps["--max-steps"])[0]
    assert examples.startswith(f"{quick.examples}, {long.examples} with --long")
    assert steps.startswith(f"{quick.rules_per_example}, {long.rules_per_example} with --long")


def test_the_helps_own_checks_can_fail() -> None:
    """The checks above on options whose help drifted from the code."""
    drifted = click.Option(["--num-requests"], type=int, help="requests [500].")
    assert stated_workload_default(drifted) == 500 != SyntheticWorkload().num_requests
    assert FLAG.findall("swarm mode: with --instances, --no-such") == ["--instances", "--no-such"]


def test_the_configs_help_says_what_vllms_default_configs_draw() -> None:
    """check --help once said the vllm configs have no speculative decoding; they do."""
    from hypothesis import HealthCheck, given, settings

    from schedspec.properties.strategies.engine_configs import vllm_default_configs

    drafts: set[bool] = set()
    modes: set[bool] = set()

    @settings(max_examples=60, database=None, suppress_health_check=list(HealthCheck))
    @given(vllm_default_configs())
    def draw(config: SchedulerConfig) -> None:
        drafts.add(config.num_speculative_tokens > 0)
        modes.add(config.async_scheduling)

    draw()
    assert drafts == {True, False} and modes == {True, False}
    for name in ("check", "diff"):
        (configs,) = [o for o in options_of(name) if "--configs" in o.opts]
        text = configs.help or ""
        assert "sync and async, with and without speculative decoding" in text
        assert "no speculative decoding" not in text.replace("without speculative", "")
