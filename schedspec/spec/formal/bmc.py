"""Reachable counterexamples: a broken variant run for k steps from a fresh state.

The inductive query ranges over every state satisfying the invariant, and
some of those no engine reaches. To replay a bug on an engine, this search
asks Z3 for requests, a config and the model's choices such that k steps of
the broken variant, from the state right after the requests arrived, break
the invariant in the last step. Everything it returns maps onto trace
events: add_request per slot, and per step the accepted drafts and the
drafts proposed after it.

Fixed to keep the trace exact: fcfs, prefix caching off (no hits), no
watermark, no stop tokens (requests end at max_tokens or max_model_len).
Async scheduling and spec-decode padding are the search's to choose; under
async, the model's step k schedules step k and lands step k - 1, as the
engine core's batch queue of two does (the first step lands nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import z3

from schedspec.spec.formal.encoding import (
    BoolTerm,
    Choices,
    ConfigTerms,
    IntTerm,
    ModelState,
    Slot,
    symbolic_choices,
    symbolic_config,
)
from schedspec.spec.formal.properties import obligation
from schedspec.spec.formal.solving import value
from schedspec.spec.formal.step import StepResult, step
from schedspec.spec.formal.variants import Variant

# Small bounds keep the search fast and the traces readable.
MAX_MODEL_LEN = 12
MAX_BLOCKS = 8
MAX_BUDGET = 16
MAX_DRAFTS = 2


@dataclass(frozen=True)
class ReachedConfig:
    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int
    long_prefill_needs_chunked_prefill: bool
    num_speculative_tokens: int
    num_lookahead_tokens: int
    async_scheduling: bool
    pad_spec_decode: bool


@dataclass(frozen=True)
class StepChoices:
    accepted: dict[int, int]  # slot -> drafts accepted, for slots whose landing verifies drafts
    proposed: dict[int, int]  # slot -> drafts proposed after the step (> 0 only; synchronous)


@dataclass(frozen=True)
class Reached:
    """A concrete run of the broken variant that ends in a violation."""

    invariant_id: str
    variant: Variant
    config: ReachedConfig
    prompt_lengths: tuple[int, ...]  # one request per slot, in arrival order
    max_tokens: tuple[int, ...]  # per slot
    steps: tuple[StepChoices, ...]
    pre_state: dict[str, int | bool]  # the failing step's pre-state, for printing


def _prompt(i: int) -> IntTerm:
    return z3.Int(f"prompt[{i}]")


def _max_tokens(i: int) -> IntTerm:
    return z3.Int(f"max_tokens[{i}]")


def _fresh(cfg: ConfigTerms, n: int) -> tuple[ModelState, list[BoolTerm]]:
    """The state right after n requests arrived: all waiting, nothing computed or in flight."""
    zero = z3.IntVal(0)
    slots = tuple(
        Slot(
            live=z3.BoolVal(True),
            running=z3.BoolVal(False),
            computed=zero,
            tokens=_prompt(i),
            drafts=zero,
            blocks=zero,
            preemptions=zero,
            in_flight=zero,
            placeholders=zero,
            stale=zero,
            chunk=z3.BoolVal(False),
            token_limit=_prompt(i) + _max_tokens(i),
        )
        for i in range(n)
    )
    bounds = [
        z3.And(
            _prompt(i) >= 1,
            _prompt(i) <= cfg.max_model_len - 1,
            _max_tokens(i) >= 1,
            _max_tokens(i) <= cfg.max_model_len,
        )
        for i in range(n)
    ]
    return ModelState(slots, cfg.num_blocks), bounds


# Block sizes tried in turn (a concrete one keeps the arithmetic linear).
BLOCK_SIZES = (2, 1, 4)


# Run lengths tried in turn: two steps reach most bugs; an async bug in a landing needs
# a third (the first step lands nothing, the second lands the first).
STEP_COUNTS = (2, 3)


def search(
    invariant_id: str,
    variant: Variant,
    n: int = 3,
    steps: Sequence[int] = STEP_COUNTS,
    timeout_s: float = 30.0,
) -> Reached | None:
    """A violation of invariant_id in the last step of the shortest run tried, or None if
    none is found."""
    for num_steps in steps:
        for block_size in BLOCK_SIZES:
            found = _search(invariant_id, variant, n, num_steps, block_size, timeout_s)
            if found is not None:
                return found
    return None


def _search(
    invariant_id: str, variant: Variant, n: int, steps: int, block_size: int, timeout_s: float
) -> Reached | None:
    cfg = replace(
        symbolic_config("cfg."),
        block_size=z3.IntVal(block_size),
        prefix_caching=z3.BoolVal(False),
        watermark_blocks=z3.IntVal(0),
    )
    state, constraints = _fresh(cfg, n)
    constraints += [
        *cfg.constraints(),
        cfg.max_model_len <= MAX_MODEL_LEN,
        cfg.num_blocks <= MAX_BLOCKS,
        cfg.budget <= MAX_BUDGET,
        cfg.num_spec <= MAX_DRAFTS,
        cfg.lookahead <= MAX_DRAFTS,
    ]
    results: list[StepResult] = []
    all_choices: list[list[Choices]] = []
    for k in range(steps):
        choices = [symbolic_choices(f"step{k}.c[{i}]") for i in range(n)]
        constraints += [z3.And(c.hit == 0, z3.Not(c.stop)) for c in choices]
        result = step(cfg, state, choices, variant)
        constraints.append(result.choices_valid)
        results.append(result)
        all_choices.append(choices)
        state = result.post
    solver = z3.Solver()
    solver.set(timeout=int(timeout_s * 1000))
    solver.add(*constraints)
    # Earlier steps keep the invariant (the violation is the last step's).
    for result in results[:-1]:
        solver.add(obligation(cfg, result, invariant_id))
    solver.add(z3.Not(obligation(cfg, results[-1], invariant_id)))
    if solver.check() != z3.sat:
        return None
    model = solver.model()
    return Reached(
        invariant_id=invariant_id,
        variant=variant,
        config=ReachedConfig(
            block_size=int(value(model, cfg.block_size)),
            num_blocks=int(value(model, cfg.num_blocks)),
            max_num_batched_tokens=int(value(model, cfg.budget)),
            max_num_seqs=int(value(model, cfg.max_num_seqs)),
            max_model_len=int(value(model, cfg.max_model_len)),
            enable_chunked_prefill=bool(value(model, cfg.chunked)),
            long_prefill_token_threshold=int(value(model, cfg.threshold)),
            long_prefill_needs_chunked_prefill=bool(value(model, cfg.cap_needs_chunked)),
            num_speculative_tokens=int(value(model, cfg.num_spec)),
            num_lookahead_tokens=int(value(model, cfg.lookahead)),
            async_scheduling=bool(value(model, cfg.async_scheduling)),
            pad_spec_decode=bool(value(model, cfg.pad_spec_decode)),
        ),
        prompt_lengths=tuple(int(value(model, _prompt(i))) for i in range(n)),
        max_tokens=tuple(int(value(model, _max_tokens(i))) for i in range(n)),
        steps=tuple(
            _step_choices(model, cfg, r, c) for r, c in zip(results, all_choices, strict=True)
        ),
        pre_state=describe_state(model, results[-1].pre),
    )


def _step_choices(
    model: z3.ModelRef, cfg: ConfigTerms, r: StepResult, choices: list[Choices]
) -> StepChoices:
    accepted = {
        i: int(value(model, c.accepted))
        for i, c in enumerate(choices)
        if value(model, r.sampled[i]) and int(value(model, r.landings[i].num_drafts)) > 0
    }
    proposes = not value(model, cfg.async_scheduling)  # the engine core proposes only then
    proposed = {
        i: int(value(model, c.new_drafts))
        for i, c in enumerate(choices)
        if proposes
        and value(model, r.sampled[i])
        and not value(model, r.finished[i])
        and int(value(model, c.new_drafts)) > 0
    }
    return StepChoices(accepted, proposed)


SHOWN_FIELDS = (
    "running",
    "computed",
    "tokens",
    "drafts",
    "blocks",
    "preemptions",
    "in_flight",
    "placeholders",
    "stale",
    "chunk",
    "token_limit",
)


def describe_state(model: z3.ModelRef, state: ModelState) -> dict[str, int | bool]:
    """A model state's values by name: free, then each live slot's fields."""
    out: dict[str, int | bool] = {"free": value(model, state.free)}
    for i, slot in enumerate(state.slots):
        if not value(model, slot.live):
            continue
        for field_name in SHOWN_FIELDS:
            out[f"slot{i}.{field_name}"] = value(model, getattr(slot, field_name))
    return out
