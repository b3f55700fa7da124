"""Mutation testing of the invariant suite: every seeded bug in the reference must be caught.

Each mutant (catalogue.py) is the reference with one small, realistic mistake,
built from source (mutation.py). The CI profile of the suite runs against it
and must fail with an invariant violation (an engine crash counts, and is
recorded as such). The kill-rate table prints at the end of the session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

import schedspec.reference
from schedspec.adapters.reference import reference_engine
from schedspec.properties.checked_engine import InvariantViolationError, replay
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.traces.trace import Trace
from tests.mutants.catalogue import MUTANTS
from tests.mutants.mutation import (
    CRASH,
    REFERENCE_DIR,
    Edit,
    KillRow,
    Mutant,
    MutantOutcome,
    SnippetError,
    build_mutant_package,
    engine_factory,
    kill_table,
    mutated_source,
    outcome_for,
    record_kill_row,
    suite_settings,
)

BY_ID = {m.id: m for m in MUTANTS}
# Shrinking costs seconds per mutant: an abort bug (shrinks to add, abort, step)
# and a preemption bug (two requests contending for a tiny cache, then a drain: on
# the suite's seed, two adds and the eleven steps of the first one's decodes).
SHRUNK = ("finish-not-reported", "preempt-keeps-computed")
MAX_SHRUNK_EVENTS = 13
# Counterexamples the suite once found (shrunk) for mutants whose corner the CI
# profile reaches only now and then: replayed every time, like etcd's regression
# schedules, so the invariants that catch them stay proven.
SCENARIOS = sorted((Path(__file__).parent / "traces").glob("*.json"))


@pytest.fixture(scope="session")
def mutant_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutants")


def _param(m: Mutant) -> object:
    marks = [pytest.mark.xfail(reason=f"known gap: {m.gap}", strict=False)] if m.gap else []
    return pytest.param(m, id=m.id, marks=marks)


# ------------------------------------------------------------------ catalogue


def test_catalogue_is_large_and_ids_unique() -> None:
    assert len(MUTANTS) >= 15
    assert len(BY_ID) == len(MUTANTS), "duplicate mutant ids"
    assert sum(not m.gap for m in MUTANTS) >= 15


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_snippets_match_the_reference_exactly_once(mutant: Mutant) -> None:
    """A stale mutant fails here, loudly, instead of silently testing nothing."""
    assert mutated_source(mutant) != (REFERENCE_DIR / mutant.file).read_text()


def test_a_snippet_not_found_fails_loudly(mutant_root: Path) -> None:
    stale = Mutant(
        "stale", "vllm/scheduler.py", (Edit("no such code", ""),), "never matches", frozenset()
    )
    with pytest.raises(SnippetError, match="occurs 0 times"):
        mutated_source(stale)
    ambiguous = Mutant(
        "ambiguous", "vllm/scheduler.py", (Edit("request", "req"),), "matches often", frozenset()
    )
    with pytest.raises(SnippetError, match="must be exactly once"):
        build_mutant_package(ambiguous, mutant_root)


def test_an_unmutated_copy_passes_the_suite(mutant_root: Path) -> None:
    """The copying machinery alone changes nothing: a no-op edit of a comment passes."""
    noop = Mutant(
        "noop-copy",
        "vllm/scheduler.py",
        (Edit("# skip, not break", "# skip (copied), not break"),),
        "a comment edit",
        frozenset(),
    )
    package = build_mutant_package(noop, mutant_root)
    # The copy runs its own modules, not the reference's.
    assert package.Scheduler is not schedspec.reference.Scheduler
    assert package.KVCacheManager.__module__ == f"{package.__name__}.vllm.kv_cache_manager"
    factory = engine_factory(package)
    small = SuiteSettings(examples=10, rules_per_example=20, seed=1, shrink=False)
    assert run_suite(factory, "vllm-v1", small).passed


# ------------------------------------------------------------------ mutants


def _check_caught(outcome: MutantOutcome) -> None:
    m = outcome.mutant
    result = outcome.result
    assert not result.passed, (
        f"{m.id} survived {outcome.runs} runs of the CI profile ({outcome.examples} examples)"
    )
    if result.error is not None:
        assert isinstance(result.error, InvariantViolationError)
    else:
        assert CRASH in m.caught_by, (
            f"{m.id}: the engine crashed instead of breaking an invariant: {outcome.detail}"
        )
    assert set(outcome.invariant_ids) & m.caught_by, (
        f"{m.id} caught by {outcome.invariant_ids}, expected one of {sorted(m.caught_by)}"
    )
    assert outcome.reference_failure is None, (
        f"{m.id}: the counterexample also fails on the real reference, so the suite, "
        f"not the mutant, is at fault: {outcome.reference_failure}"
    )


def assert_caught(
    mutant: Mutant, root: Path, record_property: Callable[[str, object], None]
) -> None:
    """Run the mutant (once per process), put its row on the test's report, then judge it."""
    outcome = outcome_for(mutant, root)
    record_kill_row(record_property, KillRow.of(outcome))
    _check_caught(outcome)


@pytest.mark.parametrize("mutant", [_param(m) for m in MUTANTS])
def test_mutant_is_caught(
    mutant: Mutant, mutant_root: Path, record_property: Callable[[str, object], None]
) -> None:
    assert_caught(mutant, mutant_root, record_property)


def test_kill_rate(mutant_root: Path, record_property: Callable[[str, object], None]) -> None:
    """Run every mutant (reusing the per-mutant runs) and print the kill-rate table."""
    outcomes = [outcome_for(m, mutant_root) for m in MUTANTS]
    rows = [KillRow.of(o) for o in outcomes]
    for row in rows:
        record_kill_row(record_property, row)
    print("\n" + kill_table(rows))
    missed = [o.mutant.id for o in outcomes if not o.killed and not o.mutant.gap]
    assert not missed, f"survived: {missed}"
    false = [o.mutant.id for o in outcomes if o.reference_failure is not None]
    assert not false, f"counterexamples that also fail on the reference: {false}"


def test_a_kill_row_survives_the_trip_to_the_reporting_process() -> None:
    """Under pytest-xdist a row travels as its report's user property, serialized by
    execnet: it comes back equal, and the table of it reads the same."""
    execnet = pytest.importorskip("execnet")
    row = KillRow("m", "caught", False, ("BUDGET", "CRASH"), 2, 130, 1.25, "default", "x")
    carried = execnet.loads(execnet.dumps(dataclasses.astuple(row)))
    assert KillRow.from_values(carried) == row
    table = kill_table([row, dataclasses.replace(row, mutant_id="n", verdict="survived")])
    assert "m       caught    BUDGET,CRASH  2     130       1.25s  default  x" in table
    assert table.endswith(
        "kill rate: 1/2 mutants (50%; 0 on the first run, 0 by an engine crash; 0 known "
        "gaps); suite time 2.5s"
    )


# ------------------------------------------------------------------ shrinking


@pytest.mark.parametrize("mutant_id", SHRUNK)
def test_shrunk_counterexample_is_small_and_replays(mutant_id: str, mutant_root: Path) -> None:
    mutant = BY_ID[mutant_id]
    root = mutant_root / "shrunk"
    factory = engine_factory(build_mutant_package(mutant, root))
    strategy = mutant.configs() if mutant.configs is not None else None
    settings = dataclasses.replace(suite_settings(mutant), shrink=True)
    result = run_suite(factory, "vllm-v1", settings, config_strategy=strategy)
    assert result.error is not None, f"{mutant_id} not caught: {result.other_error!r}"
    trace = result.trace
    assert trace is not None
    assert len(trace.events) <= MAX_SHRUNK_EVENTS, (
        f"shrunk to {len(trace.events)} events:\n" + "\n".join(map(repr, trace.events))
    )
    with pytest.raises(InvariantViolationError) as replayed:
        replay(trace, factory, "vllm-v1")
    assert {v.invariant for v in replayed.value.violations} & mutant.caught_by
    replay(trace, reference_engine, "vllm-v1")  # the real reference passes it


# ------------------------------------------------------------------ scenarios


def test_every_scenario_names_a_mutant() -> None:
    assert SCENARIOS, "no scenario traces"
    assert all(path.stem in BY_ID for path in SCENARIOS)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_trace_catches_its_mutant(path: Path, mutant_root: Path) -> None:
    """The saved trace breaks an expected invariant on the mutant and passes the reference."""
    mutant = BY_ID[path.stem]
    trace = Trace.load(path)
    factory = engine_factory(build_mutant_package(mutant, mutant_root / "scenarios"))
    with pytest.raises(InvariantViolationError) as caught:
        replay(trace, factory, "vllm-v1")
    assert {v.invariant for v in caught.value.violations} & mutant.caught_by
    replay(trace, reference_engine, "vllm-v1")
