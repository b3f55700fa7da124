"""update_from_output reports each sampling request's kept tokens and finish status,
and STOP holds an engine to that report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import Abort, AddRequest, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.properties.checked_engine import CheckedEngine, replay
from schedspec.spec import ModelRunnerOutput, RequestOutput, RequestStatus, SchedulerConfig
from schedspec.spec.invariants import CHECKS, Profile, UpdateTransition
from schedspec.traces.trace import Trace
from tests.sched_helpers import add, make_config, make_scheduler

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings"


def test_reference_reports_kept_tokens_and_why_it_finished() -> None:
    scheduler = make_scheduler(num_speculative_tokens=3)
    add(scheduler, "a", 5, eos_token_id=2)
    add(scheduler, "b", 5, max_tokens=1)
    out = scheduler.schedule()
    reported = scheduler.update_from_output(out, ModelRunnerOutput({"a": [50], "b": [60]}))
    assert reported == {
        "a": RequestOutput("a", (50,), None, 5),
        "b": RequestOutput("b", (60,), RequestStatus.FINISHED_LENGTH_CAPPED, 5),
    }
    scheduler.update_draft_token_ids({"a": [51, 2, 53]})
    out = scheduler.schedule()
    reported = scheduler.update_from_output(out, ModelRunnerOutput({"a": [51, 2, 60]}))
    # 51 accepted, EOS (2) stops it, 60 dropped: 6 + 2 tokens, all but the last computed.
    assert reported == {"a": RequestOutput("a", (51, 2), RequestStatus.FINISHED_STOPPED, 7)}


def _eos_on_first_sample(
    request: AddRequest, config: SchedulerConfig, profile: Profile
) -> UpdateTransition:
    """The request's first step, in which it samples its EOS."""
    assert request.eos_token_id is not None
    checked = CheckedEngine.from_factory(reference_engine, config, profile)
    checked.apply(request)
    output = checked.engine.schedule()
    mid = checked.engine.snapshot()
    stops = StepDecisions(stops={request.request_id: request.eos_token_id})
    model_output = checked.model.execute(output, stops)
    reported = checked.engine.update_from_output(output, model_output)
    return UpdateTransition(mid, output, model_output, checked.engine.snapshot(), reported)


def _stop_transition() -> UpdateTransition:
    """'a' emits its EOS on its first sampled token."""
    return _eos_on_first_sample(
        AddRequest("a", (1, 2, 3), 4, eos_token_id=9), make_config(), "safety"
    )


def test_stop_checks_the_report() -> None:
    good = _stop_transition()
    assert CHECKS["STOP"](good) == []
    assert good.request_outputs == {
        "a": RequestOutput("a", (9,), RequestStatus.FINISHED_STOPPED, 3)
    }
    capped = RequestOutput("a", (9,), RequestStatus.FINISHED_LENGTH_CAPPED)
    (violation,) = CHECKS["STOP"](dataclasses.replace(good, request_outputs={"a": capped}))
    assert violation.message == "reported finish status"
    extra = RequestOutput("a", (9, 4), RequestStatus.FINISHED_STOPPED)
    (violation,) = CHECKS["STOP"](dataclasses.replace(good, request_outputs={"a": extra}))
    assert "up to the stop" in violation.message
    (violation,) = CHECKS["STOP"](dataclasses.replace(good, request_outputs={}))
    assert "no output reported" in violation.message
    # An engine that reports nothing is not held to a report.
    assert CHECKS["STOP"](dataclasses.replace(good, request_outputs=None)) == []


def test_rollback_checks_a_finished_requests_reported_computed_count() -> None:
    good = _stop_transition()
    assert CHECKS["ROLLBACK"](good) == []
    # A stop that forgets to pull back the dropped tokens' count is visible here only.
    stale = RequestOutput("a", (9,), RequestStatus.FINISHED_STOPPED, 4)
    (violation,) = CHECKS["ROLLBACK"](dataclasses.replace(good, request_outputs={"a": stale}))
    assert violation.message == "reported num_computed_tokens after the output"
    assert (violation.expected, violation.actual) == (3, 4)


# SGLang clips this request's max_new_tokens to 0: max_req_len 83 - 77 - 1 = 5 in the
# context, but the pool (21 pages of 4 = 84 slots) less the paged prompt (80), a page and
# one gives -1. One token is still sampled.
ZERO_BUDGET = make_config(
    family="sglang", block_size=4, num_blocks=21, max_model_len=84, max_num_batched_tokens=128
)


def _zero_budget_stop_transition() -> UpdateTransition:
    """'z' (77 tokens, EOS 5) samples its EOS at the end of its prefill, with a clipped
    max_new_tokens of 0."""
    return _eos_on_first_sample(
        AddRequest("z", tuple(range(10, 87)), 7, eos_token_id=5), ZERO_BUDGET, "sglang"
    )


def test_sglang_demotes_a_stop_past_a_clipped_max_new_tokens_of_0() -> None:
    """docs/SPEC.md STOP, "Nothing past the length cap (SGLang)": SGLang 0.5.23 matches the EOS at
    output 1, past its cap of 0, and finishes it FINISH_LENGTH(0), delivering nothing
    (found by the suite on SGLang: docs/findings/sglang-stop-demoted-to-length-at-zero-
    budget.json). The reference does the same, STOP expects it, and holds an engine that
    reports the stop, or delivers the token, to it."""
    good = _zero_budget_stop_transition()
    assert good.pre.requests["z"].max_tokens == 1  # the clip, at least one token
    assert good.request_outputs == {
        "z": RequestOutput("z", (), RequestStatus.FINISHED_LENGTH_CAPPED, 77)
    }
    assert "z" not in good.post.requests
    assert CHECKS["STOP"](good) == []
    assert CHECKS["ROLLBACK"](good) == []
    stopped = RequestOutput("z", (5,), RequestStatus.FINISHED_STOPPED)
    violations = CHECKS["STOP"](dataclasses.replace(good, request_outputs={"z": stopped}))
    assert {v.message for v in violations} == {
        "reported finish status",
        "reported tokens are not the sampled ones up to the stop",
    }
    delivered = RequestOutput("z", (5,), RequestStatus.FINISHED_LENGTH_CAPPED, 78)
    (violation,) = CHECKS["STOP"](dataclasses.replace(good, request_outputs={"z": delivered}))
    assert "up to the stop" in violation.message
    # The same stop under vLLM's rule (max_tokens 1 is the cap): a plain stop.
    as_vllm = dataclasses.replace(good.post.config, family="vllm")
    vllm = dataclasses.replace(good, post=dataclasses.replace(good.post, config=as_vllm))
    assert CHECKS["STOP"](dataclasses.replace(vllm, request_outputs={"z": stopped})) == []


def test_the_zero_budget_stop_trace_replays_on_the_reference() -> None:
    """The trace the suite found it with (SGLang 0.5.23, seed 20261201) passes the
    reference under the sglang profile; tests/test_sglang_adapter.py replays it on SGLang."""
    trace = Trace.load(FINDINGS / "sglang-stop-demoted-to-length-at-zero-budget.json")
    assert trace.config.family == "sglang"
    replay(trace, reference_engine, "sglang")


def test_an_abort_pending_at_a_clipped_max_new_tokens_of_0_delivers_the_token() -> None:
    """SGLang's overlap loop: r1 (one token, a clip of 0: the pool of 2 pages of 4 leaves
    8 - 4 - 4 - 1 < 0) is aborted while its step is in flight; when the step lands, the
    pending abort (to_finish) finishes it before any length check, with no finished_len,
    so its one token is delivered, reported aborted. STOP's cap does not apply to it
    (found by a reviewer's run of `check --profile sglang --seed 4`)."""
    config = make_config(
        family="sglang",
        block_size=4,
        num_blocks=2,
        max_num_batched_tokens=8,
        max_num_seqs=1,
        max_model_len=8,
        async_scheduling=True,
    )
    checked = CheckedEngine.from_factory(reference_engine, config, "sglang")
    checked.apply(AddRequest("r1", (0,), 1))
    checked.apply(Step())
    checked.apply(Abort(("r1",)))
    pending = checked.state.requests["r1"]
    assert pending.abort_pending and pending.max_tokens == 1
    checked.apply(Step())  # the step in flight lands: no violation
    assert "r1" not in checked.state.requests
