"""Make a failing trace 1-minimal: no single event can be dropped or simplified.

Hypothesis shrinks the choices behind a state-machine run, but its deletions
often misalign the rules that follow (an earlier add changes which request a
later rule picks). Traces replay on any engine, so a last pass over the
events themselves is cheap and exact: drop a run of identical steps (all but one,
or half, in one replay: a long run of plain steps goes in a few replays, not one
per step), drop one event, reset one step's decisions to the defaults, cut a
prompt short (to one token, or half), or set one feature knob of the config (policy,
watermark, prefix caching, drafts, async scheduling, ...) back to its default,
replay, and keep the change if the same failure still shows: one of the
invariants the original broke, a divergence in the same field (lockstep
targets), or an engine error of the same type. Hypothesis alone can leave a
config with knobs the failure does not need: a config regime turns several on
at once (strategies/regimes.py), and its shrinker cannot leave the regime in one move.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from schedspec.engines.capabilities import ALL_CAPABILITIES, Capability, needed_capabilities
from schedspec.engines.errors import EngineHalt
from schedspec.engines.events import AddRequest, Event, Step
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.watchdog import StepTimeoutError
from schedspec.properties.checked_engine import InvariantViolationError
from schedspec.properties.harness import SingleEngine, Target, replay_target
from schedspec.spec import SchedulerConfig
from schedspec.spec.errors import ConfigError
from schedspec.spec.invariants import Profile
from schedspec.traces.divergence import DivergenceError
from schedspec.traces.trace import Trace


def failure_signature(trace: Trace, target: Target) -> frozenset[str]:
    """What the trace breaks on the target at its first failing event (empty if it passes):
    invariant ids, "divergence: <what> <field>", or "engine error: <type>"."""
    try:
        replay_target(target, trace)
    except InvariantViolationError as err:
        return frozenset(v.invariant for v in err.violations)
    except DivergenceError as err:
        found = err.divergence
        return frozenset({f"divergence: {found.observed} {found.field}"})
    except StepTimeoutError:
        return frozenset({"engine hang"})
    except EngineHalt as err:  # it tried to end the process
        return frozenset({f"engine halt: {type(err).__name__}"})
    except Exception as err:  # a candidate that crashes the engine is judged, not fatal
        return frozenset({f"engine error: {type(err).__name__}"})
    return frozenset()


def failing_ids(trace: Trace, factory: EngineFactory, profile: Profile) -> frozenset[str]:
    """The invariants the trace breaks at its first broken event (empty if it passes)."""
    return failure_signature(trace, SingleEngine(factory, profile))


def minimize_trace(
    trace: Trace,
    factory: EngineFactory,
    profile: Profile,
    time_limit: float = 20.0,
    clock: Callable[[], float] = time.monotonic,
) -> Trace:
    """The smallest trace reachable by single-event drops, step simplifications and
    feature knobs set back to their defaults that still breaks one of the invariants
    the original broke."""
    return minimize_on(trace, SingleEngine(factory, profile), time_limit, clock)


def minimize_on(
    trace: Trace,
    target: Target,
    time_limit: float = 20.0,
    clock: Callable[[], float] = time.monotonic,
    plain_knobs: bool = True,
) -> Trace:
    """minimize_trace for any target: a single engine, or two in lockstep. With
    plain_knobs off the config is kept as it is (the caller's configs may leave out
    those the defaults lead to)."""
    wanted = failure_signature(trace, target)
    if not wanted:
        return trace  # it does not fail here: nothing to keep failing
    deadline = clock() + time_limit
    events = list(trace.events)
    config = trace.config
    # What the engines declare bounds the plainer configs; reading it builds an engine, so
    # once per minimization, not once per pass.
    capabilities = target.capabilities() if plain_knobs else frozenset()
    changed = True
    while changed and clock() < deadline:
        changed = False
        index = len(events) - 1
        while index >= 0 and clock() < deadline:
            for candidate in _simpler(events, index):
                if wanted & failure_signature(_with(trace, candidate, config), target):
                    events = candidate
                    changed = True
                    break
            index = min(index, len(events)) - 1
        knobs = plainer_configs(config, capabilities) if plain_knobs else []
        for plainer in knobs:
            if clock() >= deadline:
                break
            if wanted & failure_signature(_with(trace, events, plainer), target):
                config = plainer
                changed = True  # fewer knobs on may let more events go
                break
    return _with(trace, events, config)


def _simpler(events: list[Event], index: int) -> list[list[Event]]:
    """Candidates simpler at `index`: the run of identical steps it ends shortened, then
    without it, or (a step) a plain one, or one with default decisions that keeps its
    aborts in flight, or (an arrival) with a shorter prompt."""
    without = events[:index] + events[index + 1 :]
    event = events[index]
    if isinstance(event, AddRequest):
        return [without, *_shorter_prompts(events, index, event)]
    if not isinstance(event, Step):
        return [without]
    shortened = _shorter_runs(events, index)
    if event == Step():
        return [*shortened, without]
    plainer = [Step()]
    if event.aborts and event != Step(aborts=event.aborts):
        plainer.append(Step(aborts=event.aborts))
    return [
        *shortened,
        without,
        *([*events[:index], step, *events[index + 1 :]] for step in plainer),
    ]


def _shorter_runs(events: list[Event], last: int) -> list[list[Event]]:
    """For a run of n >= 3 identical steps ending at `last`: the run cut to one step, then
    to half. (n = 2 is one drop, which the single-event candidate tries.)"""
    first = last
    while first > 0 and events[first - 1] == events[last]:
        first -= 1
    length = last - first + 1
    if length < 3:
        return []
    return [events[: first + keep] + events[last + 1 :] for keep in (1, length - length // 2)]


def _shorter_prompts(events: list[Event], index: int, event: AddRequest) -> list[list[Event]]:
    """The arrival with its prompt cut to its first token, then to its first half: a
    failure rarely needs a 63-token prompt, and a shorter one needs fewer prefill steps.
    A prompt the KV connector holds remotely keeps its length (the remote part is a
    share of it)."""
    prompt = event.prompt_token_ids
    if event.remote_kv is not None:
        return []
    lengths = sorted({1, len(prompt) // 2} - {0, len(prompt)})
    return [
        [
            *events[:index],
            dataclasses.replace(event, prompt_token_ids=prompt[:length]),
            *events[index + 1 :],
        ]
        for length in lengths
    ]


# The knobs that switch a feature on or set a policy, each with its default: the sizes
# (block_size, num_blocks, the budget, seats, max_model_len) are left to Hypothesis,
# which shrinks them, and the family names whose scheduler runs.
FEATURE_KNOBS = tuple(
    f.name
    for f in dataclasses.fields(SchedulerConfig)
    if f.default is not dataclasses.MISSING and f.name != "family"
)
# Setting a knob back may need others to follow it to stay a valid config.
_FOLLOWERS: dict[str, dict[str, object]] = {
    "num_speculative_tokens": {"num_lookahead_tokens": None, "pad_spec_decode": False},
}


def plainer_configs(
    config: SchedulerConfig, capabilities: frozenset[Capability] = ALL_CAPABILITIES
) -> list[SchedulerConfig]:
    """The config with one feature knob set back to its default, for each knob that is
    not at its default (and a valid config that way), in field order; never one that
    needs a capability the engine lacks (chunked prefill is on by default)."""
    allowed = capabilities | needed_capabilities(config)
    plainer: list[SchedulerConfig] = []
    for field in dataclasses.fields(config):
        if field.name not in FEATURE_KNOBS or getattr(config, field.name) == field.default:
            continue
        changes = {field.name: field.default, **_FOLLOWERS.get(field.name, {})}
        try:
            candidate = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
        except ConfigError:
            continue  # not valid in this family, or with these sizes
        # num_lookahead_tokens is stored resolved: its default may be the value it has.
        if candidate != config and needed_capabilities(candidate) <= allowed:
            plainer.append(candidate)
    return plainer


def _with(trace: Trace, events: list[Event], config: SchedulerConfig) -> Trace:
    return Trace(config, tuple(events), trace.model, trace.note)
