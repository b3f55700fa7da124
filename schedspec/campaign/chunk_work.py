"""What one chunk of a parallel run does, in whichever worker runs it.

ChunkWork is the `work` every ChunkRunner is given: it opens its target from a
TargetRecipe, runs the chunk's examples on the chunk's seed (run_target, the one suite
runner), reports progress through workers.report_progress, and hands back a
ChunkOutcome of plain data. A recipe is either the target itself (BuiltTarget: forked
workers copy it, so it need not pickle) or engine names (NamedEngines: it pickles, so
Ray can ship it to another machine, where the engines are loaded again by name).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple, Protocol

from hypothesis import strategies as st

from schedspec.campaign.example_db import DatabaseSource
from schedspec.campaign.workers import report_progress
from schedspec.engines.boundary import guarded
from schedspec.engines.errors import engine_call_of
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.registry import load_config_strategy
from schedspec.engines.remote.engine import RemoteEngineFactory, engine_factory
from schedspec.engines.watchdog import StepTimeoutError, Watchdog
from schedspec.properties.differential import DiffOptions, LockstepTarget
from schedspec.properties.harness import SingleEngine, Target
from schedspec.properties.run_plan import RunPlan
from schedspec.properties.state_machine import SuiteRecorder
from schedspec.properties.strategies.configs import ConfigStrategyError
from schedspec.properties.suite import Chunk, SuiteResult, SuiteSettings, run_target
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile
from schedspec.traces.trace import DIFF_TRACE_STEM, FAILURE_TRACE_STEM

Configs = st.SearchStrategy[SchedulerConfig] | None
Command = Literal["check", "diff"]


class TargetRecipe(Protocol):
    @property
    def trace_stem(self) -> str:
        """The stem of its failures' trace files (trace.trace_file_name)."""
        ...

    def opened(self) -> AbstractContextManager[tuple[Target, Configs]]:
        """The target and its config strategy, ready for a chunk, closed after it."""
        ...


@dataclass(frozen=True)
class BuiltTarget:
    """A target built by the caller: for forked workers only (it need not pickle)."""

    target: Target
    configs: Configs = None
    trace_stem: str = FAILURE_TRACE_STEM

    def opened(self) -> AbstractContextManager[tuple[Target, Configs]]:
        return nullcontext((self.target, self.configs))


@dataclass(frozen=True)
class NamedEngines:
    """`check` of one engine or `diff` of two, by name (engines/registry.py), as a
    plain value: each worker loads the engines and the configs again and guards every
    engine call with a step time limit of its own. An engine given another interpreter
    runs in a process of it that the worker starts for the chunk and ends after it
    (engines/remote/; on Ray, the interpreter's path must exist on every node)."""

    command: Command
    engines: tuple[str, ...]  # one for check; left and right for diff
    profile: Profile
    configs: str | None = None  # module:strategy; None: the suite's own
    step_timeout: float | None = None
    compare_block_ids: bool = False
    # The interpreter of each engine, in the order of `engines` (None: the worker's
    # own); empty: all in the worker's own.
    pythons: tuple[str | None, ...] = ()

    @staticmethod
    def of_plan(
        plan: RunPlan, step_timeout: float | None = None, compare_block_ids: bool = False
    ) -> NamedEngines:
        """The plan's engines: `check` of one, `diff` of a pair."""
        command: Command = "diff" if len(plan.request.engines) == 2 else "check"
        names = plan.request.names
        pythons = tuple(engine.python for engine in plan.request.engines)
        return NamedEngines(
            command,
            names,
            plan.profile,
            plan.configs,
            step_timeout,
            compare_block_ids,
            pythons if any(pythons) else (),  # all here: the recipe as it always was
        )

    @property
    def trace_stem(self) -> str:
        return DIFF_TRACE_STEM if self.command == "diff" else FAILURE_TRACE_STEM

    def target(self, factories: Sequence[EngineFactory]) -> Target:
        """The target over factories the caller built (guarded already)."""
        if self.command == "diff":
            left, right = factories
            options = DiffOptions(compare_block_ids=self.compare_block_ids)
            return LockstepTarget(left, right, self.profile, options)
        (factory,) = factories
        return SingleEngine(factory, self.profile)

    @contextmanager
    def opened(self) -> Iterator[tuple[Target, Configs]]:
        pythons = self.pythons or (None,) * len(self.engines)
        with ExitStack() as processes:
            factories = []
            for name, python in zip(self.engines, pythons, strict=True):
                factory = engine_factory(name, python)
                if isinstance(factory, RemoteEngineFactory):  # its process ends with the chunk
                    processes.enter_context(factory)
                factories.append(factory)
            configs = load_config_strategy(self.configs) if self.configs is not None else None
            with Watchdog(self.step_timeout) as watchdog:
                guarded_factories = [guarded(factory, watchdog) for factory in factories]
                yield self.target(guarded_factories), configs


class ChunkProgress(NamedTuple):
    """What a chunk's work reports while it runs: its own counts so far."""

    examples: int
    steps: int


@dataclass(frozen=True)
class ChunkOutcome:
    """What a worker sends back: plain data only."""

    chunk: Chunk
    kind_runs: dict[Any, int]
    corners: dict[str, int]
    steps: int
    events: int
    examples: int
    failed: bool
    first_failure_example: int | None
    label: str | None  # what failed (failure_label), when it failed
    trace: dict[str, Any] | None
    config_strategy_error: str | None  # the --configs strategy failed: no trace to replay
    # A KeyboardInterrupt ended the chunk: workers ignore Ctrl-C, so the engine raised
    # it; reported as the same interrupt would be in one process.
    interrupted: bool
    budget_spent: bool  # the campaign's deadline stopped it early


@dataclass(frozen=True)
class ChunkWork:
    """A chunk's examples on its seed through the recipe's target; the settings' own
    examples and seed are replaced by the chunk's, the database opened in the worker."""

    recipe: TargetRecipe
    settings: SuiteSettings
    database: DatabaseSource | None = None

    def __call__(self, chunk: Chunk) -> ChunkOutcome:
        database = self.database.open() if self.database is not None else None
        share = replace(self.settings, examples=chunk.examples, seed=chunk.seed, database=database)
        with self.recipe.opened() as (target, configs):
            result = run_target(target, share, configs, on_example=_report)
        report_progress(ChunkProgress(result.examples, result.stats.steps), final=True)
        return _outcome(chunk, result)


def _report(recorder: SuiteRecorder) -> None:
    report_progress(ChunkProgress(recorder.examples, recorder.stats.steps))


def _outcome(chunk: Chunk, result: SuiteResult) -> ChunkOutcome:
    config_error = result.other_error
    label = failure_label(result)
    return ChunkOutcome(
        chunk,
        dict(result.stats.kind_runs),
        dict(result.stats.corners),
        result.stats.steps,
        result.stats.events,
        result.examples,
        label is not None,
        result.first_failure_example,
        label,
        result.trace.to_json() if result.trace is not None else None,
        str(config_error) if isinstance(config_error, ConfigStrategyError) else None,
        result.interrupted is not None,
        result.budget_spent,
    )


def failure_label(result: SuiteResult) -> str | None:
    """What a failed run found, as the key campaigns deduplicate its traces by: the
    invariants that broke, where two engines diverged, or what the engine did."""
    if result.error is not None:
        return ", ".join(sorted({v.invariant for v in result.error.violations}))
    if result.divergence is not None:
        return f"divergence on {result.divergence.divergence.path}"
    error = result.other_error
    if error is None:
        return None
    if isinstance(error, StepTimeoutError):
        return f"hang in {error.call}"
    call = engine_call_of(error)
    if call is not None:
        return f"engine error {type(error).__name__} in {call}"
    return f"harness error {type(error).__name__}"
