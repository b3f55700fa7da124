"""The invariant suite passes on the reference, on both profiles, reproducibly."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from schedspec.properties.checked_engine import CheckedEngine
from schedspec.properties.reference_adapter import reference_engine
from schedspec.properties.state_machine import SuiteRecorder, make_state_machine
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.spec.invariants import CATALOGUE, Profile, in_profile
from tests.sched_helpers import make_config

LONG = os.environ.get("SCHEDSPEC_LONG") == "1"


@pytest.mark.parametrize("profile", ["safety", "vllm-v1"])
def test_reference_passes_the_suite(profile: Profile) -> None:
    chosen = SuiteSettings.long() if LONG else SuiteSettings(examples=60, rules_per_example=30)
    result = run_suite(
        reference_engine,
        profile,
        SuiteSettings(
            examples=chosen.examples, rules_per_example=chosen.rules_per_example, seed=20261129
        ),
    )
    assert result.passed, result.error or result.other_error
    assert result.stats.steps > 1000
    # Every invariant of the profile ran, and no other.
    expected = {i.id for i in CATALOGUE.values() if in_profile(i, profile)}
    assert set(result.stats.checks) == expected
    assert all(count > 0 for count in result.stats.checks.values())


def test_same_seed_same_run() -> None:
    first = run_suite(reference_engine, "vllm-v1", SuiteSettings(examples=10, seed=7))
    second = run_suite(reference_engine, "vllm-v1", SuiteSettings(examples=10, seed=7))
    assert first.stats.checks == second.stats.checks
    assert first.stats.steps == second.stats.steps


def test_machine_runs_as_a_plain_hypothesis_state_machine() -> None:
    recorder = SuiteRecorder()
    machine = make_state_machine(reference_engine, "safety", recorder=recorder)
    run_state_machine_as_test(machine, settings=settings(max_examples=5, deadline=None))
    assert recorder.examples >= 5
    assert recorder.last_failure is None


def test_profile_not_claimed_is_refused() -> None:
    engine = reference_engine(make_config())
    engine.profiles = frozenset({"safety"})
    with pytest.raises(ValueError, match="profile"):
        CheckedEngine(engine, make_config(), "vllm-v1")
