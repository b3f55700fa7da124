"""The Z3 model must not drift from the reference: on concrete states, both do the same.

Hypothesis drives the reference Scheduler (fcfs, prefix caching off: the
counts model's scope; synchronous or async, with or without spec-decode
padding) through the harness, in the engine core's order (a batch queue of
two under async, so a step is in flight between engine steps), then takes
its state as a model pre-state and evaluates the model's engine step on it by
substitution. The state must satisfy the model's inductive invariant (so the
proofs cover the states the reference reaches), and the model must make the
reference's decisions in the next engine step (tokens per request, the
preempted and admitted sets) and leave every request with the reference's
counts, after schedule() and after the landing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import z3
from hypothesis import given
from hypothesis import strategies as st

from schedspec.adapters.reference import ReferenceEngine
from schedspec.engines.events import AddRequest, ProposeDrafts, Step
from schedspec.properties.checked_engine import CheckedEngine
from schedspec.properties.strategies.configs import configs
from schedspec.spec import (
    PLACEHOLDER_TOKEN_ID,
    ModelRunnerOutput,
    RequestOutput,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from schedspec.spec.formal.encoding import (
    Choices,
    ConfigTerms,
    ModelState,
    Slot,
    concrete_config,
    symbolic_choices,
    symbolic_config,
    symbolic_state,
)
from schedspec.spec.formal.properties import state_invariant
from schedspec.spec.formal.step import StepResult, step
from schedspec.spec.formal.variants import FAITHFUL, Bug, Variant
from schedspec.traces.trace import ModelParams, Trace

Pairs = list[tuple[z3.ExprRef, z3.ExprRef]]
TRACES = Path(__file__).parent / "formal_traces"


@dataclass(frozen=True)
class SymbolicStep:
    cfg: ConfigTerms
    pre: ModelState
    choices: tuple[Choices, ...]
    result: StepResult


@cache
def symbolic_step(n: int, variant: Variant = FAITHFUL) -> SymbolicStep:
    cfg = symbolic_config()
    pre = symbolic_state(n)
    choices = tuple(symbolic_choices(f"c[{i}]") for i in range(n))
    return SymbolicStep(cfg, pre, choices, step(cfg, pre, choices, variant))


def slot_values(r: RequestState) -> dict[str, int | bool]:
    """A live request as the counts model sees it (Slot's fields)."""
    return {
        "live": True,
        "running": r.status is RequestStatus.RUNNING,
        "computed": r.num_computed_tokens,
        "tokens": r.num_tokens,
        "drafts": len(r.spec_token_ids),
        "blocks": len(r.block_ids),
        "preemptions": r.num_preemptions,
        "in_flight": r.num_in_flight_tokens,
        "placeholders": r.num_output_placeholders,
        "stale": r.num_stale_output_tokens,
        "chunk": r.is_prefill_chunk,
        "token_limit": len(r.prompt_token_ids) + r.max_tokens,
    }


# What is compared per live request: every field of a slot.
FIELDS = tuple(f.name for f in dataclasses.fields(Slot) if f.name != "live")


def _constant(value: int | bool) -> z3.ExprRef:
    return z3.BoolVal(value) if isinstance(value, bool) else z3.IntVal(value)


def bindings(config: SchedulerConfig, state: State, order: list[str]) -> Pairs:
    """The substitution: symbolic config and slots := the reference's values."""
    sym = symbolic_step(len(order))
    pairs = list(zip(sym.cfg.terms(), concrete_config(config).terms(), strict=True))
    pairs.append((sym.pre.free, z3.IntVal(len(state.kv.free_block_ids))))
    for slot, rid in zip(sym.pre.slots, order, strict=True):
        values = slot_values(state.requests[rid])
        pairs += [(getattr(slot, name), _constant(v)) for name, v in values.items()]
    return pairs


def evaluate(term: z3.ExprRef, pairs: Pairs) -> int | bool:
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
    r = symbolic_step(len(order), variant).result
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


class RecordingReference(ReferenceEngine):
    """The reference, remembering what its last engine step did: the output it scheduled
    and its state then, and the output that landed and what it reported."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.begin_step()

    def begin_step(self) -> None:
        self.scheduled: tuple[SchedulerOutput, State] | None = None
        self.landed: tuple[ModelRunnerOutput, Mapping[str, RequestOutput]] | None = None

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        self.scheduled = (output, self.snapshot())
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        reported = super().update_from_output(scheduler_output, model_runner_output)
        self.landed = (model_runner_output, reported)
        return reported


def choice_bindings(engine: RecordingReference, order: list[str], post: State, n: int) -> Pairs:
    """The harness's choices := what the model did in the landing: accepted drafts,
    tokens kept (no EOS or stop tokens here: length caps only), drafts proposed."""
    sampled = engine.landed[0].sampled_token_ids if engine.landed else {}
    reported = engine.landed[1] if engine.landed else {}
    pairs: Pairs = []
    for c, rid in zip(symbolic_step(n).choices, order, strict=True):
        emitted = sampled.get(rid, ())
        kept = len(reported[rid].new_token_ids) if rid in reported else 0
        live = post.requests.get(rid)
        pairs += [
            (c.hit, z3.IntVal(0)),
            (c.accepted, z3.IntVal(max(len(emitted) - 1, 0))),
            (c.kept, z3.IntVal(kept)),
            (c.stop, z3.BoolVal(False)),
            (c.new_drafts, z3.IntVal(len(live.spec_token_ids) if live is not None else 0)),
        ]
    return pairs


def model_counts(
    slots: tuple[Slot, ...], free: z3.ExprRef, order: list[str], pairs: Pairs
) -> tuple[int | bool, dict[str, dict[str, int | bool]]]:
    """The model's free count, and each live slot's fields by request."""
    counts = {}
    for slot, rid in zip(slots, order, strict=True):
        if evaluate(slot.live, pairs):
            counts[rid] = {name: evaluate(getattr(slot, name), pairs) for name in FIELDS}
    return evaluate(free, pairs), counts


def reference_counts(
    state: State, order: list[str]
) -> tuple[int, dict[str, dict[str, int | bool]]]:
    counts = {
        rid: {name: slot_values(state.requests[rid])[name] for name in FIELDS}
        for rid in order
        if rid in state.requests
    }
    return len(state.kv.free_block_ids), counts


def _tight(config: SchedulerConfig, tight: bool) -> SchedulerConfig:
    # Half the time exactly one max_model_len request of blocks: decodes preempt.
    blocks = -(-config.max_model_len // config.block_size) if tight else config.num_blocks
    return dataclasses.replace(
        config, policy="fcfs", enable_prefix_caching=False, num_blocks=blocks
    )


def model_configs() -> st.SearchStrategy[SchedulerConfig]:
    return st.builds(_tight, configs(max_model_len_cap=24), st.booleans())


def drive(
    config: SchedulerConfig, lengths: list[int], max_tokens: list[int], steps: int, seed: int
) -> tuple[CheckedEngine, RecordingReference]:
    """Requests r0.. added, then `steps` engine steps in the engine core's order."""
    engine = RecordingReference(config)
    checked = CheckedEngine(engine, config, "vllm-v1", ModelParams(seed=seed))
    for i, length in enumerate(lengths):
        prompt = tuple((7 * i + j) % 50 for j in range(min(length, config.max_model_len - 1)))
        checked.apply(AddRequest(f"r{i}", prompt, max_tokens[i]))
    for _ in range(steps):
        if checked.state.requests:
            engine_step(checked, engine)
    return checked, engine


def engine_step(
    checked: CheckedEngine,
    engine: RecordingReference,
    event: Step | None = None,
    drafts: Mapping[str, int] | None = None,
) -> None:
    """One engine step; synchronous with speculation, the drafter proposes after it:
    `drafts` (request -> how many), by default num_spec to every request that sampled."""
    engine.begin_step()
    checked.apply(event or Step())
    config = checked.config
    if config.async_scheduling or not config.num_speculative_tokens or not engine.landed:
        return
    if drafts is None:
        k = config.num_speculative_tokens
        drafts = dict.fromkeys(engine.landed[0].sampled_token_ids, k)
    if drafts:
        checked.apply(ProposeDrafts(drafts))


def compare_step(
    checked: CheckedEngine,
    engine: RecordingReference,
    event: Step | None = None,
    drafts: Mapping[str, int] | None = None,
) -> None:
    """One engine step of the reference, held against the model's on the same state."""
    config, pre = checked.config, checked.state
    order = [*pre.running, *pre.waiting]  # slot order is list order
    n = len(order)
    sym = symbolic_step(n)
    pairs = bindings(config, pre, order)
    # The proofs assume the invariant: it must hold where the reference is.
    assert evaluate(state_invariant(sym.cfg, sym.pre), pairs) is True, "invariant"
    expected = model_decisions(config, pre)
    engine_step(checked, engine, event, drafts)
    assert engine.scheduled is not None
    output, mid = engine.scheduled
    assert expected == reference_decisions(output)
    post = checked.state
    pairs += choice_bindings(engine, order, post, n)
    r = sym.result
    assert evaluate(r.choices_valid, pairs) is True, "the harness's choices"
    assert model_counts(r.mid.slots, r.mid.free, order, pairs) == reference_counts(mid, order)
    assert model_counts(r.post.slots, r.post.free, order, pairs) == reference_counts(post, order)


# One-token prompts half the time: an admission with one token to compute is the one
# spec-decode padding pads.
PROMPT_LENGTHS = st.one_of(st.just(1), st.integers(1, 23))


@given(
    config=model_configs(),
    lengths=st.lists(PROMPT_LENGTHS, min_size=2, max_size=6),
    max_tokens=st.lists(st.integers(1, 24), min_size=6, max_size=6),
    warmup=st.integers(0, 10),
    seed=st.integers(0, 3),
)
def test_model_and_reference_make_the_same_step(
    config: SchedulerConfig, lengths: list[int], max_tokens: list[int], warmup: int, seed: int
) -> None:
    checked, engine = drive(config, lengths, max_tokens, warmup, seed)
    if checked.state.requests:
        compare_step(checked, engine)


@pytest.mark.parametrize("path", sorted(TRACES.glob("*.json")), ids=lambda p: p.stem)
def test_model_and_reference_agree_on_every_step_of_the_formal_traces(path: Path) -> None:
    """The counterexample runs reach the corners (a stale landing with rejected drafts,
    a preemption with output in flight): on the reference, the model agrees at each step."""
    trace = Trace.load(path)
    engine = RecordingReference(trace.config)
    checked = CheckedEngine(engine, trace.config, "vllm-v1", trace.model)
    events = list(trace.events)
    compared = 0
    for i, event in enumerate(events):
        if isinstance(event, AddRequest):
            checked.apply(event)
        elif isinstance(event, Step):
            following = events[i + 1] if i + 1 < len(events) else None
            drafts = following.num_drafts if isinstance(following, ProposeDrafts) else {}
            compare_step(checked, engine, event, drafts)
            compared += 1
    while checked.state.requests:  # the drain
        compare_step(checked, engine)
        compared += 1
    assert compared >= 2


def test_a_padded_admission() -> None:
    """Async, K = 1, a budget of 4: r0's 4-token prefill uses it all; next step r0 asks
    for 2 (its in-flight output's position and a placeholder draft) and r1, one token to
    compute, is padded to 1 + K = 2 with a placeholder draft; the model does the same."""
    config = SchedulerConfig(
        block_size=2,
        num_blocks=8,
        max_num_batched_tokens=4,
        max_num_seqs=2,
        max_model_len=12,
        num_speculative_tokens=1,
        async_scheduling=True,
        pad_spec_decode=True,
    )
    checked, engine = drive(config, [4, 1], [4, 4], 1, 0)
    compare_step(checked, engine)
    assert engine.scheduled is not None
    output = engine.scheduled[0]
    assert dict(output.num_scheduled_tokens) == {"r0": 2, "r1": 2}
    assert output.scheduled_spec_decode_tokens["r1"] == (PLACEHOLDER_TOKEN_ID,)


def test_an_async_step_lands_the_one_in_flight() -> None:
    """A worked example of the model's async engine step: r0's prefill (5 tokens) is in
    flight and samples; the next step schedules r0's next position (the in-flight
    output's) and lands the prefill. The model's counts are the reference's
    (compare_step), and these are they."""
    config = SchedulerConfig(
        block_size=2,
        num_blocks=8,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=12,
        async_scheduling=True,
    )
    checked, engine = drive(config, [5], [4], 1, 0)

    def counts() -> tuple[int, int, int, int]:
        r0 = checked.state.requests["r0"]
        return (
            r0.num_computed_tokens,
            r0.num_tokens,
            r0.num_in_flight_tokens,
            r0.num_output_placeholders,
        )

    assert counts() == (5, 5, 5, 1)
    compare_step(checked, engine)
    # Step 2 (1 token) is in flight; the prefill's token landed: confirmed 6 - 1 = 5.
    assert counts() == (6, 6, 1, 1)


def test_the_comparison_catches_a_drifted_model() -> None:
    """Two requests, a budget of 4: a model that forgets to charge the budget schedules
    both prompts whole, which the reference does not; the comparison sees it."""
    config = SchedulerConfig(
        block_size=2, num_blocks=8, max_num_batched_tokens=4, max_num_seqs=2, max_model_len=8
    )
    checked, engine = drive(config, [3, 3], [2, 2], 0, 0)
    state = checked.state
    drifted = model_decisions(config, state, Variant(Bug.BUDGET_NOT_CHARGED))
    engine_step(checked, engine)
    assert engine.scheduled is not None
    actual = reference_decisions(engine.scheduled[0])
    assert actual.scheduled == {"r0": 3, "r1": 1}
    assert drifted.scheduled == {"r0": 3, "r1": 3}
    assert drifted != actual
