"""Engines by name: the registry every command and the pytest plugin resolve --engine through.

A name is one of ENGINES ('reference', 'gpu', 'vllm', 'sglang') or `module:factory`, a
callable taking a SchedulerConfig and returning an EngineAdapter (a class
works). Each registered engine knows where its factory lives (imported only
when used, so naming an engine costs nothing until it runs), the configs it
runs by default, and the optional dependency it needs; a `module:factory` that
is a registered engine's own factory is that engine. Adding an engine is one
entry in ENGINES.

Nothing here imports Hypothesis, torch, vLLM or SGLang at import time: the pytest
plugin and every command's --help read ENGINE_FORMS.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from schedspec.engines.boundary import through_the_door
from schedspec.engines.dependencies import (
    SGLANG,
    TORCH,
    VLLM,
    OptionalDependency,
    require,
)
from schedspec.engines.profiles import ProfileError
from schedspec.spec import FAMILIES, Family, shown
from schedspec.spec.invariants import Profile, family_of

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from schedspec.engines.protocol import EngineFactory
    from schedspec.spec import SchedulerConfig


@dataclass(frozen=True)
class NamedEngine:
    name: str
    factory: str  # module:attribute of its factory
    # module:attribute of the config strategy it is checked on by default (a
    # strategy, or a function of no arguments returning one); None: the suite's own.
    configs: str | None = None
    needs: tuple[OptionalDependency, ...] = ()
    # The policy families it implements (SchedulerConfig.family), the default first.
    families: tuple[Family, ...] = ("vllm",)


ENGINES: dict[str, NamedEngine] = {
    engine.name: engine
    for engine in (
        # Both policy families: vLLM V1's by default, SGLang's with family "sglang".
        NamedEngine(
            "reference",
            "schedspec.adapters.reference:reference_engine",
            families=("vllm", "sglang"),
        ),
        # gpu_impl with B = 1, on the suite's own configs (async scheduling,
        # spec-decode padding and both releases' knobs included; it has no KV connector,
        # and the suite's own configs draw none).
        NamedEngine("gpu", "schedspec.adapters.gpu:gpu_engine", needs=(TORCH,)),
        # vLLM's scheduler, the installed release (0.33.0 to 0.34.0: adapters/vllm/
        # releases.py), AsyncScheduler or Scheduler as its engine core picks, on configs
        # as that release runs them: its knob values, sync and async, with and without
        # drafts, padding on with drafts, and the corners of its known findings
        # (docs/FINDINGS.md F2, F3, G1) left out, so a run fails only on something new.
        NamedEngine(
            "vllm",
            "schedspec.adapters.vllm.engine:VllmEngine",
            configs="schedspec.properties.strategies.engine_configs:vllm_default_configs",
            needs=(VLLM,),
        ),
        # SGLang 0.5.23's Scheduler (plain or overlap loop, as the config says), on the
        # SGLang family's configs it runs.
        NamedEngine(
            "sglang",
            "schedspec.adapters.sglang.engine:SGLangEngine",
            configs="schedspec.properties.strategies.engine_configs:sglang_default_configs",
            needs=(SGLANG,),
            families=("sglang",),
        ),
    )
}

# For help texts and errors: "'reference', 'gpu', 'vllm', 'sglang', or module:factory".
ENGINE_FORMS = ", ".join(f"'{name}'" for name in ENGINES) + ", or module:factory"


def named_engine(name: str) -> NamedEngine | None:
    """The registered engine `name` stands for (its name or its factory's), or None."""
    if name in ENGINES:
        return ENGINES[name]
    return next((e for e in ENGINES.values() if e.factory == name), None)


def load_attribute(
    name: str,
    what: str,
    form: str,
    kind: str,
    importer: Callable[[str], ModuleType] = importlib.import_module,
) -> object:
    """The object `module:attribute` names, or a ValueError naming `what`, its `form`
    and the `kind` of object it should be. A module that cannot be found (ImportError)
    is that ValueError too; whatever else importing it raises is the importer's to
    handle (see load_engine_factory and load_config_strategy)."""
    module_name, sep, attribute = name.partition(":")
    dotted = all(part.isidentifier() for part in module_name.split("."))
    if not sep or not dotted or not attribute.isidentifier():
        raise ValueError(f"{what}: expected {form}, got {shown(name)}")
    try:
        module = importer(module_name)
    except ImportError as err:
        raise ValueError(f"{what}: cannot import {module_name!r}: {err}") from None
    if not hasattr(module, attribute):
        raise ValueError(f"{what}: {module_name!r} has no {kind} {attribute!r}")
    found: object = getattr(module, attribute)
    return found


def _import_engine_module(module_name: str) -> ModuleType:
    """An engine's module is the engine's code: what importing it raises, or an attempt
    to end the process, is the engine's failure (engine_boundary), not a usage error."""
    return through_the_door(f"importing {module_name!r}", importlib.import_module, module_name)


def _import_user_module(module_name: str) -> ModuleType:
    """A module of the caller's own (a --configs strategy): what importing it raises, an
    exit included, is a mistake in the input, a ValueError naming it."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise
    except (Exception, SystemExit) as err:
        raise ValueError(
            f"configs: importing {module_name!r} raised {type(err).__name__}: {err}"
        ) from None


def load_engine_factory(name: str) -> EngineFactory:
    """The factory `name` stands for: a registered engine or `module:factory`.

    ValueError when the name does not resolve; MissingDependencyError (a
    ValueError) when the engine needs what this environment lacks.
    """
    engine = named_engine(name)
    if engine is not None:
        require(f"engine {engine.name!r}", *engine.needs)
    target = engine.factory if engine is not None else name
    factory = load_attribute(target, "engine", ENGINE_FORMS, "callable", _import_engine_module)
    if not callable(factory):
        module_name, _, attribute = target.partition(":")
        raise ValueError(f"engine: {module_name!r} has no callable {attribute!r}")
    loaded: EngineFactory = factory
    return loaded


def load_config_strategy(name: str) -> SearchStrategy[SchedulerConfig]:
    """A config strategy named `module:attribute`: the strategy itself, or a function
    of no arguments returning one (e.g. configs narrowed to what an engine runs)."""
    from hypothesis.strategies import SearchStrategy

    found = load_attribute(name, "configs", "'module:strategy'", "strategy", _import_user_module)
    if callable(found) and not isinstance(found, SearchStrategy):
        try:
            found = found()
        except Exception as err:
            raise ValueError(
                f"configs: {name!r} raised {type(err).__name__} when called: {err}"
            ) from None
    if not isinstance(found, SearchStrategy):
        raise ValueError(f"configs: {name!r} is not a Hypothesis strategy")
    try:
        empty = found.is_empty
    except Exception as err:  # a strategy whose definition is invalid
        raise ValueError(f"configs: {name!r} is not a usable strategy: {err}") from None
    if empty:
        raise ValueError(f"configs: {name!r} can draw nothing (st.nothing()?)")
    strategy: SearchStrategy[SchedulerConfig] = found
    return strategy


def run_family(names: Sequence[str], requested: Profile | None = None) -> Family:
    """The policy family engines `names` run in together: the one a requested family
    profile pins down, else the first registered engine's default family if every
    engine implements it, else the first family they all implement. An engine given
    as module:factory may follow any family (building it in one it does not follow is
    its own refusal). ProfileError when a registered engine does not implement the
    family asked for (field "profile"), or the engines share none (field "engines")."""
    wanted = family_of(requested) if requested is not None else None
    candidates: list[Family] = [wanted] if wanted is not None else list(FAMILIES)
    preferred: Family | None = None
    for name in names:
        engine = named_engine(name)
        if engine is None:
            continue
        if wanted is not None and wanted not in engine.families:
            raise ProfileError(
                "profile",
                f"engine {name!r} follows family {' or '.join(map(repr, engine.families))}, "
                f"not {wanted!r}: profile {requested!r} cannot be checked on it",
            )
        candidates = [f for f in candidates if f in engine.families]
        preferred = preferred or engine.families[0]
    if not candidates:
        listed = ", ".join(map(repr, names))
        raise ProfileError("engines", f"{listed} follow no policy family in common")
    return preferred if preferred in candidates else candidates[0]


def default_configs(names: tuple[str, ...]) -> str | None:
    """The config strategy to run engines `names` on together when --configs is not
    given: the one their registered entries name (None: the suite's own, for the
    family of the profile checked: strategies.family_configs).

    Engines with different defaults cannot share one without a choice: ValueError.
    """
    chosen = {e.configs for e in map(named_engine, names) if e is not None and e.configs}
    if len(chosen) > 1:
        listed = ", ".join(sorted(chosen))
        raise ValueError(f"configs: the engines run on different default configs ({listed})")
    return next(iter(chosen), None)
