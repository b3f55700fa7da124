"""The invariant suite passes on the reference, on both profiles, reproducibly."""

from __future__ import annotations

import dataclasses
import gc
import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis.stateful import run_state_machine_as_test

from schedspec.adapters.reference import ReferenceEngine, reference_engine
from schedspec.engines.events import AddRequest, Step
from schedspec.properties.checked_engine import CheckedEngine
from schedspec.properties.state_machine import (
    ACTIONS_PER_RULE,
    MAX_INITIAL_ARRIVALS,
    SGLANG_PACE,
    VLLM_PACE,
    SchedulerMachine,
    SuiteRecorder,
    make_state_machine,
    resent,
    rules_for,
)
from schedspec.properties.strategies.actions import (
    ARRIVE,
    EOS_CHOICES,
    KIND_WEIGHTS,
    MAX_STEPS_AFTER_EVENT,
    MAX_STEPS_PER_ACTION,
    NUM_DECISION_CODES,
    NUM_KIND_DRAWS,
    NUM_KINDS,
    NUM_SAMPLING_DRAWS,
    SHARED_PREFIXES,
    STOP_TOKEN_CHOICES,
    URGENT,
    ArriveAction,
    CancelAction,
    DraftsAction,
    RequestDraw,
    StepAction,
    action_pairs,
    actions,
    arrive_action,
    build_add_request,
    cancel_action,
    decode_request_draw,
    drafts_action,
    kinds_left_on,
    step_action,
    unpack,
)
from schedspec.properties.strategies.openings import Opening
from schedspec.properties.suite import (
    SUITE_GC_THRESHOLD,
    SuiteSettings,
    rarer_collections,
    run_suite,
)
from schedspec.spec import Request, SchedulerConfig, SchedulerOutput
from schedspec.spec.invariants import CATALOGUE, Profile, in_profile
from tests.sched_helpers import make_config

LONG = os.environ.get("SCHEDSPEC_LONG") == "1"


@pytest.mark.parametrize("profile", ["safety", "vllm-v1"])
def test_reference_passes_the_suite(profile: Profile) -> None:
    chosen = SuiteSettings.long() if LONG else SuiteSettings(examples=60, rules_per_example=30)
    result = run_suite(
        reference_engine,
        profile,
        SuiteSettings(
            examples=chosen.examples, rules_per_example=chosen.rules_per_example, seed=20261129
        ),
    )
    assert result.passed, result.error or result.other_error
    assert result.stats.steps > 1000
    # Every invariant of the profile ran, and no other: the default configs have one KV
    # cache group, so the hybrid checks are out of scope.
    expected = {
        i.id for i in CATALOGUE.values() if in_profile(i, profile) and i.applies_to(hybrid=False)
    }
    assert set(result.stats.checks) == expected
    assert all(count > 0 for count in result.stats.checks.values())


def test_same_seed_same_run() -> None:
    first = run_suite(reference_engine, "vllm-v1", SuiteSettings(examples=10, seed=7))
    second = run_suite(reference_engine, "vllm-v1", SuiteSettings(examples=10, seed=7))
    assert first.stats.checks == second.stats.checks
    assert first.stats.steps == second.stats.steps


def test_machine_runs_as_a_plain_hypothesis_state_machine() -> None:
    recorder = SuiteRecorder()
    machine = make_state_machine(reference_engine, "safety", recorder=recorder)
    run_state_machine_as_test(machine, settings=settings(max_examples=5, deadline=None))
    assert recorder.examples >= 5
    assert recorder.last_failure is None


def test_profile_not_claimed_is_refused() -> None:
    engine = reference_engine(make_config())
    engine.profiles = frozenset({"safety"})
    with pytest.raises(ValueError, match="profile"):
        CheckedEngine(engine, make_config(), "vllm-v1")


# ------------------------------------------------------------------ the workload


def test_every_example_starts_with_arrivals() -> None:
    """Swarm testing may turn the add_request rule off for a whole example; the
    initial arrivals still give every engine work before its first step."""
    engines: list[ArrivalCountingEngine] = []

    def factory(config: SchedulerConfig) -> ArrivalCountingEngine:
        engines.append(ArrivalCountingEngine(config))
        return engines[-1]

    result = run_suite(factory, "vllm-v1", SuiteSettings(examples=20, seed=3, shrink=False))
    assert result.passed, result.error or result.other_error
    # The run also builds an engine it never steps, to read the capabilities it declares
    # (engines/profiles.py, probe_capabilities): the examples' engines are those stepped.
    stepped = [e for e in engines if e.stepped]
    assert len(stepped) >= 20
    assert all(e.arrivals_before_first_step >= 1 for e in stepped)


def test_sglang_arrivals_come_in_bursts() -> None:
    """SGLang's family (SGLANG_PACE): an arrival brings no engine steps of its own, and an
    example starts with up to twice as many requests; vLLM's steps each arrival's draw."""
    assert VLLM_PACE.max_initial_arrivals == MAX_INITIAL_ARRIVALS
    assert SGLANG_PACE.max_initial_arrivals == 2 * MAX_INITIAL_ARRIVALS
    draw = decode_request_draw(0, 0, 0, 100, 0)  # one token, max_tokens 37: it keeps running
    steps: dict[str, int] = {}
    runs: tuple[tuple[Profile, SchedulerConfig], ...] = (
        ("vllm-v1", make_config()),
        ("sglang", make_config(family="sglang")),
    )
    for profile, config in runs:
        machine = make_state_machine(reference_engine, profile)()
        assert isinstance(machine, SchedulerMachine)
        machine.start(config, 0, Opening.burst([draw]))
        machine.take(ArriveAction(draw, then_steps=5))
        events = machine.engine().trace().events
        steps[profile] = sum(isinstance(e, Step) for e in events)
        machine.teardown()
    assert steps == {"vllm-v1": 5, "sglang": 0}


class ArrivalCountingEngine(ReferenceEngine):
    """The reference, counting the add_request calls it got before its first schedule()."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.arrivals_before_first_step = 0
        self.stepped = False

    def add_request(self, request: Request) -> None:
        self.arrivals_before_first_step += not self.stepped
        super().add_request(request)

    def schedule(self) -> SchedulerOutput:
        self.stepped = True
        return super().schedule()


def test_an_urgent_arrival_is_more_urgent_than_every_live_request() -> None:
    config = make_config()
    urgent = RequestDraw(1, 0, 0, 0, 4, 0, 0, URGENT, 0)
    assert build_add_request(config, "u", ("a", "b"), urgent, (2, 0, 3)).priority == -1
    assert build_add_request(config, "u", ("a",), urgent, (-4,)).priority == -5
    assert build_add_request(config, "u", (), urgent).priority == -1  # nothing live: below 0
    plain = dataclasses.replace(urgent, priority=2)
    assert build_add_request(config, "u", ("a",), plain, (0,)).priority == 2


def test_request_draw_decoding() -> None:
    """Five integers decode to every field; 0 decodes to the simplest request."""
    assert decode_request_draw(0, 0, 0, 0, 0) == RequestDraw(0, 0, 0, 0, 1, 0, 0, 0, 0)
    last = decode_request_draw(9, 7, 256 * len(SHARED_PREFIXES) + 255, 127, 1439)
    assert last == RequestDraw(9, 7, len(SHARED_PREFIXES), 255, 64, 2, 2, URGENT, 19)
    # max_tokens: half of the draws 1-8, the other half 1-64.
    assert [decode_request_draw(0, 0, 0, m, 0).max_tokens for m in (7, 8, 63, 64, 65)] == [
        8,
        1,
        8,
        1,
        2,
    ]
    # Every (door, priority, eos, stop ids) combination has one sampling value, an
    # urgent one four: half the priority draws are urgent.
    combos = Counter(
        (d.door, d.priority, d.eos, d.stop_ids)
        for d in (decode_request_draw(0, 0, 0, 0, s) for s in range(NUM_SAMPLING_DRAWS))
    )
    assert NUM_SAMPLING_DRAWS == 1440
    assert len(combos) == 900 == 20 * (URGENT + 1) * len(EOS_CHOICES) * len(STOP_TOKEN_CHOICES)
    assert {n for combo, n in combos.items() if combo[1] == URGENT} == {4}
    assert {n for combo, n in combos.items() if combo[1] != URGENT} == {1}


# ------------------------------------------------------------------ the actions


def test_zero_unpacks_to_the_simplest_action_of_each_kind() -> None:
    """Shrinking drives every integer to 0: a single plain step, or a bare event."""
    assert step_action(0) == StepAction(num_steps=1, code=0)
    assert arrive_action(0, 0, 0, 0, 0) == ArriveAction(decode_request_draw(0, 0, 0, 0, 0), 0)
    assert cancel_action(0, 0) == CancelAction(pick=0, unknown=0, then_steps=0)
    assert drafts_action(0) == DraftsAction(count=0, then_steps=0)


def test_packed_fields_unpack_least_significant_first() -> None:
    assert unpack(7 + 12 * 300, (12, 1024)) == [7, 300]
    assert step_action(7 + 12 * 300) == StepAction(num_steps=8, code=300)
    assert step_action(MAX_STEPS_PER_ACTION * NUM_DECISION_CODES - 1) == StepAction(
        MAX_STEPS_PER_ACTION, NUM_DECISION_CODES - 1
    )
    # then_steps is the low digit of every event's packed integer.
    assert arrive_action(5 + 9 * 4, 1, 2, 3, 4) == ArriveAction(
        decode_request_draw(4, 1, 2, 3, 4), then_steps=5
    )
    assert cancel_action(77, 8 + 9 * 3) == CancelAction(pick=77, unknown=3, then_steps=8)
    assert cancel_action(77, 8 + 9 * 3 + 9 * 4) == CancelAction(77, 3, 8, retry=True)
    assert cancel_action(77, 8 + 9 * 8) == CancelAction(77, 0, 8, in_flight=True)
    assert drafts_action(2 + 9 * 7) == DraftsAction(count=7, then_steps=2)
    assert MAX_STEPS_AFTER_EVENT == 8  # the 9 above


def test_a_retry_sends_the_cancelled_request_again_without_its_progress() -> None:
    scheduler = ReferenceEngine(make_config(async_scheduling=True))
    scheduler.add_request(Request("r3", (1, 2, 3), 5, eos_token_id=2, stop_token_ids=(4,)))
    scheduler.schedule()  # in flight: 3 computed, 3 in flight, 1 placeholder
    progressed = scheduler.snapshot().requests["r3"]
    assert progressed.num_in_flight_tokens == 3
    assert resent(progressed) == AddRequest("r3", (1, 2, 3), 5, 2, (4,), 0)


def test_every_kind_is_drawn_and_only_one_rule_exists() -> None:
    """One always-enabled rule: no rule selection, nothing for swarm testing to switch off."""
    machine = make_state_machine(reference_engine, "vllm-v1")
    assert [r.function.__name__ for r in machine.setup_state().rules] == ["act"]
    kinds: set[type] = set()

    @settings(max_examples=200, database=None, deadline=None)
    @given(actions())
    def record(action: object) -> None:
        kinds.add(type(action))

    record()
    assert kinds == {StepAction, ArriveAction, CancelAction, DraftsAction}


def test_kinds_left_on_are_picked_in_proportion_to_their_weights() -> None:
    """Every non-empty set of kinds left on divides the kind draw's range evenly."""
    for mask in range(1, 2**NUM_KINDS):
        total = sum(w for kind, w in enumerate(KIND_WEIGHTS) if mask >> kind & 1)
        assert NUM_KIND_DRAWS % total == 0, (mask, total)
    assert KIND_WEIGHTS[ARRIVE] == max(KIND_WEIGHTS)  # arrivals keep requests queueing


def test_the_swarm_never_switches_arrivals_off() -> None:
    """Every example's kinds include arrivals; each other kind is off in some examples
    and on in others, and all of them on where shrinking goes (threshold 0)."""
    assert ARRIVE == 1  # the order NUM_KINDS lists: step, add_request, cancel, drafts
    seen: list[frozenset[int]] = []

    @settings(max_examples=300, database=None, deadline=None)
    @given(kinds_left_on())
    def record(kinds: tuple[int, ...]) -> None:
        seen.append(frozenset(kinds))
        # Each kind on is repeated as often as its weight.
        assert Counter(kinds) == {k: KIND_WEIGHTS[k] for k in set(kinds)}

    record()
    assert all(ARRIVE in kinds for kinds in seen)
    for kind in set(range(NUM_KINDS)) - {ARRIVE}:
        assert any(kind in kinds for kinds in seen) and any(kind not in kinds for kinds in seen)
    assert frozenset({ARRIVE}) in seen  # arrivals alone: nothing else left on
    assert frozenset(range(NUM_KINDS)) in seen  # threshold 0: every kind on


def test_a_rule_applies_two_actions_so_examples_keep_their_size() -> None:
    """rules_per_example counts actions: Hypothesis runs half as many rules."""
    assert ACTIONS_PER_RULE == 2
    assert [rules_for(n) for n in (1, 2, 9, 40, 100)] == [1, 1, 5, 20, 50]
    machine = make_state_machine(reference_engine, "vllm-v1")
    (act,) = machine.setup_state().rules
    assert list(act.arguments) == ["pair"]
    pairs: list[tuple[object, object]] = []

    @settings(max_examples=20, database=None, deadline=None)
    @given(action_pairs())
    def record(pair: tuple[object, object]) -> None:
        pairs.append(pair)

    record()
    assert pairs and all(len(pair) == ACTIONS_PER_RULE for pair in pairs)


def test_the_suite_raises_the_collection_threshold_only_while_it_runs() -> None:
    saved = gc.get_threshold()
    with rarer_collections():
        assert gc.get_threshold()[0] == max(saved[0], SUITE_GC_THRESHOLD)
        assert gc.get_threshold()[1:] == saved[1:]
    assert gc.get_threshold() == saved
