"""Source-level mutation of the reference scheduler, and running the suite against a mutant.

A mutant is a record: which file under schedspec/reference/ to change, the exact
snippet(s) to replace and what to put instead. Building it copies every module
of the reference package into a fresh package (in a directory the caller
owns), applies the edits, rewrites the `schedspec.reference` imports to the new
package name and imports it. Nothing of the reference is duplicated by hand, so
a mutant is always "the reference as it is today, plus one mistake"; an edit
whose snippet is not found exactly once fails loudly (SnippetError).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal, cast

from hypothesis import strategies as st

import schedspec.reference
from schedspec.adapters.reference import reference_engine
from schedspec.engines.errors import engine_call_of
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.engines.watchdog import StepTimeoutError
from schedspec.properties.checked_engine import InvariantViolationError, replay
from schedspec.properties.suite import SuiteResult, SuiteSettings, run_suite
from schedspec.spec import Family, SchedulerConfig
from schedspec.spec.invariants import FAMILY_PROFILES, Profile
from schedspec.traces.trace import Trace

REFERENCE_DIR = Path(schedspec.reference.__file__).parent
REFERENCE_PACKAGE = "schedspec.reference"
MUTANT_PROFILES: frozenset[Profile] = frozenset({"safety", "vllm-v1"})

# The CI profile's sizes (SuiteSettings.quick()), with a pinned seed so that a
# mutant's verdict and the invariants that caught it are reproducible.
# SCHEDSPEC_MUTANT_SEED=N runs them under another seed, to see how robustly
# each mutant is caught. A seed explores the same examples whatever else the
# process imported (the whole test run, or tests/mutants alone): strategies/constant_pool.py.
SUITE_SEED = int(os.environ.get("SCHEDSPEC_MUTANT_SEED", "20240607"))
CI_SETTINGS = SuiteSettings(
    examples=SuiteSettings.quick().examples,
    rules_per_example=SuiteSettings.quick().rules_per_example,
    seed=SUITE_SEED,
    shrink=False,
)

# The pseudo invariant id a mutant is "caught by" when the engine crashed.
CRASH = "CRASH"


class SnippetError(AssertionError):
    """A mutant's snippet is not in the reference exactly once: the catalogue is stale."""


@dataclass(frozen=True)
class Edit:
    old: str  # must occur exactly once in the file
    new: str


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # a module of schedspec/reference/, e.g. "vllm/scheduler.py"
    edits: tuple[Edit, ...]
    description: str
    # Invariant ids expected to catch it (CRASH for an engine crash); the
    # suite must report at least one of them.
    caught_by: frozenset[str]
    # A targeted config strategy, when the default one reaches the bug's
    # corner too rarely in the CI profile; None: the suite's default.
    configs: Callable[[], st.SearchStrategy[SchedulerConfig]] | None = None
    # Examples to run instead of the CI profile's, for a corner that even a
    # targeted strategy reaches only now and then; None: the CI profile's.
    examples: int | None = None
    # Non-empty: a known gap (why the suite cannot catch it today); the test
    # expects it to survive (xfail) and the report lists it.
    gap: str = ""
    # The policy family the mutated scheduler implements (its profile is that family's).
    family: Family = "vllm"
    # The configs a user of the feature the mutant breaks passes to `schedspec check
    # --configs` (the KV connector's: engine_configs.connector_configs, which .ci/run
    # runs too); None: the family's defaults. check_as_a_user runs these, never
    # `configs`, which may be narrowed for the one pinned CI seed.
    user_configs: Callable[[], st.SearchStrategy[SchedulerConfig]] | None = None


def mutant(
    id: str,
    file: str,
    old: str,
    new: str,
    description: str,
    caught_by: set[str],
    *more_edits: tuple[str, str],
    configs: Callable[[], st.SearchStrategy[SchedulerConfig]] | None = None,
    examples: int | None = None,
    gap: str = "",
    family: Family = "vllm",
    user_configs: Callable[[], st.SearchStrategy[SchedulerConfig]] | None = None,
) -> Mutant:
    """A Mutant from one edit (old -> new), plus any further (old, new) edits of the same file."""
    edits = (Edit(old, new), *(Edit(o, n) for o, n in more_edits))
    return Mutant(
        id,
        file,
        edits,
        description,
        frozenset(caught_by),
        configs,
        examples,
        gap,
        family,
        user_configs,
    )


def mutated_source(mutant: Mutant) -> str:
    """The mutated text of the mutant's file; SnippetError if a snippet is not there once."""
    path = REFERENCE_DIR / mutant.file
    if not path.is_file():
        raise SnippetError(f"mutant {mutant.id}: no file {path}")
    source = path.read_text()
    for index, edit in enumerate(mutant.edits):  # applied in order
        count = source.count(edit.old)
        if count != 1:
            raise SnippetError(
                f"mutant {mutant.id}: edit {index} snippet occurs {count} times in "
                f"{mutant.file} (must be exactly once):\n{edit.old}"
            )
        if edit.old == edit.new:
            raise SnippetError(f"mutant {mutant.id}: edit {index} changes nothing")
        source = source.replace(edit.old, edit.new)
    return source


def package_name(mutant: Mutant) -> str:
    return "schedspec_mutant_" + re.sub(r"\W", "_", mutant.id)


def build_mutant_package(mutant: Mutant, root: Path) -> ModuleType:
    """Copy the reference package under root, apply the mutant, and import it.

    The copy goes in a folder named `tests`: Hypothesis mines the source of
    every imported non-test module for constants to try, so an imported copy
    outside such a folder would change what later suite runs in this process
    generate (for other tests too).
    """
    mutated = mutated_source(mutant)
    name = package_name(mutant)
    parent = root / "tests"
    target = parent / name
    target.mkdir(parents=True, exist_ok=False)
    pattern = re.compile(r"\b" + re.escape(REFERENCE_PACKAGE) + r"\b")
    for module in sorted(REFERENCE_DIR.rglob("*.py")):  # the families' folders too
        relative = module.relative_to(REFERENCE_DIR)
        mutated_here = relative.as_posix() == mutant.file
        text = pattern.sub(name, mutated if mutated_here else module.read_text())
        if re.search(r"from\s+schedspec\s+import\s+reference\b", text):
            raise SnippetError(f"{relative}: an import of the reference this copy cannot follow")
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).write_text(text)
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]  # a stale copy from an earlier build in this process
    importlib.invalidate_caches()
    sys.path.insert(0, str(parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(parent))


def engine_factory(package: ModuleType, family: Family = "vllm") -> EngineFactory:
    """An EngineFactory for a (mutated) reference package: its scheduler of the family,
    claiming safety and the family's profile, as schedspec.adapters.reference
    does for the real one."""
    if family == "sglang":
        scheduler = cast(type, package.SGLangScheduler)
        profiles: frozenset[Profile] = frozenset({"safety", "sglang"})
    else:
        scheduler, profiles = cast(type, package.Scheduler), MUTANT_PROFILES
    engine = type("MutantEngine", (scheduler,), {"profiles": profiles})
    return cast(Callable[[SchedulerConfig], EngineAdapter], engine)


Verdict = Literal["caught", "crashed", "survived"]


@dataclass
class MutantOutcome:
    mutant: Mutant
    verdict: Verdict
    invariant_ids: tuple[str, ...]  # what caught it; (CRASH,) for a crash
    seconds: float  # over all runs
    examples: int  # over all runs
    runs: int  # CI-profile runs it took (seeds SUITE_SEED, SUITE_SEED + 1, ...)
    result: SuiteResult = field(repr=False)  # of the last run
    # Set when the mutant's counterexample also fails on the real reference:
    # then the "catch" is a false positive of the suite, not of the mutant.
    reference_failure: str | None = None

    @property
    def killed(self) -> bool:
        return self.verdict != "survived"

    @property
    def detail(self) -> str:
        """The first violation, or the crash, in one line."""
        if self.result.error is not None:
            return str(self.result.error.violations[0])
        if self.result.other_error is not None:
            err = self.result.other_error
            return f"{type(err).__name__}: {err}".splitlines()[0]
        return ""


def violation_ids(error: InvariantViolationError) -> tuple[str, ...]:
    return tuple(sorted({v.invariant for v in error.violations}))


def suite_settings(mutant: Mutant, base: SuiteSettings = CI_SETTINGS) -> SuiteSettings:
    if mutant.examples is None:
        return base
    return dataclasses.replace(base, examples=mutant.examples)


def run_mutant(
    mutant: Mutant,
    root: Path,
    settings: SuiteSettings | None = None,
    profile: Profile | None = None,
    runs: int = 1,
) -> MutantOutcome:
    """Build the mutant under root and run the suite against it, up to `runs` times
    (seeds seed, seed + 1, ...) until it is caught; replay the counterexample on the
    real reference, which must pass it."""
    factory = engine_factory(build_mutant_package(mutant, root), mutant.family)
    profile = profile or FAMILY_PROFILES[mutant.family]
    chosen = settings or suite_settings(mutant)
    seed = chosen.seed if chosen.seed is not None else SUITE_SEED
    seconds = 0.0
    examples = 0
    for run in range(1, runs + 1):
        strategy = mutant.configs() if mutant.configs is not None else None
        started = time.perf_counter()
        result = run_suite(
            factory,
            profile,
            dataclasses.replace(chosen, seed=seed + run - 1),
            config_strategy=strategy,
        )
        seconds += time.perf_counter() - started
        examples += result.examples
        if not result.passed:
            break
    verdict: Verdict
    if result.error is not None:
        verdict, ids = "caught", violation_ids(result.error)
    elif result.other_error is not None:
        verdict, ids = "crashed", (CRASH,)
    else:
        verdict, ids = "survived", ()
    outcome = MutantOutcome(mutant, verdict, ids, seconds, examples, run, result)
    if result.trace is not None:
        outcome.reference_failure = reference_failure(result.trace, profile)
    return outcome


def reference_failure(trace: Trace, profile: Profile = "vllm-v1") -> str | None:
    """None if the real reference replays the trace cleanly, else what went wrong."""
    try:
        replay(trace, reference_engine, profile)
    except Exception as err:  # a violation or a crash: either is the suite's fault here
        return f"{type(err).__name__}: {err}"
    return None


@dataclass(frozen=True)
class SeedVerdict:
    """One mutant under one seed, as `schedspec check` sees it."""

    cell: str  # K violation, C engine crash, . survived, F false alarm, E harness failure
    invariant_ids: tuple[str, ...]
    steps: int
    detail: str


def check_as_a_user(
    mutant: Mutant, root: Path, seed: int, settings: SuiteSettings | None = None
) -> SeedVerdict:
    """What `schedspec check --engine MUTANT --seed SEED --no-shrink` finds: the profile
    of the mutant's family (vllm-v1, sglang), that family's default configs or the
    feature's user configs (`user_configs`; never the mutant's targeted ones) and the
    CI profile's sizes unless told otherwise. A
    counterexample must pass on the real reference, or the kill is the suite's false
    alarm (F)."""
    factory = engine_factory(build_mutant_package(mutant, root), mutant.family)
    profile = FAMILY_PROFILES[mutant.family]
    chosen = dataclasses.replace(settings or SuiteSettings.quick(), seed=seed, shrink=False)
    user_configs = mutant.user_configs() if mutant.user_configs is not None else None
    result = run_suite(factory, profile, chosen, user_configs)
    steps = result.stats.steps
    if result.passed:
        return SeedVerdict(".", (), steps, "")
    if result.trace is not None:
        false_alarm = reference_failure(result.trace, profile)
        if false_alarm is not None:
            return SeedVerdict("F", (), steps, false_alarm)
    if result.error is not None:
        return SeedVerdict("K", violation_ids(result.error), steps, str(result.error.violations[0]))
    err = result.other_error
    # A crash kills only if the engine raised it (in one of its calls) or hung; an error
    # raised anywhere else (an illegal config drawn, say) is the harness's own.
    if err is None or not (engine_call_of(err) or isinstance(err, StepTimeoutError)):
        return SeedVerdict("E", (), steps, repr(err))
    return SeedVerdict("C", (CRASH,), steps, f"{type(err).__name__}: {err}".splitlines()[0])


# The user property a test's report carries its mutant's KillRow under.
KILL_ROW = "schedspec_kill_row"


@dataclass(frozen=True)
class KillRow:
    """A mutant's line of the kill-rate table, in plain values: a test records it on its
    report (KILL_ROW), which pytest-xdist sends from the worker that ran the mutant to
    the process that prints the table (conftest.py)."""

    mutant_id: str
    verdict: str
    gap: bool
    caught_by: tuple[str, ...]
    runs: int
    examples: int
    seconds: float
    configs: str  # the config strategy's name, or "default"
    first: str  # the first violation, or the crash, in one line

    @staticmethod
    def of(outcome: MutantOutcome) -> KillRow:
        configs = outcome.mutant.configs
        return KillRow(
            outcome.mutant.id,
            outcome.verdict,
            bool(outcome.mutant.gap),
            outcome.invariant_ids,
            outcome.runs,
            outcome.examples,
            outcome.seconds,
            configs.__name__ if configs is not None else "default",
            outcome.detail,
        )

    @staticmethod
    def from_values(values: Sequence[object]) -> KillRow:
        """The row again, from dataclasses.astuple's values (as a report carried them)."""
        row = KillRow(*values)  # type: ignore[arg-type]
        return dataclasses.replace(row, caught_by=tuple(row.caught_by))

    @property
    def killed(self) -> bool:
        return self.verdict != "survived"


def record_kill_row(record_property: Callable[[str, object], None], row: KillRow) -> None:
    """Put a mutant's KillRow on the running test's report."""
    record_property(KILL_ROW, dataclasses.astuple(row))


def kill_table(done: Sequence[KillRow]) -> str:
    """The kill-rate table: one row per mutant, then the rate and the total time."""
    header = ("mutant", "verdict", "caught by", "runs", "examples", "time", "configs", "first")
    rows = [header]
    for o in done:
        rows.append(
            (
                o.mutant_id,
                o.verdict + (" (gap)" if o.gap else ""),
                ",".join(o.caught_by) or "-",
                str(o.runs),
                str(o.examples),
                f"{o.seconds:.2f}s",
                o.configs,
                o.first[:60],
            )
        )
    rows[0] = (*header[:-1], "first violation (or crash)")
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    killed = [o for o in done if o.killed]
    first = sum(o.runs == 1 for o in killed)
    crashed = sum(o.verdict == "crashed" for o in done)
    gaps = sum(o.gap for o in done)
    total = sum(o.seconds for o in done)
    rate = 100.0 * len(killed) / max(len(done), 1)
    lines.append(
        f"kill rate: {len(killed)}/{len(done)} mutants ({rate:.0f}%; {first} on the first "
        f"run, {crashed} by an engine crash; {gaps} known gaps); suite time {total:.1f}s"
    )
    return "\n".join(lines)


# A mutant missed by one CI-profile run gets one more, with the next seed: each
# run catches each mutant with probability >= ~0.9 (see the report), and trying
# two fixed seeds keeps the test from failing whenever an unrelated change
# reshuffles what one seed explores. The table shows how many runs it took.
RUNS_PER_MUTANT = 2

# Outcomes of this process, by mutant id: each mutant runs once per process, whichever
# test asks first (under pytest-xdist the tests of tests/mutants share one worker).
OUTCOMES: dict[str, MutantOutcome] = {}


def outcome_for(mutant: Mutant, root: Path) -> MutantOutcome:
    if mutant.id not in OUTCOMES:
        # A known gap is expected to survive: one run shows it, a second adds nothing.
        runs = 1 if mutant.gap else RUNS_PER_MUTANT
        OUTCOMES[mutant.id] = run_mutant(mutant, root, runs=runs)
    return OUTCOMES[mutant.id]
