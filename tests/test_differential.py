"""The lockstep differential runner: hand-made traces, then random workloads."""

from __future__ import annotations

from pathlib import Path

from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import Abort, AddRequest, Drain, Event, ProposeDrafts, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.engines.recording import ModelAnswer, Snapshot
from schedspec.properties.differential import (
    DiffOptions,
    Lockstep,
    LockstepTarget,
    SideViolationError,
    diff_trace,
    run_diff,
)
from schedspec.properties.minimize import failure_signature, minimize_on
from schedspec.properties.suite import SuiteSettings
from schedspec.spec import ModelRunnerOutput, SchedulerConfig
from schedspec.traces.divergence import first_difference
from schedspec.traces.trace import ModelParams, Trace
from tests.broken_engines import crashing, wrong_total
from tests.diff_engines import relabelled, short_prefill, victim

# Three 3-token prompts fill the six 2-token blocks; the first decode that
# needs a third block must preempt someone.
TIGHT = SchedulerConfig(
    block_size=2,
    num_blocks=6,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=12,
    enable_prefix_caching=False,
    watermark=0.0,
)
THREE = (
    AddRequest("a", (1, 2, 3), 8),
    AddRequest("b", (4, 5, 6), 8),
    AddRequest("c", (4, 5, 6), 8),
)
PREEMPTING = Trace(TIGHT, (*THREE, Step(), Step(), Step(), Drain()))

# Speculation, a prefix hit, an abort and a forced stop: a trace that walks
# most paths, for the engines that must agree.
BUSY = Trace(
    SchedulerConfig(
        block_size=2,
        num_blocks=10,
        max_num_batched_tokens=6,
        max_num_seqs=3,
        max_model_len=16,
        long_prefill_token_threshold=4,
        num_speculative_tokens=2,
    ),
    (
        AddRequest("a", (1, 2, 3, 4, 5), 6, eos_token_id=2),
        AddRequest("b", (1, 2, 3, 4, 0, 0), 5),
        Step(),
        Step(),
        ProposeDrafts({"a": 2, "b": 1}),
        Step(StepDecisions(accepted={"a": 1})),
        AddRequest("c", (3, 3, 3), 4),
        Abort(("b", "no-such-request")),
        Step(StepDecisions(stops={"a": 2})),
        Drain(),
    ),
    ModelParams(seed=3),
)


class TestIdenticalEngines:
    def test_the_reference_agrees_with_itself_at_every_call(self) -> None:
        for options in (DiffOptions(), DiffOptions(compare_block_ids=True)):
            result = diff_trace(BUSY, reference_engine, reference_engine, "vllm-v1", options)
            assert result.passed, result.divergence or result.violation or result.error
            assert [e.index for e in result.entries] == list(range(len(BUSY.events)))
            assert all(left == right for e in result.entries for left, right in [e.outputs])
            assert result.stats.steps > 4  # the steps, and the drain's

    def test_each_engine_gets_its_own_model_and_both_get_the_same_answers(self) -> None:
        lockstep = Lockstep(reference_engine, reference_engine, BUSY.config, "vllm-v1", BUSY.model)
        left, right = lockstep.checked
        assert left.model is not right.model  # no shared state between the sides
        answers: list[list[ModelAnswer]] = [[], []]
        for event in BUSY.events:
            lockstep.apply(event)
            for side in (0, 1):
                answers[side] += [
                    o for o in lockstep.observations(side) if isinstance(o, ModelAnswer)
                ]
        assert answers[0] == answers[1]
        assert any(a.output.sampled_token_ids for a in answers[0])

    def test_block_numbering_counts_only_when_asked(self) -> None:
        # The mirrored engine decides like the reference; only its block ids differ.
        assert diff_trace(BUSY, reference_engine, relabelled, "vllm-v1").passed
        strict = DiffOptions(compare_block_ids=True)
        found = diff_trace(BUSY, reference_engine, relabelled, "vllm-v1", strict).divergence
        assert found is not None
        assert (found.event, found.observed, found.field) == (
            None,
            "first snapshot",
            "free_block_ids",
        )
        assert found.where == "at the start"


class TestDivergence:
    def test_the_victim_engine_diverges_at_the_preemption(self) -> None:
        result = diff_trace(PREEMPTING, reference_engine, victim, "safety")
        found = result.divergence
        assert found is not None and result.violation is None and result.error is None
        assert (found.event_index, found.event, found.step) == (5, Step(), 0)
        assert (found.observed, found.field) == ("schedule() output", "num_scheduled_tokens")
        # The reference preempts the newest request (c), the victim engine an older one (b).
        assert (found.left, found.right) == ((("a", 1), ("b", 1)), (("a", 1), ("c", 1)))
        assert str(found) == (
            "after event 5 (Step), schedule() output: num_scheduled_tokens differs: "
            "left a=1 b=1, right a=1 c=1"
        )
        assert len(result.entries) == 6  # it stopped there

    def test_a_divergence_inside_a_drain_names_its_step(self) -> None:
        drained = Trace(TIGHT, (*THREE, Drain()))
        found = diff_trace(drained, reference_engine, victim, "safety").divergence
        assert found is not None
        assert (found.event_index, found.step) == (3, 2)
        assert found.where == "after event 3 (Drain), step 3 of it"

    def test_one_token_less_shows_at_the_first_prefill(self) -> None:
        found = diff_trace(PREEMPTING, reference_engine, short_prefill, "safety").divergence
        assert found is not None
        assert (found.event_index, found.field) == (3, "num_scheduled_tokens")
        assert found.left == (("a", 3), ("b", 3), ("c", 3))
        assert found.right == (("a", 2), ("b", 2), ("c", 2))


class TestComparison:
    def test_state_fields_are_compared_queues_first_then_per_request(self) -> None:
        ahead, behind = reference_engine(TIGHT), reference_engine(TIGHT)
        for engine in (ahead, behind):
            engine.add_request(THREE[0].to_request())
        waiting = behind.snapshot()
        output = ahead.schedule()
        assert first_difference(
            Snapshot("schedule", ahead.snapshot()), Snapshot("schedule", waiting), False
        ) == ("state after schedule", "running", ("a",), (), None)
        behind.schedule()
        scheduled = behind.snapshot()
        ahead.update_from_output(output, ModelRunnerOutput({"a": [7]}))
        assert first_difference(
            Snapshot("update_from_output", ahead.snapshot()), Snapshot("x", scheduled), False
        ) == ("state after update_from_output", "output_token_ids", (7,), (), "a")


class TestFailuresInOneEngine:
    def test_a_violation_beats_the_divergence_it_comes_with(self) -> None:
        # wrong_total also claims a total the reference does not: still a violation.
        result = diff_trace(PREEMPTING, reference_engine, wrong_total, "vllm-v1")
        assert result.divergence is None
        assert isinstance(result.violation, SideViolationError)
        assert result.violation.side == "right" and result.side == "right"
        assert {v.invariant for v in result.violation.violations} == {"BUDGET"}
        assert str(result.violation).startswith("(right engine) after event 3 (Step)")

    def test_an_engine_error_is_reported_with_its_side(self) -> None:
        result = diff_trace(PREEMPTING, crashing, reference_engine, "vllm-v1")
        assert isinstance(result.error, RuntimeError) and result.side == "left"
        assert "raised by the left engine" in getattr(result.error, "__notes__", [])
        assert result.entries[-1].index == 5  # the third step: the crashing engine's third call


def _is_one_minimal(trace: Trace, target: LockstepTarget) -> bool:
    wanted = failure_signature(trace, target)
    events = list(trace.events)
    for index in range(len(events)):
        smaller: list[Event] = events[:index] + events[index + 1 :]
        candidate = Trace(trace.config, tuple(smaller), trace.model)
        if wanted & failure_signature(candidate, target):
            return False
    return True


class TestMinimizing:
    def test_a_divergent_trace_loses_what_the_divergence_does_not_need(self) -> None:
        noisy = Trace(
            TIGHT,
            (
                AddRequest("x", (1, 1), 2),
                *THREE,
                Abort(("x",)),
                ProposeDrafts({}),
                Step(),
                Step(),
                Step(),
                Step(),
                Drain(),
            ),
        )
        target = LockstepTarget(reference_engine, victim, "safety")
        wanted = failure_signature(noisy, target)
        assert wanted == {"divergence: schedule() output num_scheduled_tokens"}
        small = minimize_on(noisy, target)
        assert len(small.events) < len(noisy.events)
        assert not any(isinstance(e, AddRequest) and e.request_id == "x" for e in small.events)
        assert wanted & failure_signature(small, target)
        assert _is_one_minimal(small, target)


class TestRunDiff:
    def test_the_reference_against_itself_passes(self) -> None:
        result = run_diff(
            reference_engine, reference_engine, "vllm-v1", SuiteSettings(examples=10, seed=5)
        )
        assert result.passed, result.divergence or result.error or result.other_error
        assert result.stats.steps > 0 and result.examples >= 10

    def test_finds_shrinks_and_minimizes_the_victim_divergence(self, tmp_path: Path) -> None:
        # A fixed tiny cache: preemption in nearly every workload, so the search
        # is short whatever Hypothesis draws.
        tiny = SchedulerConfig(
            block_size=2,
            num_blocks=3,
            max_num_batched_tokens=8,
            max_num_seqs=2,
            max_model_len=6,
            enable_prefix_caching=False,
            watermark=0.0,
        )
        settings = SuiteSettings(examples=50, rules_per_example=10, seed=1)
        result = run_diff(
            reference_engine, victim, "safety", settings, st.just(tiny), trace_dir=tmp_path
        )
        assert result.divergence is not None, result.error or result.other_error
        assert result.error is None and result.other_error is None and not result.passed
        found = result.divergence.divergence
        assert found.field == "num_scheduled_tokens"
        assert result.trace_path == tmp_path / "schedspec-diff-1.json"
        saved = Trace.load(result.trace_path)
        assert len(saved.events) <= 8
        assert saved.note == str(result.divergence)
        replayed = diff_trace(saved, reference_engine, victim, "safety").divergence
        assert replayed == found
        assert _is_one_minimal(saved, LockstepTarget(reference_engine, victim, "safety"))
