"""The public entry point: run the invariant suite against an engine factory (or any target).

A run is a series of chunks of at most MAX_CHUNK_EXAMPLES examples each (seed, seed + 1,
...), and a chunk a series of bursts, Hypothesis runs of at most EXAMPLES_PER_BURST
examples (burst_seeds: the chunk's seed, then seeds hashed from it). Hypothesis keeps a
record of every example a run tried, so one run of 20,000 long examples would hold
gigabytes; and it spends most of a long run's examples on mutations that keep the config
(see EXAMPLES_PER_BURST). The first failure ends the series. An interrupt (Ctrl-C, or
SIGTERM as the command line raises it) ends it too, keeping the failure found so far: its
trace, unshrunk, is written like any other. So does a time budget (SuiteSettings.deadline,
a campaign's --duration): no example starts after it, though a failure found before it is
still shrunk.
"""

from __future__ import annotations

import gc
import hashlib
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky, Unsatisfiable
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from schedspec.engines.errors import (
    EngineHalt,
    engine_call_of,
    engine_error_in,
    first_in_groups,
)
from schedspec.engines.events import Step
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.watchdog import StepTimeoutError
from schedspec.properties.checked_engine import CheckStats, InvariantViolationError
from schedspec.properties.harness import SingleEngine, Target, replay_target
from schedspec.properties.minimize import minimize_on
from schedspec.properties.state_machine import (
    SuiteRecorder,
    failure_note,
    make_target_machine,
    rules_for,
)
from schedspec.properties.strategies.configs import ConfigStrategyError
from schedspec.properties.strategies.constant_pool import local_constants_pinned
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile
from schedspec.traces.divergence import DivergenceError
from schedspec.traces.trace import FAILURE_TRACE_STEM, Trace, trace_file_name

ALL_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)

# The most examples one chunk is given: a chunk is the unit a worker process takes
# (parallel.py, campaigns), and its seed the one a failure is reported under. A
# Hypothesis run's memory grows with the examples it has tried (about 0.23 MB each in
# the long profile: its record of them); chunks once were single runs, and this bound
# kept a long campaign within about 250 MB of that record. The quick profile is one chunk.
MAX_CHUNK_EXAMPLES = 1000

# The most examples one burst (one Hypothesis run) is given. Hypothesis follows each new
# example with up to six mutations of it once its first 10 examples are valid (the end of
# its health checks), and a mutation keeps the example's start: the config. One run of 100
# examples drew only 15 to 27 configs (measured), so a bug that lives in a corner of the
# configs (priority victims ahead of the request served; a padded admission over the
# budget left) was reached on some seeds only (benchmarks/bench_mutants.py). Bursts of 10
# end before any mutation, so each example draws a fresh config.
EXAMPLES_PER_BURST = 10


@dataclass(frozen=True)
class Chunk:
    """One Hypothesis run of a suite run: its place in the series, seed and examples."""

    index: int
    seed: int
    examples: int


def plan_chunks(
    examples: int, seed: int, parts: int = 1, max_examples: int = MAX_CHUNK_EXAMPLES
) -> list[Chunk]:
    """`examples` split as evenly as possible into chunks of at most max_examples, at
    least `parts` of them (for that many workers) but never more than examples; chunk i
    runs seed + i, so a run that fits one chunk is the plain run of its seed."""
    if examples < 1 or parts < 1 or max_examples < 1:
        got = f"{examples}, {parts}, {max_examples}"
        raise ValueError(f"examples, parts and max_examples must be >= 1, got {got}")
    count = max(min(parts, examples), -(-examples // max_examples))
    return [Chunk(i, seed + i, size) for i, size in enumerate(even_split(examples, count))]


def even_split(total: int, count: int) -> list[int]:
    """total as count sizes that differ by at most one, the larger ones first."""
    size, extra = divmod(total, count)
    return [size + (i < extra) for i in range(count)]


def burst_seeds(chunk: Chunk, per_burst: int = EXAMPLES_PER_BURST) -> list[tuple[int, int]]:
    """(seed, examples) of each burst of the chunk: the first runs the chunk's own seed
    (a run of one burst is the plain Hypothesis run of its seed), the others seeds
    hashed from it and the burst's index, so that runs of nearby seeds (the chunks of
    one series are seed, seed + 1, ...) share no burst."""
    sizes = even_split(chunk.examples, -(-chunk.examples // per_burst))
    seeds = [chunk.seed] + [_derived_seed(chunk.seed, i) for i in range(1, len(sizes))]
    return list(zip(seeds, sizes, strict=True))


def _derived_seed(seed: int, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True)
class SuiteSettings:
    """How hard to look: Hypothesis examples, actions per example, and the seed."""

    examples: int = 100
    # Actions (add, abort, drafts, steps) per example, at most: the state
    # machine's rule applies ACTIONS_PER_RULE of them (the name predates that).
    rules_per_example: int = 40
    seed: int | None = None  # None: a fresh random seed, reported in the result
    shrink: bool = True  # off: report the first failure found, unshrunk (faster)
    # Where Hypothesis keeps the failing examples it found, and tries them first on the
    # next run (campaign/example_db.py); None: nowhere, so a seed alone decides a run.
    database: ExampleDatabase | None = None
    # Wall-clock time (time.time()) after which no example starts; None: no budget.
    deadline: float | None = None

    @staticmethod
    def quick() -> SuiteSettings:
        """The CI profile."""
        return SuiteSettings(examples=100, rules_per_example=40)

    @staticmethod
    def long() -> SuiteSettings:
        """The long profile (SCHEDSPEC_LONG=1 or --long)."""
        return SuiteSettings(examples=2000, rules_per_example=100)


@dataclass
class SuiteResult:
    profile: Profile
    seed: int
    examples: int  # every example run, shrinking's included (SuiteRecorder.examples)
    stats: CheckStats
    seconds: float
    error: InvariantViolationError | None = None
    trace: Trace | None = None  # the shrunk counterexample, when a failure is set
    trace_path: Path | None = None
    other_error: BaseException | None = field(default=None, repr=False)  # a crash or a hang
    divergence: DivergenceError | None = None  # lockstep targets only
    first_failure_example: int | None = None  # which example the search first failed in
    # Set when Ctrl-C (or a signal the caller turns into KeyboardInterrupt) stopped the
    # run: the failure found by then, if any, is kept unshrunk.
    interrupted: KeyboardInterrupt | None = field(default=None, repr=False)
    budget_spent: bool = False  # the deadline stopped the run before its examples ran out
    trace_error: str | None = None  # why the trace could not be written, if it could not

    @property
    def passed(self) -> bool:
        return (
            self.error is None
            and self.other_error is None
            and self.divergence is None
            and self.interrupted is None
        )


def run_suite(
    factory: EngineFactory,
    profile: Profile = "vllm-v1",
    suite_settings: SuiteSettings | None = None,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    trace_dir: Path | None = None,
    on_example: Callable[[SuiteRecorder], None] | None = None,
) -> SuiteResult:
    """Drive the engine through random workloads, checking every invariant of `profile`.

    Returns a result rather than raising: on failure it holds the shrunk
    counterexample as a trace (written to trace_dir when given).
    """
    target = SingleEngine(factory, profile)
    return run_target(target, suite_settings, config_strategy, trace_dir, on_example)


def run_target(
    target: Target,
    suite_settings: SuiteSettings | None = None,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    trace_dir: Path | None = None,
    on_example: Callable[[SuiteRecorder], None] | None = None,
    trace_stem: str = FAILURE_TRACE_STEM,
) -> SuiteResult:
    """run_suite for any target (differential.run_diff drives two engines in lockstep);
    the trace goes to trace_dir / trace_file_name(trace_stem, seed)."""
    chosen = suite_settings or SuiteSettings.quick()
    seed = chosen.seed if chosen.seed is not None else random.randrange(2**32)
    recorder = SuiteRecorder()
    machine = make_target_machine(target, config_strategy, recorder)
    if chosen.deadline is not None:
        on_example = _stopping_at(chosen.deadline, on_example)
    if on_example is not None:
        _report_each_example(machine, recorder, on_example)
    started = time.perf_counter()
    result = SuiteResult(target.profile, seed, 0, recorder.stats, 0.0)
    # One pin for the whole series: entering it empties Hypothesis' cache of permitted
    # constants, which every burst would otherwise build again.
    with local_constants_pinned():
        for chunk in plan_chunks(chosen.examples, seed):
            if _run_chunk(machine, chunk, chosen, result, recorder):
                break
    # A hang is not replayed: each replay would cost the whole time limit again.
    hung = isinstance(result.other_error, StepTimeoutError)
    if result.trace is not None and chosen.shrink and not hung and result.interrupted is None:
        try:
            # Knobs go back to their defaults only under the suite's own configs: a
            # strategy of the user's or the engine's may leave out configs the defaults
            # lead to (an engine's unsupported corners).
            _minimize(result, target, plain_knobs=config_strategy is None)
        except KeyboardInterrupt as err:  # keep the trace as Hypothesis shrank it
            result.interrupted = err
    result.seconds = time.perf_counter() - started
    result.examples = recorder.examples
    result.first_failure_example = recorder.first_failure_example
    if result.trace is not None and trace_dir is not None:
        save_trace(result, trace_dir / trace_file_name(trace_stem, seed))
    return result


def _run_chunk(
    machine: type[RuleBasedStateMachine],
    chunk: Chunk,
    chosen: SuiteSettings,
    result: SuiteResult,
    recorder: SuiteRecorder,
) -> bool:
    """One chunk of the series, burst by burst; True when it ended the series (a
    failure, an interrupt), with what it found recorded in the result."""
    # The first burst replays the database's saved failures (Phase.reuse); the others
    # need not replay them again.
    first: tuple[Phase, ...] = ALL_PHASES if chosen.shrink else NO_SHRINK
    later = tuple(p for p in first if p is not Phase.reuse)
    for index, (seed, examples) in enumerate(burst_seeds(chunk)):
        phases = first if index == 0 else later
        if _run_burst(machine, seed, examples, phases, chosen, result, recorder):
            return True
    return False


def _run_burst(
    machine: type[RuleBasedStateMachine],
    seed: int,
    examples: int,
    phases: tuple[Phase, ...],
    chosen: SuiteSettings,
    result: SuiteResult,
    recorder: SuiteRecorder,
) -> bool:
    """One Hypothesis run; True when it ended the series."""

    # Hypothesis hashes the source of the factory it is given, at every run, into the
    # key of its example database: for the machine class, about 6 ms of tokenizing per
    # burst; for this two-line factory, almost nothing. The key then no longer changes
    # with the machine's code: an example saved by an older schedspec replays as
    # whatever its choices draw now, which is still a valid example.
    def new_machine() -> RuleBasedStateMachine:
        return machine()

    hypothesis.seed(seed)(new_machine)
    run_settings = settings(
        max_examples=examples,
        stateful_step_count=rules_for(chosen.rules_per_example),
        deadline=None,
        database=chosen.database,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        # report_multiple_bugs stays on: turning it off also cut shrinking short
        # here (a 33-event counterexample instead of 2). Distinct failures then
        # arrive as an exception group, unpacked below.
        phases=phases,
    )
    try:
        with rarer_collections():
            # Typed as taking the class; documented as taking any callable that
            # returns a machine (run_state_machine_as_test's docstring).
            factory = cast(type[RuleBasedStateMachine], new_machine)
            run_state_machine_as_test(factory, settings=run_settings)
    except TimeBudgetSpent:
        result.budget_spent = True
        return True
    except Unsatisfiable as err:  # every example was rejected while drawing its config
        record_failure(result, ConfigStrategyError(f"no example could draw a config: {err}"))
        return True
    except (Exception, EngineHalt) as err:  # engine crashes and hangs are failures too
        record_failure(result, _blamed(err, recorder.last_failure))
        result.trace = recorder.last_failure
        return True
    except KeyboardInterrupt as err:
        result.interrupted = err
        if recorder.last_error is not None:  # the failure found so far, unshrunk
            record_failure(result, recorder.last_error)
            result.trace = recorder.last_failure
        return True
    return False


def save_trace(result: SuiteResult, path: Path) -> None:
    """Write the result's trace; a failure to is recorded (the finding stands)."""
    assert result.trace is not None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        result.trace.save(path)
    except OSError as err:
        result.trace_error = f"could not write the trace {path}: {err.strerror or err}"
    else:
        result.trace_path = path


# Collect the youngest generation after this many net allocations (CPython's
# default is 700). Hypothesis allocates many short-lived objects per choice, and
# with the default the collector ran often enough to take about a tenth of a
# suite run's CPU (benchmarks/bench_suite.py); memory stays bounded, reference
# counting still frees almost everything at once.
SUITE_GC_THRESHOLD = 10_000


@contextmanager
def rarer_collections() -> Iterator[None]:
    """Raise the youngest generation's collection threshold for the duration."""
    saved = gc.get_threshold()
    gc.set_threshold(max(saved[0], SUITE_GC_THRESHOLD), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def record_failure(result: SuiteResult, failure: BaseException) -> None:
    """File a failure under its kind, replacing whatever was recorded before."""
    result.error = result.divergence = result.other_error = None
    if isinstance(failure, InvariantViolationError):
        result.error = failure
    elif isinstance(failure, DivergenceError):
        result.divergence = failure
    else:
        result.other_error = failure


def _minimize(result: SuiteResult, target: Target, plain_knobs: bool) -> None:
    """Make Hypothesis' shrunk trace 1-minimal over its events (and, with plain_knobs,
    over the config's feature knobs), and report the failure the minimal trace shows
    (kept as the trace's note), so that what is printed and what is saved always agree."""
    assert result.trace is not None
    smaller = minimize_on(result.trace, target, plain_knobs=plain_knobs)
    try:
        replay_target(target, smaller)
    except (Exception, EngineHalt) as err:
        record_failure(result, err)
        note = failure_note(err)
        result.trace = Trace(smaller.config, smaller.events, smaller.model, note=note)


def _first_finding(err: BaseException) -> InvariantViolationError | DivergenceError | None:
    """The violation or divergence in what Hypothesis raised (maybe inside a group)."""
    found = first_in_groups(err, lambda e: isinstance(e, InvariantViolationError | DivergenceError))
    return cast(InvariantViolationError | DivergenceError | None, found)


def _blamed(err: BaseException, trace: Trace | None) -> BaseException:
    """What a failed Hypothesis run is filed under: a finding first, else the engine's
    own error, else err (schedspec's own). The engine's error stays its error when
    replaying the example did not repeat it (Hypothesis then raises FlakyFailure, a
    group holding it): a note says so, and the run exits 4, never 6."""
    found = _first_finding(err)
    if found is not None:
        return found
    engine_error = engine_error_in(err)
    if engine_error is None or engine_error is err:
        return err
    if isinstance(err, Flaky):
        engine_error.add_note(_not_repeated(engine_error, trace))
    return engine_error


def _not_repeated(error: BaseException, trace: Trace | None) -> str:
    """The note on an engine error that replaying its example did not repeat."""
    steps = sum(isinstance(e, Step) for e in trace.events) if trace is not None else None
    where = f" at step {steps}" if steps else ""
    call = engine_call_of(error)
    return (
        f"the engine raised {type(error).__name__}{where} (in {call}); replay did not "
        "repeat it: the engine depends on something besides its calls (time, a counter "
        "across engines, randomness)"
    )


class TimeBudgetSpent(BaseException):
    """Raised between examples once the deadline has passed: a BaseException, so that
    Hypothesis stops at once and takes it for no failure of the test."""


def _stopping_at(
    deadline: float, then: Callable[[SuiteRecorder], None] | None
) -> Callable[[SuiteRecorder], None]:
    """An on_example callback that ends the run once `deadline` has passed, unless a
    failure is being shrunk (its shrinking runs to the end), after calling `then`."""

    def on_example(recorder: SuiteRecorder) -> None:
        if then is not None:
            then(recorder)
        if recorder.last_failure is None and time.time() >= deadline:
            raise TimeBudgetSpent

    return on_example


def _report_each_example(
    machine: type[RuleBasedStateMachine],
    recorder: SuiteRecorder,
    on_example: Callable[[SuiteRecorder], None],
) -> None:
    """Call on_example after each example's teardown (for progress bars)."""
    teardown = machine.teardown

    def reporting_teardown(self: RuleBasedStateMachine) -> None:
        try:
            teardown(self)
        finally:
            on_example(recorder)

    setattr(machine, "teardown", reporting_teardown)  # noqa: B010  (a method, patched on the class)
