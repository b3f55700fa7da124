"""Trace minimization: a failing trace loses every event it does not need."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from schedspec.adapters.reference import ReferenceEngine, reference_engine
from schedspec.engines.events import Abort, AddRequest, ProposeDrafts, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.properties import minimize
from schedspec.properties.failure_report import format_log
from schedspec.properties.harness import SingleEngine
from schedspec.properties.minimize import (
    FEATURE_KNOBS,
    _simpler,
    failing_ids,
    minimize_on,
    minimize_trace,
    plainer_configs,
)
from schedspec.properties.replay_log import replay_with_log
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.spec import SchedulerConfig, SchedulerOutput
from schedspec.traces.trace import Trace
from tests.broken_engines import WrongTotalEngine, wrong_total
from tests.sched_helpers import make_config


def test_redundant_events_are_dropped_and_steps_simplified() -> None:
    # wrong_total miscounts once two requests share a step: two adds and a
    # step are needed, nothing else.
    noisy = Trace(
        make_config(num_speculative_tokens=2),
        (
            AddRequest("x", (1, 2, 3), 2),
            Abort(("x",)),
            AddRequest("a", (1,), 3),
            ProposeDrafts({"a": 1}),
            AddRequest("b", (2,), 3),
            AddRequest("c", (3,), 3),
            Step(StepDecisions(accepted={"a": 1})),
            Step(),
        ),
    )
    assert failing_ids(noisy, wrong_total, "safety") == {"BUDGET"}
    small = minimize_trace(noisy, wrong_total, "safety")
    assert len(small.events) == 3
    assert [type(e).__name__ for e in small.events] == ["AddRequest", "AddRequest", "Step"]
    assert small.events[-1] == Step()
    assert failing_ids(small, wrong_total, "safety") == {"BUDGET"}


def test_a_passing_trace_is_left_alone() -> None:
    trace = Trace(make_config(), (AddRequest("a", (1,), 1), Step()))
    assert minimize_trace(trace, reference_engine, "safety") == trace


def _two_batched(config: SchedulerConfig) -> Trace:
    """Two requests that share a step (wrong_total's trigger), with a noise event."""
    return Trace(
        config,
        (
            AddRequest("x", (9,), 1),
            AddRequest("a", (1, 2), 3),
            AddRequest("b", (2, 3), 3),
            Step(),
        ),
    )


def test_feature_knobs_the_failure_does_not_need_go_back_to_their_defaults() -> None:
    # wrong_total miscounts under any policy, cache, watermark or drafting: a regime
    # turned them on (config_regimes), and the counterexample should not show them.
    busy = make_config(
        policy="priority",
        enable_prefix_caching=True,
        watermark=0.1,
        num_speculative_tokens=2,
        num_lookahead_tokens=0,
        pad_spec_decode=True,
        long_prefill_token_threshold=8,
    )
    assert failing_ids(_two_batched(busy), wrong_total, "safety") == {"BUDGET"}
    small = minimize_trace(_two_batched(busy), wrong_total, "safety")
    assert small.config == make_config()  # every knob at its default, the sizes kept
    assert len(small.events) == 3
    assert failing_ids(small, wrong_total, "safety") == {"BUDGET"}


class _CacheOnlyBug(WrongTotalEngine):
    """wrong_total's miscount, with prefix caching on only."""

    def schedule(self) -> SchedulerOutput:
        if self.config.enable_prefix_caching:
            return super().schedule()
        return ReferenceEngine.schedule(self)


def test_a_knob_the_failure_needs_is_kept() -> None:
    config = make_config(enable_prefix_caching=True, watermark=0.1)
    small = minimize_trace(_two_batched(config), _CacheOnlyBug, "safety")
    assert small.config == make_config(enable_prefix_caching=True)
    assert failing_ids(small, _CacheOnlyBug, "safety") == {"BUDGET"}


def test_plainer_configs_set_one_knob_back_each_and_stay_valid() -> None:
    config = make_config(policy="priority", num_speculative_tokens=2, pad_spec_decode=True)
    plainer = plainer_configs(config)
    assert plainer == [
        make_config(num_speculative_tokens=2, pad_spec_decode=True),  # policy
        make_config(policy="priority"),  # drafts off, and padding with them
        make_config(policy="priority", num_speculative_tokens=2),  # padding
    ]
    assert plainer_configs(make_config()) == []  # nothing to set back
    # A resolved lookahead equal to the default's is no candidate.
    assert plainer_configs(make_config(num_speculative_tokens=2)) == [make_config()]
    assert "family" not in FEATURE_KNOBS and "block_size" not in FEATURE_KNOBS


def test_a_config_strategy_of_its_own_keeps_its_knobs() -> None:
    # The user's (or the engine's) configs may leave out what the defaults lead to: the
    # suite sets knobs back only under its own strategies.
    busy = make_config(policy="priority", watermark=0.1)
    kept = minimize_on(_two_batched(busy), SingleEngine(wrong_total, "safety"), plain_knobs=False)
    assert kept.config == busy and len(kept.events) == 3
    settings = SuiteSettings(examples=20, rules_per_example=10, seed=1)
    result = run_suite(wrong_total, "safety", settings, config_strategy=st.just(busy))
    assert result.trace is not None and result.trace.config == busy


def _nine_steps_and_long_prompts() -> Trace:
    """wrong_total fails once two requests share a step. Before the second arrives, the
    first runs alone for nine identical steps; both prompts are 63 tokens long."""
    config = make_config(max_model_len=128, max_num_batched_tokens=256, num_blocks=64)
    return Trace(
        config,
        (
            AddRequest("a", tuple(range(63)), 40),
            *(Step() for _ in range(9)),
            AddRequest("b", tuple(range(100, 163)), 40),
            Step(),
        ),
    )


def _minimized_counting_replays(trace: Trace) -> tuple[Trace, int]:
    built: list[SchedulerConfig] = []

    def counted(config: SchedulerConfig) -> WrongTotalEngine:
        built.append(config)
        return wrong_total(config)

    return minimize_trace(trace, counted, "vllm-v1"), len(built)


def test_identical_steps_merge_and_prompts_shorten_and_it_still_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    noisy = _nine_steps_and_long_prompts()
    assert failing_ids(noisy, wrong_total, "vllm-v1") == {"BUDGET"}
    small, replays = _minimized_counting_replays(noisy)
    steps = [e for e in small.events if isinstance(e, Step)]
    adds = [e for e in small.events if isinstance(e, AddRequest)]
    assert len(steps) < 9 and len(small.events) < len(noisy.events)
    assert [len(a.prompt_token_ids) for a in adds] == [1, 1]
    # Verified by replay: the same invariant still breaks.
    assert failing_ids(small, wrong_total, "vllm-v1") == {"BUDGET"}
    # The nine steps went as a run, not one replay each: dropping them one by one (the
    # run pass off) reaches the same trace in more replays.
    monkeypatch.setattr(minimize, "_shorter_runs", lambda events, last: [])
    one_by_one, more_replays = _minimized_counting_replays(noisy)
    assert one_by_one == small and replays < more_replays


def test_a_run_of_identical_steps_is_cut_to_one_then_to_half() -> None:
    events = list(_nine_steps_and_long_prompts().events)
    last_of_run = 9
    first, second, *_ = _simpler(events, last_of_run)
    assert first == [events[0], Step(), *events[10:]]
    assert second == [events[0], *(Step() for _ in range(5)), *events[10:]]
    # A prompt is cut to its first token, then to half.
    cut_one, cut_half = _simpler(events, 0)[1:]
    assert cut_one[0] == AddRequest("a", (0,), 40)
    assert cut_half[0] == AddRequest("a", tuple(range(31)), 40)


def test_the_replayed_counterexample_prints_a_run_of_alike_steps_once() -> None:
    """Steps that cannot be dropped (the first request must run alone) but that are the
    same event with the same decision print as one line with their index range."""
    trace = _nine_steps_and_long_prompts()
    config = trace.config
    log = replay_with_log(trace, wrong_total(config), "vllm-v1")
    lines = format_log(log)
    assert lines[0].startswith("  #0 add_request 'a' prompt=[0, 1, 2,")
    # The first step prefills all 63 tokens; the next eight each decode one.
    assert lines[1:5] == [
        "  #1 step",
        "      scheduled: a=63 (total 63) | preempted: - | finished: -",
        "  #2-#9 step (8 alike)",
        "      scheduled: a=1 (total 1) | preempted: - | finished: -",
    ]
    assert lines[5].startswith("  #10 add_request 'b'")
    assert lines[-1].startswith("      ^ [BUDGET]")
