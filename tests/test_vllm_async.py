"""vLLM as a deployment runs it, under the adapter: sync and async scheduling resolved by
vLLM's own config, the V2 model runner's output layout translated to the spec's, padding
as vLLM pads, and vLLM's skip_drafts claim.

Needs vLLM (`scripts/install_vllm.sh VENV_DIR`), except the DraftingSkips and strategy
tests, which need none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.adapters.vllm.output import DraftingSkips, external_id
from schedspec.engines.events import AddRequest, Drain, Event, Step
from schedspec.engines.pipeline import BatchQueue
from schedspec.properties.checked_engine import CheckedEngine
from schedspec.properties.differential import DiffOptions, diff_trace
from schedspec.spec import (
    PLACEHOLDER_TOKEN_ID,
    CachedRequestData,
    ConfigError,
    NewRequestData,
    SchedulerConfig,
    SchedulerOutput,
)
from schedspec.traces.trace import Trace
from tests.sched_helpers import small_config as config

PH = PLACEHOLDER_TOKEN_ID
MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def vllm_engine() -> type[Any]:
    """VllmEngine, or a skip (a failure in CI) where vLLM is not installed."""
    from tests.vllm_required import require_vllm

    require_vllm("the async vLLM adapter tests")
    from schedspec.adapters.vllm.engine import VllmEngine

    return VllmEngine


class RawOutputs:
    """Records every SchedulerOutput vLLM's scheduler returns, beside the adapter's."""

    def __init__(self, engine: Any) -> None:
        self.raw: list[Any] = []
        # Each raw output's new entries' prefill_token_ids as they were: vLLM hands the
        # runner the request's own token list, which grows as outputs land.
        self.prefill: list[dict[str, list[int]]] = []
        self.ours: list[SchedulerOutput] = []
        raw_schedule: Callable[[], Any] = engine.scheduler.schedule
        adapter_schedule: Callable[[], SchedulerOutput] = engine.schedule

        def scheduler_schedule(*args: Any, **kwargs: Any) -> Any:
            out = raw_schedule(*args, **kwargs)
            self.raw.append(out)
            self.prefill.append(
                {
                    external_id(d.req_id): list(d.prefill_token_ids or ())
                    for d in out.scheduled_new_reqs
                }
            )
            return out

        def schedule() -> SchedulerOutput:
            ours = adapter_schedule()
            self.ours.append(ours)
            return ours

        engine.scheduler.schedule = scheduler_schedule
        engine.schedule = schedule


# ------------------------------------------------------------- mode resolution


@MODES
def test_vllms_own_config_resolves_the_mode_and_the_v2_runner(async_scheduling: bool) -> None:
    """A deployment's VllmConfig says sync or async itself, picks the scheduler class and
    the batch queue from it, and runs the V2 model runner."""
    engine_class = vllm_engine()
    cfg = config(async_scheduling=async_scheduling)
    engine = engine_class(cfg)
    vllm_config = engine.scheduler.vllm_config
    assert vllm_config.scheduler_config.async_scheduling is async_scheduling
    expected_class = "AsyncScheduler" if async_scheduling else "Scheduler"
    assert type(engine.scheduler).__name__ == expected_class
    assert (
        vllm_config.max_concurrent_batches == BatchQueue(cfg).size == (2 if async_scheduling else 1)
    )
    if has_v1_runner():
        assert vllm_config.use_v2_model_runner and engine.scheduler.use_v2_model_runner
    else:  # 0.34.0 on: V2 is the only runner, and the flags are gone
        assert not hasattr(engine.scheduler, "use_v2_model_runner")


def has_v1_runner() -> bool:
    """Whether the installed vLLM can still pick the V1 model runner (0.33.0; 0.34.0
    removed it, and VllmConfig.use_v2_model_runner with it)."""
    from vllm.config import VllmConfig

    return hasattr(VllmConfig, "use_v2_model_runner")


def test_a_scheduler_that_is_not_the_configs_mode_is_refused() -> None:
    from schedspec.adapters.vllm.config import _check_translation

    engine_class = vllm_engine()
    sync = engine_class(config())
    claimed = replace(sync.config, async_scheduling=True)
    with pytest.raises(RuntimeError, match="did not take the config") as caught:
        _check_translation(sync.scheduler, sync.scheduler.vllm_config, claimed, 16)
    message = str(caught.value)
    assert "'async_scheduling': (True, False)" in message
    assert "'scheduler_class': ('AsyncScheduler', 'Scheduler')" in message
    assert "'max_concurrent_batches': (2, 1)" in message


def test_the_v1_model_runner_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine_class = vllm_engine()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    if not has_v1_runner():
        # Nothing for the variable to pick (vLLM's front end refuses "0" at start-up):
        # the scheduler builds the V2 runner's layout, the only one.
        assert not hasattr(engine_class(config()).scheduler, "use_v2_model_runner")
        return
    with pytest.raises(RuntimeError, match="'use_v2_model_runner': \\(True, False\\)") as caught:
        engine_class(config())
    assert "set VLLM_USE_V2_MODEL_RUNNER=1" in str(caught.value)


# ------------------------------------------------------ the V2 output layout


def preempting_workload() -> list[Event]:
    """Four blocks of 4 tokens: two 7-token prompts fill them, and decode growth preempts
    the later one, which resumes once the first finishes."""
    return [
        AddRequest("A", (1,) * 7, max_tokens=6),
        AddRequest("B", (2,) * 7, max_tokens=6),
        Drain(),
    ]


@MODES
def test_a_resumed_request_is_translated_to_the_specs_resumed_entry(
    async_scheduling: bool,
) -> None:
    """vLLM (V2 layout) lists the resumed B among new requests with all its tokens; the
    adapter hands the spec a CachedRequestData with resumed=True, the whole table, the
    computed count before the step and B's outputs. OUTPUT holds on every step."""
    engine_class = vllm_engine()
    cfg = config(num_blocks=4, max_model_len=16, async_scheduling=async_scheduling)
    engine = engine_class(cfg)
    outputs = RawOutputs(engine)
    checked = CheckedEngine(engine, cfg, "vllm-v1")
    for event in preempting_workload():
        checked.apply(event)
    preempted_in = [i for i, o in enumerate(outputs.ours) if "B" in o.preempted_req_ids]
    resumed_in = [
        i
        for i, o in enumerate(outputs.ours)
        if any(c.request_id == "B" and c.resumed for c in o.scheduled_cached_reqs)
    ]
    assert preempted_in and resumed_in and preempted_in[0] < resumed_in[0]
    step = resumed_in[0]
    raw, ours = outputs.raw[step], outputs.ours[step]
    # vLLM knows B by the adapter's internal id, as it knows requests by its front
    # end's (vllm_output.internal_id).
    (raw_b,) = [d for d in raw.scheduled_new_reqs if external_id(d.req_id) == "B"]
    assert "B" not in map(external_id, raw.scheduled_cached_reqs.req_ids)
    assert "B" not in {d.request_id for d in ours.scheduled_new_reqs}
    (ours_b,) = [c for c in ours.scheduled_cached_reqs if c.request_id == "B"]
    prefill = outputs.prefill[step]["B"]
    num_outputs = len(prefill) - 7
    assert prefill[:7] == [2] * 7 and num_outputs > 0
    assert ours_b == CachedRequestData(
        "B",
        True,
        tuple(b - 1 for b in raw_b.block_ids[0]),
        raw_b.num_computed_tokens,
        num_outputs,
    )
    # Recomputation: everything B had, prompt and outputs, in this step.
    assert ours.num_scheduled_tokens["B"] == 7 + num_outputs


@MODES
def test_a_new_request_stays_new(async_scheduling: bool) -> None:
    engine_class = vllm_engine()
    engine = engine_class(config(async_scheduling=async_scheduling))
    engine.add_request(AddRequest("A", (1, 2, 3, 4, 5), max_tokens=2).to_request())
    output = engine.schedule()
    assert output.scheduled_new_reqs == (NewRequestData("A", (1, 2, 3, 4, 5), (0, 1), 0),)
    assert output.scheduled_cached_reqs == ()


# ------------------------------------------------------------------ padding


def test_drafts_without_padding_are_refused_naming_the_field() -> None:
    engine_class = vllm_engine()
    with pytest.raises(ConfigError, match="always pads") as caught:
        engine_class(config(num_speculative_tokens=2, num_lookahead_tokens=0))
    assert caught.value.field == "pad_spec_decode"
    # And padding without drafts is the spec's own refusal.
    with pytest.raises(ConfigError) as refused:
        config(pad_spec_decode=True)
    assert refused.value.field == "pad_spec_decode"


def padding_trace(cfg: SchedulerConfig) -> Trace:
    """A runs; B, a one-token prompt, is admitted beside it and padded to 1 + K."""
    return Trace(
        cfg,
        (
            AddRequest("A", (1, 2, 3, 4, 5), max_tokens=4),
            Step(),
            AddRequest("B", (7,), max_tokens=4),
            Step(),
            Step(),
            Drain(),
        ),
    )


@MODES
@pytest.mark.parametrize("lookahead", [0, 2], ids=["ngram", "eagle"])
def test_vllm_pads_as_the_reference_pads(async_scheduling: bool, lookahead: int) -> None:
    """The admission of B, padded to 1 + K tokens with K placeholder drafts, in both modes
    and with both drafters; the reference makes every decision alike, block ids included."""
    engine_class = vllm_engine()
    cfg = config(
        num_speculative_tokens=2,
        num_lookahead_tokens=lookahead,
        pad_spec_decode=True,
        async_scheduling=async_scheduling,
    )
    result = diff_trace(
        padding_trace(cfg), reference_engine, engine_class, "vllm-v1", DiffOptions(True)
    )
    assert result.passed, result.divergence or result.violation or result.error
    admitted = [
        o
        for entry in result.entries
        for o in entry.outputs[1]
        if any(d.request_id == "B" for d in o.scheduled_new_reqs)
    ]
    assert [
        (o.num_scheduled_tokens["B"], o.scheduled_spec_decode_tokens["B"]) for o in admitted
    ] == [(3, (PH, PH))]


# ---------------------------------------------------------------- skip_drafts


def output(
    scheduled: dict[str, int], drafts: dict[str, tuple[int, ...]], new: tuple[str, ...] = ()
) -> SchedulerOutput:
    return SchedulerOutput(
        tuple(NewRequestData(rid, (1,), (0,), 0) for rid in new),
        tuple(CachedRequestData(rid, False, (), 1, 0) for rid in scheduled if rid not in new),
        scheduled,
        sum(scheduled.values()),
        drafts,
        frozenset(),
        frozenset(),
    )


def test_drafts_after_a_skipped_drafting_step_are_refused() -> None:
    skips = DraftingSkips()
    skips.check(output({"a": 1}, {}), skip_drafts=True)
    with pytest.raises(RuntimeError, match="'a': scheduled with 2 drafts to verify"):
        skips.check(output({"a": 3}, {"a": (PH, PH)}), skip_drafts=False)


def test_drafts_after_a_drafting_step_or_of_an_admission_are_fine() -> None:
    skips = DraftingSkips()
    skips.check(output({"a": 1, "b": 1}, {}), skip_drafts=True)
    # b's padding drafts at its (re)admission were never proposed by a drafter.
    skips.check(output({"b": 3}, {"b": (PH, PH)}, new=("b",)), skip_drafts=False)
    skips.check(output({"b": 3}, {"b": (PH, PH)}), skip_drafts=False)
    skips.forget("a")  # finished: its id may come back
    skips.check(output({"a": 3}, {"a": (PH, PH)}), skip_drafts=False)


@MODES
def test_vllm_skips_drafting_only_with_eagle(async_scheduling: bool) -> None:
    """A one-token request with max_tokens 1 samples its last token in its first step:
    nothing can use drafts after it. Only a lookahead drafter (EAGLE) on the V2 runner
    may skip; the n-gram drafter always drafts."""
    engine_class = vllm_engine()
    skipped = {}
    for name, lookahead in (("ngram", 0), ("eagle", 2)):
        cfg = config(
            num_speculative_tokens=2,
            num_lookahead_tokens=lookahead,
            pad_spec_decode=True,
            async_scheduling=async_scheduling,
        )
        engine = engine_class(cfg)
        outputs = RawOutputs(engine)
        checked = CheckedEngine(engine, cfg, "vllm-v1")
        for event in (AddRequest("A", (1, 2, 3), max_tokens=1), Drain()):
            checked.apply(event)
        skipped[name] = outputs.raw[0].skip_drafts
    assert skipped == {"ngram": False, "eagle": True}


# ------------------------------------------------------------- the strategies


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_the_default_configs_stay_out_of_the_known_corners(data: st.DataObject) -> None:
    from schedspec.adapters.vllm.config import unsupported_reason
    from schedspec.properties.strategies.engine_configs import vllm_default_configs

    cfg = data.draw(vllm_default_configs())
    assert unsupported_reason(cfg) is None
    assert cfg.pad_spec_decode == (cfg.num_speculative_tokens > 0)
    assert not (cfg.policy == "priority" and cfg.enable_prefix_caching)  # F2
    assert not (
        cfg.pad_spec_decode and 0 < cfg.long_prefill_token_threshold <= cfg.num_speculative_tokens
    )  # F3
    assert not (cfg.enable_prefix_caching and cfg.lookahead_tokens)  # G1


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("drafter", ["none", "ngram", "eagle"])
def test_the_default_configs_reach_both_modes_and_every_drafter(
    async_scheduling: bool, drafter: str
) -> None:
    from schedspec.properties.strategies.engine_configs import vllm_default_configs

    def drafter_of(cfg: SchedulerConfig) -> str:
        if cfg.num_speculative_tokens == 0:
            return "none"
        return "eagle" if cfg.lookahead_tokens else "ngram"

    found = find(
        vllm_default_configs(),
        lambda c: c.async_scheduling is async_scheduling and drafter_of(c) == drafter,
    )
    assert found.pad_spec_decode == (drafter != "none")
