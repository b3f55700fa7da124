"""The Z3 model must not drift from the reference: on concrete states, both decide the same.

Hypothesis drives the reference Scheduler (fcfs, prefix caching off: the
counts model's scope) with the harness's fake model, then takes its state as
a model pre-state, evaluates the model's step on it by substitution, and
compares the decisions of the reference's next schedule(): tokens per
request, the preempted set and the admitted set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache

import z3
from hypothesis import given
from hypothesis import strategies as st

from schedspec.properties.fake_model import FakeModel
from schedspec.properties.pipeline import run_step
from schedspec.properties.strategies import configs
from schedspec.reference import Scheduler
from schedspec.spec import Request, RequestStatus, SchedulerConfig, SchedulerOutput, State
from schedspec.spec.formal.encoding import (
    ConfigTerms,
    ModelState,
    concrete_config,
    symbolic_choices,
    symbolic_config,
    symbolic_state,
)
from schedspec.spec.formal.step import StepResult, step
from schedspec.spec.formal.variants import FAITHFUL, Bug, Variant


@cache
def symbolic_step(
    n: int, variant: Variant = FAITHFUL
) -> tuple[ConfigTerms, ModelState, StepResult]:
    cfg = symbolic_config()
    pre = symbolic_state(n)
    return cfg, pre, step(cfg, pre, [symbolic_choices(f"c[{i}]") for i in range(n)], variant)


def bindings(
    config: SchedulerConfig, state: State, order: list[str]
) -> list[tuple[z3.ExprRef, z3.ExprRef]]:
    """The substitution: symbolic config and slots := the reference's values."""
    cfg, pre, _ = symbolic_step(len(order))
    pairs = list(zip(cfg.terms(), concrete_config(config).terms(), strict=True))
    pairs.append((pre.free, z3.IntVal(len(state.kv.free_block_ids))))
    for slot, rid in zip(pre.slots, order, strict=True):
        r = state.requests[rid]
        pairs += [
            (slot.live, z3.BoolVal(True)),
            (slot.running, z3.BoolVal(r.status is RequestStatus.RUNNING)),
            (slot.computed, z3.IntVal(r.num_computed_tokens)),
            (slot.tokens, z3.IntVal(r.num_tokens)),
            (slot.drafts, z3.IntVal(len(r.spec_token_ids))),
            (slot.blocks, z3.IntVal(len(r.block_ids))),
            (slot.preemptions, z3.IntVal(r.num_preemptions)),
        ]
    return pairs


def evaluate(term: z3.ExprRef, pairs: list[tuple[z3.ExprRef, z3.ExprRef]]) -> int | bool:
    value = z3.simplify(z3.substitute(term, *pairs))
    if z3.is_bool(value):
        assert z3.is_true(value) or z3.is_false(value), value
        return bool(z3.is_true(value))
    return int(value.as_long())


@dataclass(frozen=True)
class Decisions:
    scheduled: dict[str, int]  # request -> tokens, scheduled ones only
    preempted: set[str]
    admitted: set[str]


def model_decisions(
    config: SchedulerConfig, state: State, variant: Variant = FAITHFUL
) -> Decisions:
    order = [*state.running, *state.waiting]  # slot order is list order
    pairs = bindings(config, state, order)
    _, _, r = symbolic_step(len(order), variant)
    tokens = {rid: evaluate(r.scheduled[i], pairs) for i, rid in enumerate(order)}
    return Decisions(
        {rid: int(n) for rid, n in tokens.items() if n},
        {rid for i, rid in enumerate(order) if evaluate(r.preempted[i], pairs)},
        {rid for i, rid in enumerate(order) if evaluate(r.admitted[i], pairs)},
    )


def reference_decisions(output: SchedulerOutput) -> Decisions:
    admitted = {r.request_id for r in output.scheduled_new_reqs} | {
        c.request_id for c in output.scheduled_cached_reqs if c.resumed
    }
    return Decisions(dict(output.num_scheduled_tokens), set(output.preempted_req_ids), admitted)


def _tight(config: SchedulerConfig, tight: bool) -> SchedulerConfig:
    # Half the time exactly one max_model_len request of blocks: decodes preempt.
    blocks = -(-config.max_model_len // config.block_size) if tight else config.num_blocks
    return dataclasses.replace(
        config, policy="fcfs", enable_prefix_caching=False, num_blocks=blocks
    )


def model_configs() -> st.SearchStrategy[SchedulerConfig]:
    return st.builds(_tight, configs(max_model_len_cap=24), st.booleans())


def run_reference(
    config: SchedulerConfig, lengths: list[int], max_tokens: list[int], steps: int, seed: int
) -> Scheduler:
    scheduler = Scheduler(config)
    for i, length in enumerate(lengths):
        prompt = [(7 * i + j) % 50 for j in range(min(length, config.max_model_len - 1))]
        scheduler.add_request(Request(f"r{i}", prompt, max_tokens[i]))
    model = FakeModel(seed=seed, num_speculative_tokens=config.num_speculative_tokens)
    for _ in range(steps):
        if scheduler.has_unfinished_requests():
            run_step(scheduler, model)
    return scheduler


@given(
    config=model_configs(),
    lengths=st.lists(st.integers(1, 23), min_size=2, max_size=6),
    max_tokens=st.lists(st.integers(1, 24), min_size=6, max_size=6),
    warmup=st.integers(0, 10),
    seed=st.integers(0, 3),
)
def test_model_and_reference_make_the_same_decisions(
    config: SchedulerConfig, lengths: list[int], max_tokens: list[int], warmup: int, seed: int
) -> None:
    scheduler = run_reference(config, lengths, max_tokens, warmup, seed)
    state = scheduler.snapshot()
    if not state.requests:
        return
    expected = model_decisions(config, state)
    assert expected == reference_decisions(scheduler.schedule())


def test_the_comparison_catches_a_drifted_model() -> None:
    """Two requests, a budget of 4: a model that forgets to charge the budget schedules
    both prompts whole, which the reference does not; the comparison sees it."""
    config = SchedulerConfig(
        block_size=2, num_blocks=8, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=8
    )
    scheduler = run_reference(config, [3, 3], [2, 2], 0, 0)
    state = scheduler.snapshot()
    drifted = model_decisions(config, state, Variant(Bug.BUDGET_NOT_CHARGED))
    actual = reference_decisions(scheduler.schedule())
    assert actual.scheduled == {"r0": 3, "r1": 1}
    assert drifted.scheduled == {"r0": 3, "r1": 3}
    assert drifted != actual
