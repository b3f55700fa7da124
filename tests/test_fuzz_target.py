"""The pytest plugin's fuzz_target: the suite's state machine as a test HypoFuzz can fuzz.

HypoFuzz (`hypothesis fuzz -- ARGS`) collects with pytest (`--collect-only -m
hypothesis`) the test functions that are Hypothesis tests, take no fixture and use
Hypothesis' default database; for a state machine's TestCase it rebuilds the test
from the machine class on runTest (hypothesis.stateful.get_state_machine_test). These
tests check each of those conditions, and that the test finds a planted bug, without
HypoFuzz itself (not a dependency: docs/CAMPAIGNS.md has the recipe).
"""

from __future__ import annotations

import unittest
from collections.abc import Iterator

import hypothesis
import pytest
from hypothesis.stateful import get_state_machine_test

from schedspec.properties.pytest_plugin import fuzz_target
from schedspec.properties.suite import SuiteSettings

pytest_plugins = ["pytester"]

# A test module of an engine's repository, as docs/CAMPAIGNS.md shows it.
FUZZ_MODULE = """
from pathlib import Path

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

from schedspec.properties.pytest_plugin import fuzz_target
from schedspec.properties.suite import SuiteSettings

# A database of the test's own (a repository would keep Hypothesis' default, or set
# its own this way): fuzz_target's tests take the default in force when they are made.
settings.register_profile("here", database=DirectoryBasedExampleDatabase(Path("db").resolve()))
settings.load_profile("here")

TestReference = fuzz_target("reference", settings=SuiteSettings(examples=5, seed=None))
TestWrongTotal = fuzz_target(
    "tests.broken_engines:wrong_total", "safety", settings=SuiteSettings(examples=60)
)
"""


@pytest.fixture(autouse=True)
def hypothesis_profile_kept() -> Iterator[None]:
    """The Hypothesis profile in force restored after each test (a test module run in
    process by pytester loads one of its own)."""
    saved = hypothesis.settings.get_current_profile_name()
    yield
    hypothesis.settings.load_profile(saved)


def test_it_is_a_state_machine_test_hypofuzz_can_rebuild() -> None:
    case = fuzz_target("reference", settings=SuiteSettings(examples=7, rules_per_example=10))
    assert issubclass(case, unittest.TestCase)
    machine = case.runTest._hypothesis_state_machine_class  # type: ignore[attr-defined]
    assert machine.__name__ == "Schedspec[reference:vllm-v1]"
    chosen: hypothesis.settings = case.settings  # type: ignore[attr-defined]
    assert (chosen.max_examples, chosen.stateful_step_count) == (7, 5)
    # HypoFuzz fuzzes only tests on the default database; its key is the machine's.
    assert chosen.database == hypothesis.settings().database
    assert hasattr(get_state_machine_test(machine, settings=chosen), "hypothesis")


def test_its_profile_and_configs_are_those_the_plugin_would_pick() -> None:
    case = fuzz_target("tests.broken_engines:wrong_total", "safety")
    machine = case.runTest._hypothesis_state_machine_class  # type: ignore[attr-defined]
    assert machine.__name__ == "Schedspec[tests.broken_engines:wrong_total:safety]"
    with pytest.raises(ValueError, match="profile"):
        fuzz_target("tests.broken_engines:safety_only", "vllm-v1")


def test_pytest_collects_it_as_the_hypothesis_test_hypofuzz_selects(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_fuzz=FUZZ_MODULE)
    pytester.syspathinsert(str(pytester.path))
    result = pytester.runpytest("--collect-only", "-m", "hypothesis", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*<TestCaseFunction runTest>*", "*<TestCaseFunction runTest>*", "*2 tests collected*"]
    )


def test_run_by_pytest_it_passes_the_reference_and_catches_a_planted_bug(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_fuzz=FUZZ_MODULE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*[[]BUDGET[]]*", "FAILED test_fuzz.py::TestWrongTotal::runTest*"])
