"""vLLM V1's Scheduler under schedspec, through schedspec.adapters.vllm.engine.

Needs vLLM: `scripts/install_vllm.sh VENV_DIR`. Skipped, with that reason,
where vLLM is not installed, except in CI (CI set), where a missing vLLM fails.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.adapters.vllm import engine as adapter
from schedspec.adapters.vllm import runtime
from schedspec.adapters.vllm.config import (
    avoid_known_corners,
    expressible,
    unsupported_reason,
    vllm_watermark,
)
from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.adapters.vllm.releases import SUPPORTED, current_release
from schedspec.adapters.vllm.runtime import VllmMissingError
from schedspec.engines.events import Step
from schedspec.engines.fake_model import FakeModel
from schedspec.engines.pipeline import run_step
from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError, replay
from schedspec.properties.differential import DiffOptions, diff_trace
from schedspec.properties.strategies.engine_configs import vllm_default_configs
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.reference import Scheduler as ReferenceScheduler
from schedspec.spec import (
    PLACEHOLDER_TOKEN_ID,
    ConfigError,
    ModelRunnerOutput,
    RemoteKV,
    Request,
    RequestError,
    RequestOutput,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
    extend_block_hashes,
)
from schedspec.spec.config import smallest_pool
from schedspec.spec.invariants import CHECKS, ids_for
from schedspec.traces.trace import Trace

INSTALL = "schedspec install vllm"
if os.environ.get("CI") and importlib.util.find_spec("vllm") is None:
    pytest.fail(
        f"CI runs the vLLM adapter tests, but vLLM is not installed: run {INSTALL}",
        pytrace=False,
    )
pytest.importorskip("vllm", reason=f"vLLM is not installed: run {INSTALL} to run these tests")

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings"
# Whether each finding of docs/FINDINGS.md still stands, per supported release: its
# replay below expects what the installed release does. A release that fixes one flips
# its entry, and the replay then expects vLLM to hold where it broke.
STANDS: dict[str, dict[str, bool]] = {
    "F1": {"0.33.0": True, "0.34.0": True},  # padding with placeholder drafts
    "F2": {"0.33.0": True, "0.34.0": True},  # a priority victim keeps its registrations
    "F3": {"0.33.0": True, "0.34.0": True},  # the long-prefill cap cuts padding: assert
    "G1": {"0.33.0": True, "0.34.0": True},  # EAGLE's lookahead hashes (the reference's gap)
    "F5": {"0.33.0": True, "0.34.0": True},  # a failed load's retry is charged its own reservation
    "F6": {"0.33.0": True, "0.34.0": True},  # no async load beside a verify step, tight pool
}


def stands(finding: str) -> bool:
    """Whether `finding` stands on the installed release."""
    return STANDS[finding][current_release().version]


def test_every_finding_says_how_it_stands_on_every_supported_release() -> None:
    releases = {release.version for release in SUPPORTED}
    assert all(set(per_release) == releases for per_release in STANDS.values())


DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "num_blocks": 64,
    "max_num_batched_tokens": 512,
    "max_num_seqs": 8,
    "max_model_len": 1024,
}


def config(**overrides: Any) -> SchedulerConfig:
    return SchedulerConfig(**{**DEFAULTS, **overrides})


def add(
    engine: VllmEngine, rid: str, prompt: Sequence[int], max_tokens: int = 8, priority: int = 0
) -> None:
    engine.add_request(Request(rid, prompt, max_tokens, priority=priority))


def finish_step(engine: VllmEngine, output: SchedulerOutput, token: int = 9) -> None:
    """The model's answer: one token for each request whose step reached its known tokens."""
    state = engine.snapshot()
    sampled = {
        rid: [token]
        for rid in output.num_scheduled_tokens
        if state.requests[rid].num_computed_tokens >= state.requests[rid].num_tokens
    }
    engine.update_from_output(output, ModelRunnerOutput(sampled_token_ids=sampled))


def state_violations(state: State) -> list[str]:
    return [str(v) for i in ids_for("state", "safety") for v in CHECKS[i](state)]


# ------------------------------------------------------------ worked scenarios


def test_seed_example_budget_512() -> None:
    """A 400, B 1, C 1, D 110 fill the 512-token budget exactly, as in the reference."""
    cfg = config()
    engine = VllmEngine(cfg)
    reference = ReferenceScheduler(cfg)
    prompts = {"A": [1] * 400, "B": [2], "C": [3], "D": [4] * 110}
    for rid, prompt in prompts.items():
        add(engine, rid, prompt, max_tokens=4)
        reference.add_request(Request(rid, prompt, 4))
    output = engine.schedule()
    assert dict(output.num_scheduled_tokens) == {"A": 400, "B": 1, "C": 1, "D": 110}
    assert output.total_num_scheduled_tokens == 512
    assert dict(output.num_scheduled_tokens) == dict(reference.schedule().num_scheduled_tokens)
    tables = {d.request_id: d.block_ids for d in output.scheduled_new_reqs}
    # vLLM's block 0 is its null block: its block b is ours b - 1.
    assert tables == {
        "A": tuple(range(25)),
        "B": (25,),
        "C": (26,),
        "D": tuple(range(27, 34)),
    }
    assert all(d.num_computed_tokens == 0 for d in output.scheduled_new_reqs)
    finish_step(engine, output)
    second = engine.schedule()
    assert dict(second.num_scheduled_tokens) == {"A": 1, "B": 1, "C": 1, "D": 1}
    grown = {c.request_id: c.new_block_ids for c in second.scheduled_cached_reqs}
    assert grown == {"A": (34,), "B": (), "C": (), "D": ()}  # A's 401st token opens a block
    assert not any(c.resumed for c in second.scheduled_cached_reqs)


def small_cache(policy: str = "fcfs") -> SchedulerConfig:
    """Four blocks of 4 tokens: two 7-token prompts fill it; decode growth preempts."""
    return config(
        block_size=4,
        num_blocks=4,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=16,
        policy=policy,
    )


def test_fcfs_preemption_takes_the_last_admitted_and_resumes_it() -> None:
    engine = VllmEngine(small_cache())
    add(engine, "A", [1] * 7, max_tokens=6)
    add(engine, "B", [2] * 7, max_tokens=6)
    outputs = []
    for _ in range(3):
        outputs.append(engine.schedule())
        finish_step(engine, outputs[-1])
    assert dict(outputs[2].num_scheduled_tokens) == {"A": 1}
    assert outputs[2].preempted_req_ids == {"B"}
    state = engine.snapshot()
    b = state.requests["B"]
    assert (b.status, b.num_computed_tokens, b.block_ids, b.num_preemptions) == (
        RequestStatus.PREEMPTED,
        0,
        (),
        1,
    )
    assert (state.waiting, state.running) == (("B",), ("A",))
    assert state_violations(state) == []
    # Once A finishes, B comes back as a resumed request with a whole new table.
    for _ in range(20):
        num_tokens = engine.snapshot().requests["B"].num_tokens
        output = engine.schedule()
        resumed = [c for c in output.scheduled_cached_reqs if c.resumed]
        if resumed:
            assert [c.request_id for c in resumed] == ["B"]
            assert resumed[0].new_block_ids == engine.snapshot().requests["B"].block_ids
            # Recomputation: the prompt and the outputs B had, all at once.
            assert output.num_scheduled_tokens["B"] == num_tokens == 9
            return
        finish_step(engine, output)
    pytest.fail("B never resumed")


def test_priority_preemption_takes_the_least_urgent() -> None:
    engine = VllmEngine(small_cache("priority"))
    add(engine, "A", [1] * 7, max_tokens=6, priority=1)
    add(engine, "B", [2] * 7, max_tokens=6, priority=0)
    first = engine.schedule()
    assert list(first.num_scheduled_tokens) == ["B", "A"]  # the more urgent first
    finish_step(engine, first)
    finish_step(engine, engine.schedule())
    third = engine.schedule()
    assert third.preempted_req_ids == {"A"}
    assert dict(third.num_scheduled_tokens) == {"B": 1}
    assert engine.snapshot().waiting == ("A",)


def test_abort_frees_and_reports_once() -> None:
    engine = VllmEngine(small_cache())
    add(engine, "A", [1] * 7)
    add(engine, "B", [2] * 3)
    finish_step(engine, engine.schedule())
    engine.finish_requests(["A", "no-such-request", "A"])
    state = engine.snapshot()
    assert set(state.requests) == {"B"}
    assert len(state.kv.free_block_ids) == 3
    output = engine.schedule()
    assert output.finished_req_ids == {"A"}
    finish_step(engine, output)
    assert engine.schedule().finished_req_ids == frozenset()


def test_update_reports_kept_tokens_and_why_a_request_finished() -> None:
    """vLLM's EngineCoreOutputs as the spec's RequestOutputs: EOS is STOPPED, max_tokens
    LENGTH_CAPPED; a prefill chunk reports nothing."""
    engine = VllmEngine(config(max_num_batched_tokens=4, max_num_seqs=2))
    engine.add_request(Request("A", [1, 2, 3], 2, eos_token_id=5))
    engine.add_request(Request("B", [4] * 5, 1))
    first = engine.schedule()  # A whole, B's first token: a chunk
    assert dict(first.num_scheduled_tokens) == {"A": 3, "B": 1}
    reported = engine.update_from_output(first, ModelRunnerOutput({"A": [9]}))
    assert reported == {"A": RequestOutput("A", (9,), None)}
    second = engine.schedule()
    assert dict(second.num_scheduled_tokens) == {"A": 1, "B": 3}
    reported = engine.update_from_output(second, ModelRunnerOutput({"A": [5], "B": [8]}))
    assert reported == {
        "A": RequestOutput("A", (5,), RequestStatus.FINISHED_STOPPED),
        "B": RequestOutput("B", (8,), RequestStatus.FINISHED_LENGTH_CAPPED),
    }


# ------------------------------------------------------- the refinement mapping


def test_snapshot_sanity_on_a_busy_run() -> None:
    """Every state invariant holds after every call of a busy run with preemption,
    prefix caching and drafts; vLLM's null block never shows."""
    cfg = config(
        block_size=4,
        num_blocks=10,
        max_num_batched_tokens=24,
        max_model_len=40,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        num_lookahead_tokens=0,
        pad_spec_decode=True,
        long_prefill_token_threshold=8,
    )
    engine = VllmEngine(cfg)
    model = FakeModel(seed=3, vocab_size=8, num_speculative_tokens=2)
    shared = [1, 2, 3, 4, 5, 6, 7, 0]
    preempted = 0
    for step in range(80):
        if step % 2 == 0 and step < 30:
            add(engine, f"r{step}", shared + [step % 5] * (step % 11 + 1), max_tokens=20)
        output, _ = run_step(engine, model)
        preempted += len(output.preempted_req_ids)
        state = engine.snapshot()
        assert state_violations(state) == [], step
        assert state.kv.num_blocks == cfg.num_blocks
        assert all(0 <= b < cfg.num_blocks for b in state.kv.free_block_ids)
    assert preempted > 0
    assert len(engine.snapshot().kv.prefix_cache) > 0


def test_cached_blocks_carry_the_specs_hashes() -> None:
    """A hit on another request's blocks: the blocks' translated hashes are the
    spec's chained hashes of the hitting request's own tokens."""
    cfg = config(block_size=4, num_blocks=16, max_model_len=64, enable_prefix_caching=True)
    engine = VllmEngine(cfg)
    prefix = list(range(1, 13))  # three full blocks
    add(engine, "A", [*prefix, 50, 51])
    finish_step(engine, engine.schedule())
    add(engine, "B", [*prefix, 60])
    output = engine.schedule()
    (new,) = output.scheduled_new_reqs
    assert new.num_computed_tokens == 12
    state = engine.snapshot()
    own = extend_block_hashes([], [*prefix, 60], cfg.block_size)
    assert [state.kv.block_hashes[b] for b in new.block_ids[:3]] == own
    assert new.block_ids[:3] == state.requests["A"].block_ids[:3]
    cached = dict(state.kv.prefix_cache)
    assert all(cached[h] == (b,) for h, b in zip(own, new.block_ids, strict=False))


def test_watermark_block_counts_match() -> None:
    """vLLM counts the watermark over num_blocks + 1 blocks (its null block too)."""
    for num_blocks in range(2, 300):
        for watermark in (0.0, 0.01, 0.04, 0.1, 0.25, 0.3, 0.5, 0.99):
            cfg = config(block_size=1, num_blocks=num_blocks, max_model_len=2, max_num_seqs=1)
            cfg = replace(cfg, watermark=watermark)
            assert int(vllm_watermark(cfg) * (num_blocks + 1)) == cfg.watermark_blocks
    engine = VllmEngine(config(watermark=0.3))
    assert engine.scheduler.kv_cache_manager.watermark_blocks == 19 == int(0.3 * 64)


# ----------------------------------------------------------- door and refusals


def test_door_refuses_what_vllm_refuses_above_the_scheduler() -> None:
    engine = VllmEngine(config(max_model_len=32))
    add(engine, "A", [1] * 31)  # max_model_len - 1: accepted
    before = engine.snapshot()
    with pytest.raises(RequestError, match="max_model_len"):
        add(engine, "B", [1] * 32)
    with pytest.raises(RequestError, match="duplicate"):
        add(engine, "A", [2])
    with pytest.raises(RequestError, match="empty"):
        add(engine, "C", [])
    assert engine.snapshot() == before


def test_lookahead_vllm_cannot_express_is_refused() -> None:
    odd = config(num_speculative_tokens=3, num_lookahead_tokens=1)
    with pytest.raises(ConfigError, match="num_lookahead_tokens"):
        VllmEngine(odd)
    assert expressible(odd).lookahead_tokens == 0
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        VllmEngine(config(max_num_batched_tokens=8, num_speculative_tokens=8))


def test_drafters_lookahead() -> None:
    """Lookahead 0 is the n-gram drafter, lookahead K an EAGLE one."""
    ngram = VllmEngine(
        config(num_speculative_tokens=2, num_lookahead_tokens=0, pad_spec_decode=True)
    )
    eagle = VllmEngine(config(num_speculative_tokens=2, pad_spec_decode=True))
    assert ngram.scheduler.num_lookahead_tokens == 0
    assert eagle.scheduler.num_lookahead_tokens == 2
    add(eagle, "A", [1] * 15)
    (new,) = eagle.schedule().scheduled_new_reqs
    assert len(new.block_ids) == 2  # 15 tokens + 2 lookahead slots


def test_missing_vllm_names_the_install_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime.VLLM, "loaded", None)
    monkeypatch.setitem(sys.modules, "vllm.config", None)  # import of it fails
    with pytest.raises(VllmMissingError, match=r"schedspec install vllm"):
        VllmEngine(config())


# ------------------------------------------------------------ suite and findings


@pytest.mark.parametrize("drafts", [False, True], ids=["no-drafts", "drafts"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_suite_passes_on_the_default_configs(async_scheduling: bool, drafts: bool) -> None:
    """vllm-v1 holds in each mode, with and without drafts (F1's padding included)."""
    result = run_suite(
        VllmEngine,
        "vllm-v1",
        SuiteSettings(examples=20, seed=20261129),
        vllm_default_configs(async_scheduling=async_scheduling, drafts=drafts),
    )
    assert result.passed, result.error or result.other_error
    assert result.stats.steps > 150


def test_f1_padding_is_legal_under_pad_spec_decode_and_refused_without() -> None:
    """FINDING F1, accepted: vLLM admits r1 (one token) beside r0 as 1 + K = 3 tokens with
    two placeholder drafts. Under pad_spec_decode (the trace's config) that holds every
    invariant and is the reference's decision too, block ids included; judged under a
    config without padding, DRAFTS refuses the step, as when F1 was found."""
    trace = Trace.load(FINDINGS / "vllm-spec-decode-padding.json")
    assert trace.config.pad_spec_decode
    result = diff_trace(trace, reference_engine, VllmEngine, "vllm-v1", DiffOptions(True))
    if not stands("F1"):  # the reference pads under pad_spec_decode; vLLM would not
        assert not result.passed
        return
    assert result.passed, result.divergence or result.violation or result.error
    padded = result.entries[3].outputs[1][0]
    assert padded.num_scheduled_tokens["r1"] == 3
    assert padded.scheduled_spec_decode_tokens["r1"] == (PLACEHOLDER_TOKEN_ID,) * 2

    class JudgedWithoutPadding(VllmEngine):
        """vLLM as it runs (it pads), seen through a config that says it does not."""

        def __init__(self, config: SchedulerConfig) -> None:
            super().__init__(replace(config, pad_spec_decode=True))
            self.config = config  # what snapshot() reports, and so what the checks judge by

    unpadded = replace(trace, config=replace(trace.config, pad_spec_decode=False))
    with pytest.raises(InvariantViolationError) as caught:
        replay(unpadded, JudgedWithoutPadding, "safety")
    assert caught.value.event_index == 3
    assert {v.invariant for v in caught.value.violations} == {"DRAFTS"}
    replay(unpadded, reference_engine, "safety")  # the reference does not pad there


def test_f2_priority_victim_keeps_its_registration() -> None:
    """FINDING F2: the trace still breaks CACHE-CONTENT on vLLM, not on the reference,
    and its config is a corner the default configs leave out."""
    trace = Trace.load(FINDINGS / "vllm-priority-victim-keeps-cache-registration.json")
    replay(trace, reference_engine, "safety")
    if not stands("F2"):
        replay(trace, VllmEngine, "safety")
        return
    with pytest.raises(InvariantViolationError) as caught:
        replay(trace, VllmEngine, "safety")
    assert {v.invariant for v in caught.value.violations} == {"CACHE-CONTENT"}
    moved = avoid_known_corners(trace.config)
    assert (moved.policy, moved.enable_prefix_caching) == ("priority", False)


def test_f3_padding_cut_by_the_long_prefill_cap_crashes_vllm() -> None:
    """FINDING F3: vLLM's own assertion fails inside schedule(); the reference does not
    pad there. The default configs raise such a cap to 1 + K."""
    trace = Trace.load(FINDINGS / "vllm-padding-cut-by-long-prefill-cap-crashes.json")
    replay(trace, reference_engine, "safety")
    if not stands("F3"):
        replay(trace, VllmEngine, "safety")
        return
    with pytest.raises(AssertionError) as caught:
        replay(trace, VllmEngine, "safety")
    assert not isinstance(caught.value, InvariantViolationError)
    assert str(caught.traceback[-1].path).endswith("vllm/v1/core/sched/scheduler.py")
    assert avoid_known_corners(trace.config).long_prefill_token_threshold == 3


def test_f5_a_failed_loads_retry_waits_for_ever_on_vllm() -> None:
    """FINDING F5: r1's async load (its whole 2-token prompt) fails under "recompute"
    with nothing valid. The reference frees its blocks and starts the retry's load in
    the same step. vLLM (0.33.0 through `_inflight_prefills`, 0.34.0 through
    `_reserve_parked`) still counts r1's own reservation, 2 blocks, against the retry's
    2 in a pool of 3, and never starts it: nothing runs and the pool stays free.
    The default configs run the "fail" policy instead."""
    trace = Trace.load(FINDINGS / "vllm-failed-load-retry-reserves-itself.json")
    replay(trace, reference_engine, "vllm-v1")
    assert trace.config.kv_load_failure_policy == "recompute"
    assert avoid_known_corners(trace.config).kv_load_failure_policy == "fail"
    if not stands("F5"):
        replay(trace, VllmEngine, "safety")
        return
    checked = CheckedEngine.from_factory(VllmEngine, trace.config, "safety", trace.model)
    checked.apply(trace.events[0])
    checked.apply(trace.events[1])
    for _ in range(20):  # and it stays so, step after step
        with pytest.raises(InvariantViolationError) as caught:
            checked.apply(Step())
        assert {v.invariant for v in caught.value.violations} == {"PROGRESS"}
        assert checked.state.waiting == ("r1",) and not checked.state.running
        assert checked.state.requests["r1"].status is RequestStatus.WAITING
        assert len(checked.state.kv.free_block_ids) == trace.config.num_blocks


def test_f6_no_async_load_beside_a_verify_step_in_a_tight_pool() -> None:
    """FINDING F6, probed (the spec refuses this pool, vLLM accepts it): with drafts
    (K = 1) and a pool of one max_model_len request (4 blocks of 4), a 15-token prompt
    held remotely, async, needs all 4 blocks, and vLLM reserves one verify step's block
    against the load beside them. The load never starts; nothing else is there to wait
    for."""
    cfg = config(
        block_size=4,
        num_blocks=5,
        max_model_len=16,
        max_num_batched_tokens=16,
        num_speculative_tokens=1,
        num_lookahead_tokens=0,
        pad_spec_decode=True,
        kv_connector=True,
    )
    assert smallest_pool(cfg) == 5  # the spec's floor: the load's 4 blocks, the step's 1
    with pytest.raises(ConfigError, match="num_blocks"):
        replace(cfg, num_blocks=4)
    model = FakeModel(seed=0, vocab_size=64, num_speculative_tokens=1)
    roomy = VllmEngine(cfg)  # the spec's floor: the load parks at once
    roomy.add_request(Request("r1", [1] * 15, 1, remote_kv=RemoteKV(num_tokens=15)))
    run_step(roomy, model)
    assert roomy.snapshot().requests["r1"].status is RequestStatus.WAITING_FOR_REMOTE_KVS
    engine = VllmEngine(cfg, num_blocks=4)
    engine.add_request(Request("r1", [1] * 15, 1, remote_kv=RemoteKV(num_tokens=15)))
    for _ in range(10):
        output, _ = run_step(engine, model)
        if not stands("F6"):
            return
        assert not output.num_scheduled_tokens
        state = engine.snapshot()
        assert state.requests["r1"].status is RequestStatus.WAITING
        assert not state.requests["r1"].block_ids and len(state.kv.free_block_ids) == 4


def test_f4_cache_aware_admission_keeps_cold_waiting_as_the_reference_does() -> None:
    """FINDING F4 (vLLM 0.34.0's cache-aware admission, found on the reference): vLLM makes
    the reference's decisions step for step, block ids included: each warm arrival takes
    the seat ahead of `cold`, which runs only in the drain. 0.33.0 has no such window: it
    admits in arrival order, so it parts from the reference at the first reorder, and
    holds every safety invariant doing so."""
    trace = Trace.load(FINDINGS / "vllm-cache-aware-admission-starves-a-request.json")
    if not current_release().cache_aware_admission:
        assert VllmEngine(trace.config).profiles == {"safety"}
        under_safety = diff_trace(trace, reference_engine, VllmEngine, "safety", DiffOptions(True))
        assert under_safety.divergence is not None
        assert under_safety.violation is None and under_safety.error is None
        return
    result = diff_trace(trace, reference_engine, VllmEngine, "vllm-v1", DiffOptions(True))
    assert result.passed, result.divergence or result.violation or result.error
    admitted = [
        d.request_id
        for entry in result.entries
        for output in entry.outputs[1]
        for d in output.scheduled_new_reqs
    ]
    assert admitted[-1] == "cold"
    assert admitted[:-1] == ["hog", *(f"warm{i}" for i in range(8))]


def eagle_hash_trace() -> Trace:
    """GAP G1 (docs/FINDINGS.md): r0 and r1 share the prefix [1, 2, 3, 4]. With an EAGLE
    drafter vLLM hashes block i with token i + 1, and r0's token 4 is followed by 0 where
    r1's is followed by 5, so vLLM finds a hit of 3 tokens where the reference finds 4,
    and r1 needs one block more than is free."""
    return Trace.load(FINDINGS / "gap-eagle-lookahead-hashes.json")


def test_g1_eagle_hashes_part_vllm_from_the_reference_and_are_left_out() -> None:
    """vLLM holds every safety invariant there; it is the reference (and so vllm-v1's
    ADMISSION-STOP) that does not model EAGLE's lookahead hashes yet."""
    trace = eagle_hash_trace()
    replay(trace, VllmEngine, "safety")
    result = diff_trace(trace, reference_engine, VllmEngine, "vllm-v1")
    if not stands("G1"):
        assert result.passed, result.divergence or result.violation or result.error
        return
    assert result.violation is not None
    # EAGLE's shifted hashes also leave vLLM's registrations unlike the spec's own
    # content hashes, which CACHE-COMPLETE sees: the same gap.
    found = [v.invariant for v in result.violation.violations]
    assert found in (["ADMISSION-STOP"], ["ADMISSION-STOP", "CACHE-COMPLETE"])
    assert avoid_known_corners(trace.config).lookahead_tokens == 0


@pytest.mark.xfail(
    stands("G1"),
    strict=True,
    reason="GAP G1 (docs/FINDINGS.md): the reference does not model vLLM's EAGLE lookahead "
    "hashes; when it does, drop G1 from avoid_known_corners",
)
def test_the_reference_makes_vllms_decisions_under_eagle_with_prefix_caching() -> None:
    result = diff_trace(eagle_hash_trace(), reference_engine, VllmEngine, "vllm-v1")
    assert result.passed


@pytest.mark.parametrize(
    "name",
    [
        "probe-door-whole-cache.json",
        "probe-head-of-line-blocking.json",
        "probe-priority-preempted-place.json",
    ],
)
def test_probes_hold_every_safety_invariant(name: str) -> None:
    replay(Trace.load(FINDINGS / name), VllmEngine, "safety")


# ------------------------------------------------------------ by name, from the CLI


@pytest.fixture
def built_configs(monkeypatch: pytest.MonkeyPatch) -> list[SchedulerConfig]:
    """The configs every VllmEngine the command builds gets (through the registry)."""
    built: list[SchedulerConfig] = []

    class Recorded(VllmEngine):
        def __init__(self, config: SchedulerConfig) -> None:
            built.append(config)
            super().__init__(config)

    monkeypatch.setattr(adapter, "VllmEngine", Recorded)
    return built


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["check", "--engine", "vllm"], "checking vllm against profile vllm-v1"),
        (["diff", "--right", "vllm", "--compare-block-ids"], "profile vllm-v1"),
    ],
)
def test_by_short_name_it_runs_on_its_own_configs_and_passes(
    args: list[str], says: str, built_configs: list[SchedulerConfig], tmp_path: Path
) -> None:
    """No --configs: vLLM's default configs (both modes, drafts as vLLM runs them, outside
    the known corners), and it passes."""
    from click.testing import CliRunner

    from schedspec.cli.main import main

    flags = ["--examples", "8", "--seed", "20261129", "--trace-dir", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, *flags])
    assert result.exit_code == 0, result.output
    assert says in result.output
    default = "schedspec.properties.strategies.engine_configs:vllm_default_configs"
    assert f"configs from {default}" in result.output
    assert len(built_configs) > 8  # the probe, then one per example
    assert all(unsupported_reason(c) is None for c in built_configs)
    assert all(avoid_known_corners(c) == c for c in built_configs)
