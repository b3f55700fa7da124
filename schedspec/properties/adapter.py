"""The engine adapter protocol: how schedspec drives any scheduler.

An adapter speaks the spec's types and maps its engine's concrete state to
the abstract spec.State (the refinement mapping). That is all the suite,
the differential runner and trace replay need. The reference scheduler
already speaks these types, so its adapter is three lines
(reference_adapter.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from hypothesis.strategies import SearchStrategy

from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from schedspec.spec.invariants import Profile


class EngineAdapter(Protocol):
    # The profiles the engine claims: "safety", and "vllm-v1" if it makes
    # vLLM V1's exact decisions.
    profiles: frozenset[Profile]

    def add_request(self, request: Request) -> None:
        """Queue a fresh request; raise ValueError (changing nothing) if the spec refuses it."""

    def schedule(self) -> SchedulerOutput: ...

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        """Apply the model's output. Return each sampling request's kept tokens and
        finish status (checked by STOP), or None if the engine does not expose them."""

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None: ...

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        """Abort these requests; unknown or finished ids are ignored."""

    def snapshot(self) -> State:
        """The engine's state seen through the spec (the refinement mapping)."""


EngineFactory = Callable[[SchedulerConfig], EngineAdapter]


def _load_attribute(name: str, what: str, form: str, kind: str) -> object:
    """The object `module:attribute` names, or a ValueError naming `what`, its `form`
    and the `kind` of object it should be."""
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{what}: expected {form}, got {name!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{what}: cannot import {module_name!r}: {err}") from None
    if not hasattr(module, attribute):
        raise ValueError(f"{what}: {module_name!r} has no {kind} {attribute!r}")
    found: object = getattr(module, attribute)
    return found


def load_config_strategy(name: str) -> SearchStrategy[SchedulerConfig]:
    """A config strategy named `module:attribute`: the strategy itself, or a function
    of no arguments returning one (e.g. configs narrowed to what an engine runs)."""
    found = _load_attribute(name, "configs", "'module:strategy'", "strategy")
    if callable(found) and not isinstance(found, SearchStrategy):
        found = found()
    if not isinstance(found, SearchStrategy):
        raise ValueError(f"configs: {name!r} is not a Hypothesis strategy")
    strategy: SearchStrategy[SchedulerConfig] = found
    return strategy


def load_engine_factory(name: str) -> EngineFactory:
    """ "reference", "gpu" (gpu_impl with B = 1), or "module:attribute" naming a factory
    (config -> EngineAdapter)."""
    if name == "reference":
        from schedspec.properties.reference_adapter import reference_engine

        return reference_engine
    if name == "gpu":
        from schedspec.properties.adapters.gpu import gpu_engine

        return gpu_engine
    factory = _load_attribute(name, "engine", "'reference' or 'module:factory'", "callable")
    if not callable(factory):
        module_name, _, attribute = name.partition(":")
        raise ValueError(f"engine: {module_name!r} has no callable {attribute!r}")
    loaded: EngineFactory = factory
    return loaded
