"""--configs draws the suite's configs from another strategy; a bad name is a usage error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from schedspec.cli.main import main
from schedspec.engines.registry import load_config_strategy
from schedspec.properties.strategies.configs import configs
from tests.sched_helpers import make_config

ONLY_PRIORITY = configs().map(lambda c: make_config(policy="priority"))


def only_fcfs() -> st.SearchStrategy[object]:
    return st.just(make_config(policy="fcfs"))


@given(data=st.data())
def test_loads_a_strategy_or_a_function_returning_one(data: st.DataObject) -> None:
    assert load_config_strategy("tests.test_configs_option:ONLY_PRIORITY") is ONLY_PRIORITY
    drawn = data.draw(load_config_strategy("tests.test_configs_option:only_fcfs"))
    assert drawn.policy == "fcfs"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-colon", "expected 'module:strategy'"),
        ("tests.test_configs_option:missing", "has no strategy 'missing'"),
        ("tests.sched_helpers:make_config", "is not a Hypothesis strategy"),
    ],
)
def test_bad_names_are_refused(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config_strategy(name)


def test_check_uses_the_strategy_and_refuses_a_bad_one() -> None:
    runner = CliRunner()
    ok = runner.invoke(
        main,
        [
            "check",
            "--configs",
            "tests.test_configs_option:only_fcfs",
            "--examples",
            "5",
            "--seed",
            "1",
            "--trace-dir",
            "/tmp",
        ],
    )
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(main, ["check", "--configs", "nope", "--examples", "5"])
    assert bad.exit_code == 2
    assert "--configs" in bad.output
