"""vLLM's KV connector path driven through our connector class, in lockstep with the
reference (schedspec.adapters.vllm.connector, docs/SPEC.md "The KV connector").

Each worked example runs the same calls on vLLM's Scheduler and on the reference
scheduler built from one config, and after every call compares what they decided and
their whole abstract state, block ids, the prefix cache and the connector's part
included. The traces are those of /work/connector-notes-0.34.md section 10 (A-H),
observed on vLLM 0.34.0 with a throw-away connector: now with the spec's.

Needs vLLM (`scripts/install_vllm.sh VENV_DIR`); skipped, with that reason, where it is
not installed, except in CI, where that fails (tests/vllm_required.py).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from tests.vllm_required import require_vllm

require_vllm("the vLLM KV connector tests")

from schedspec.adapters.vllm.config import build_scheduler, expressible  # noqa: E402
from schedspec.adapters.vllm.engine import VllmEngine  # noqa: E402
from schedspec.adapters.vllm.releases import SUPPORTED, current_release  # noqa: E402
from schedspec.reference import Scheduler as ReferenceScheduler  # noqa: E402
from schedspec.spec import (  # noqa: E402
    ConfigError,
    ModelRunnerOutput,
    OutputError,
    RemoteKV,
    Request,
    RequestOutput,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from schedspec.spec.connector import HeldBlocks, KVConnectorOutput  # noqa: E402
from schedspec.traces.divergence import OUTPUT_FIELDS  # noqa: E402

ON_034 = current_release().version == "0.34.0"
needs_034 = pytest.mark.skipif(
    not ON_034, reason="vLLM 0.34.0's connector path (max_num_inflight_kv_loads)"
)
TOKEN = 7  # what the model samples: no stop token, so requests end at max_tokens


def config(**overrides: Any) -> SchedulerConfig:
    """The notes' setting: block 4, 20 usable blocks, prefix caching, sync scheduling."""
    base: dict[str, Any] = {
        "block_size": 4,
        "num_blocks": 20,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 8,
        "max_model_len": 64,
        "enable_prefix_caching": True,
        "kv_connector": True,
    }
    return SchedulerConfig(**{**base, **overrides})


def prompt(length: int, first: int = 1) -> list[int]:
    return list(range(first, first + length))


class Lockstep:
    """The reference and vLLM, called alike; every call's result and the state after it
    compared (block ids included: both pools hand out blocks in the same order)."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.ref = ReferenceScheduler(cfg)
        self.vllm = VllmEngine(cfg)
        self.num_steps = 0
        self.compare("start")

    @property
    def engines(self) -> tuple[Any, Any]:
        return self.ref, self.vllm

    def state(self) -> State:
        """The reference's state (equal to vLLM's after every call)."""
        return self.ref.snapshot()

    def add(
        self,
        rid: str,
        length: int,
        max_tokens: int = 2,
        remote: RemoteKV | None = None,
        first: int = 1,
    ) -> None:
        for engine in self.engines:
            engine.add_request(Request(rid, prompt(length, first), max_tokens, remote_kv=remote))
        self.compare(f"add {rid}")

    def abort(self, rid: str) -> None:
        for engine in self.engines:
            engine.finish_requests([rid])
        self.compare(f"abort {rid}")

    def step(
        self,
        *,
        done: Iterable[str] = (),
        failed: Iterable[str] = (),
        invalid: Iterable[int] = (),
        sent: Iterable[str] = (),
    ) -> tuple[SchedulerOutput, dict[str, RequestOutput]]:
        """One step: schedule, the model's answer (a token for each request whose step
        reaches its known tokens) with the worker's report, update_from_output."""
        self.num_steps += 1
        where = f"step {self.num_steps}"
        ref_out, vllm_out = (engine.schedule() for engine in self.engines)
        for name, read in OUTPUT_FIELDS:
            assert read(vllm_out) == read(ref_out), f"{where}: schedule() {name}"
        assert _tables(vllm_out) == _tables(ref_out), f"{where}: schedule() block ids"
        self.compare(f"{where} schedule")
        after = self.state()
        sampled = {
            rid: [TOKEN]
            for rid in ref_out.num_scheduled_tokens
            if after.requests[rid].num_computed_tokens >= after.requests[rid].num_tokens
        }
        report = KVConnectorOutput(
            finished_recving=frozenset(done),
            failed_recving=frozenset(failed),
            invalid_block_ids=frozenset(invalid),
            finished_sending=frozenset(sent),
        )
        answer = ModelRunnerOutput(sampled, report if report else None)
        ref_res = self.ref.update_from_output(ref_out, answer)
        vllm_res = self.vllm.update_from_output(vllm_out, answer)
        assert _reported(vllm_res) == _reported(ref_res), f"{where}: update_from_output"
        self.compare(f"{where} update")
        return ref_out, ref_res

    def compare(self, where: str) -> None:
        ref, vllm = self.ref.snapshot(), self.vllm.snapshot()
        assert vllm.waiting == ref.waiting, f"after {where}: waiting"
        assert vllm.running == ref.running, f"after {where}: running"
        assert vllm.requests.keys() == ref.requests.keys(), f"after {where}: requests"
        for rid, request in ref.requests.items():
            assert vllm.requests[rid] == request, f"after {where}: request {rid}"
        assert vllm.kv.free_block_ids == ref.kv.free_block_ids, f"after {where}: free queue"
        assert vllm.kv.ref_counts == ref.kv.ref_counts, f"after {where}: ref counts"
        assert vllm.kv.block_hashes == ref.kv.block_hashes, f"after {where}: block hashes"
        assert set(vllm.kv.prefix_cache) == set(ref.kv.prefix_cache), f"after {where}: cache"
        assert vllm.connector == ref.connector, f"after {where}: connector"


def _tables(out: SchedulerOutput) -> tuple[object, ...]:
    new = sorted((n.request_id, n.block_ids, n.num_computed_tokens) for n in out.scheduled_new_reqs)
    cached = sorted(
        (c.request_id, c.new_block_ids, c.num_computed_tokens) for c in out.scheduled_cached_reqs
    )
    return tuple(new), tuple(cached)


def _reported(outputs: dict[str, RequestOutput]) -> dict[str, tuple[object, ...]]:
    """What both report per request: its kept tokens and finish status (vLLM reports no
    computed count)."""
    return {rid: (o.new_token_ids, o.finish_status) for rid, o in outputs.items()}


def run_to_end(lock: Lockstep, limit: int = 30) -> None:
    """Step until every request finished and no blocks are held for the connector."""
    for _ in range(limit):
        state = lock.state()
        if not state.requests and not (state.connector and state.connector.held):
            return
        lock.step()
    raise AssertionError(f"not done after {limit} steps")


# ---------------------------------------------------------------- the traces


def test_a_whole_prompt_async_load_is_promoted_to_recompute_its_last_token() -> None:
    lock = Lockstep(config())
    lock.add("a1", 10, remote=RemoteKV(10))
    out, _ = lock.step(done=["a1"])
    assert out.total_num_scheduled_tokens == 0
    state = lock.state()
    assert state.requests["a1"].status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert state.requests["a1"].num_computed_tokens == 10
    assert state.connector is not None and state.connector.loads == {"a1": "received"}
    out, _ = lock.step()
    assert dict(out.num_scheduled_tokens) == {"a1": 1}
    assert [n.request_id for n in out.scheduled_new_reqs] == ["a1"]
    run_to_end(lock)
    assert lock.state().connector.finished_calls[0][0] == "a1"  # type: ignore[union-attr]


@needs_034
def test_b_h_capped_loads_start_while_the_batch_is_full() -> None:
    lock = Lockstep(config(max_num_seqs=1, max_num_inflight_kv_loads=1))
    lock.add("r0", 6, max_tokens=3)
    lock.add("a1", 10, remote=RemoteKV(8), first=100)
    lock.add("a2", 10, remote=RemoteKV(8), first=200)
    assert lock.state().waiting == ("r0", "a1", "a2")
    out, _ = lock.step()
    assert dict(out.num_scheduled_tokens) == {"r0": 6}
    loads = lock.state().connector.loads  # type: ignore[union-attr]
    assert loads == {"a1": "loading"}  # a2 refused by the cap
    lock.step(done=["a1"])
    # H: a received load not yet running still counts against the cap.
    assert lock.state().connector.loads == {"a1": "received"}  # type: ignore[union-attr]
    lock.step()
    assert lock.state().connector.loads == {"a1": "received"}  # type: ignore[union-attr]
    out, _ = lock.step()  # r0 finished in the step before: a1 runs, a2 starts
    assert dict(out.num_scheduled_tokens) == {"a1": 2}
    assert lock.state().connector.loads == {"a2": "loading"}  # type: ignore[union-attr]
    lock.step(done=["a2"])
    run_to_end(lock)


def test_c_an_abort_during_a_load_holds_its_blocks_until_the_load_reports() -> None:
    cfg = config(max_num_inflight_kv_loads=2) if ON_034 else config()
    lock = Lockstep(cfg)
    lock.add("a1", 10, remote=RemoteKV(8))
    lock.step()
    blocks = lock.state().requests["a1"].block_ids
    lock.abort("a1")
    connector = lock.state().connector
    assert connector is not None
    assert connector.held == {"a1": HeldBlocks(blocks, "loading")}
    assert connector.finished_calls == (("a1", blocks),)
    lock.step(done=["a1"])
    assert lock.state().connector.held == {}  # type: ignore[union-attr]
    assert len(lock.state().kv.free_block_ids) == 20


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_d_an_invalid_block_truncates_or_fails_the_load(policy: str) -> None:
    lock = Lockstep(config(kv_load_failure_policy=policy))
    lock.add("a1", 12, remote=RemoteKV(10))
    lock.step()
    blocks = lock.state().requests["a1"].block_ids
    assert len(blocks) == 3
    _, reported = lock.step(done=["a1"], invalid=[blocks[1]])
    if policy == "recompute":
        assert reported == {}
        state = lock.state()
        assert state.requests["a1"].num_computed_tokens == 4
        assert state.connector.loads == {"a1": "failed"}  # type: ignore[union-attr]
        out, _ = lock.step()
        assert dict(out.num_scheduled_tokens) == {"a1": 8}
        run_to_end(lock)
    else:
        assert reported["a1"].finish_status is RequestStatus.FINISHED_ERROR
        state = lock.state()
        assert state.requests == {}
        assert state.connector.finished_calls == (("a1", blocks[:1]),)  # type: ignore[union-attr]
        assert len(state.kv.free_block_ids) == 20


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_e_a_failed_load_reloads_or_fails(policy: str) -> None:
    lock = Lockstep(config(kv_load_failure_policy=policy))
    lock.add("a1", 12, remote=RemoteKV(10))
    lock.step()
    blocks = lock.state().requests["a1"].block_ids
    _, reported = lock.step(done=["a1"], failed=["a1"])
    if policy == "recompute":
        assert reported == {}
        lock.step()  # promoted with nothing valid: its blocks go back, a new load starts
        state = lock.state()
        assert state.connector.loads == {"a1": "loading"}  # type: ignore[union-attr]
        lock.step(done=["a1"])
        run_to_end(lock)
    else:
        assert reported["a1"].finish_status is RequestStatus.FINISHED_ERROR
        assert lock.state().connector.finished_calls == (("a1", blocks),)  # type: ignore[union-attr]
        assert len(lock.state().kv.free_block_ids) == 20


def test_f_a_sending_request_keeps_its_blocks_until_the_send_reports() -> None:
    lock = Lockstep(config())
    lock.add("p1", 6, max_tokens=3, remote=RemoteKV(0, send_on_finish=True))
    for _ in range(3):
        lock.step()
    state = lock.state()
    assert state.requests == {}
    assert state.connector is not None and set(state.connector.held) == {"p1"}
    assert state.connector.held["p1"].reason == "sending"
    assert len(state.kv.free_block_ids) == 18
    lock.step(sent=["p1"])
    assert lock.state().connector.held == {}  # type: ignore[union-attr]
    assert len(lock.state().kv.free_block_ids) == 20


def test_g_a_sync_load_is_admitted_at_once() -> None:
    lock = Lockstep(config())
    lock.add("g1", 12, remote=RemoteKV(8, load_async=False))
    out, _ = lock.step()
    assert dict(out.num_scheduled_tokens) == {"g1": 4}
    assert out.scheduled_new_reqs[0].num_computed_tokens == 8
    run_to_end(lock)


def test_an_unready_lookup_is_asked_again_each_step() -> None:
    lock = Lockstep(config())
    lock.add("u1", 10, remote=RemoteKV(8, num_unready_queries=2))
    lock.add("r1", 5, first=50)
    for _ in range(2):
        out, _ = lock.step()
        assert "u1" not in out.num_scheduled_tokens
        assert lock.state().requests["u1"].status is RequestStatus.WAITING
    lock.step()
    assert lock.state().connector.loads == {"u1": "loading"}  # type: ignore[union-attr]
    lock.step(done=["u1"])
    run_to_end(lock)


def test_a_load_behind_a_local_prefix_hit_loads_only_the_rest() -> None:
    lock = Lockstep(config())
    lock.add("s1", 9)
    run_to_end(lock)
    lock.add("a1", 12, remote=RemoteKV(12))  # shares s1's first two blocks
    lock.step()
    state = lock.state()
    assert state.requests["a1"].num_computed_tokens == 12
    assert state.connector.loads == {"a1": "loading"}  # type: ignore[union-attr]
    lock.step(done=["a1"])
    run_to_end(lock)


# ------------------------------------------------------------ configuration


def test_the_connector_knobs_reach_vllm() -> None:
    cfg = config(kv_load_failure_policy="recompute")
    scheduler = build_scheduler(cfg)
    assert type(scheduler.connector).__name__ == "SchedspecConnector"
    assert scheduler.recompute_kv_load_failures
    assert build_scheduler(config(kv_connector=False)).connector is None


def test_a_connector_under_async_scheduling_is_refused() -> None:
    # By the spec's config itself: vLLM then defers block frees past the batch in flight.
    with pytest.raises(ConfigError, match="async_scheduling"):
        config(async_scheduling=True)


def test_a_cap_on_loads_in_flight_is_refused_where_the_release_has_none() -> None:
    cfg = config(max_num_inflight_kv_loads=2)
    if ON_034:
        assert build_scheduler(cfg).scheduler_config.max_num_inflight_kv_loads == 2
        return
    with pytest.raises(ConfigError, match="max_num_inflight_kv_loads"):
        VllmEngine(cfg)
    assert expressible(cfg).max_num_inflight_kv_loads is None


def test_only_0_34_0_has_the_cap() -> None:
    assert {r.version: r.inflight_kv_load_cap for r in SUPPORTED} == {
        "0.33.0": False,
        "0.34.0": True,
    }


def test_a_report_naming_an_unknown_request_is_refused_before_anything_changes() -> None:
    engine = VllmEngine(config())
    engine.add_request(Request("a1", prompt(10), 2, remote_kv=RemoteKV(10)))
    out = engine.schedule()
    report = KVConnectorOutput(finished_recving=frozenset({"zz"}))
    with pytest.raises(OutputError, match="finished_recving"):
        engine.update_from_output(out, ModelRunnerOutput({}, report))
    engine.update_from_output(out, ModelRunnerOutput({}, KVConnectorOutput(frozenset({"a1"}))))


def test_without_a_connector_the_state_has_no_connector_part() -> None:
    engine = VllmEngine(config(kv_connector=False))
    engine.add_request(Request("r1", prompt(5), 2))
    assert engine.snapshot().connector is None
    assert engine.snapshot().requests["r1"].remote_kv is None


@needs_034
def test_a_parked_load_passed_over_in_the_same_step_still_counts_against_the_cap() -> None:
    # Step 2 passes over a1 (still loading) in the holding queue before it looks at
    # a2: vLLM's count of loads in flight includes a1 all the same.
    lock = Lockstep(config(max_num_inflight_kv_loads=1))
    lock.add("a1", 10, remote=RemoteKV(8))
    lock.step()
    lock.add("a2", 10, remote=RemoteKV(8), first=100)
    lock.step()
    assert lock.state().connector.loads == {"a1": "loading"}  # type: ignore[union-attr]
    lock.step(done=["a1"])
    lock.step()  # a1 runs: a2 starts
    assert lock.state().connector.loads == {"a2": "loading"}  # type: ignore[union-attr]
    lock.step(done=["a2"])
    run_to_end(lock)


def test_a_preempted_request_recomputes_what_its_served_load_brought() -> None:
    # 7 blocks of 4: r2 and a1 outgrow them, and a1, the newer, is preempted. Its async
    # load was served once (the fake connector offers it nothing more, as a P/D prefill's
    # KV is consumed): with no prefix cache to hit, it resumes by recomputing.
    lock = Lockstep(config(num_blocks=7, max_model_len=28, enable_prefix_caching=False))
    lock.add("r2", 8, max_tokens=14)
    lock.step()
    lock.add("a1", 8, max_tokens=14, remote=RemoteKV(8), first=100)
    seen: list[str] = []
    for _ in range(40):
        state = lock.state()
        if not state.requests:
            break
        assert state.connector is not None
        loading = [rid for rid, phase in state.connector.loads.items() if phase == "loading"]
        out, _ = lock.step(done=loading)
        if "a1" in out.preempted_req_ids:
            seen.append("preempted")
        if any(c.request_id == "a1" and c.resumed for c in out.scheduled_cached_reqs):
            seen.append("resumed")
        if lock.state().connector.loads.get("a1") == "loading":  # type: ignore[union-attr]
            seen.append("loading")
    assert seen == ["loading", "preempted", "resumed"]


def test_b_without_a_cap_no_load_starts_while_the_batch_is_full() -> None:
    # Trace B on either release with no cap: 0.34.0 then has no async_kv_waiting, and
    # like 0.33.0 starts a load only where a running slot is free.
    lock = Lockstep(config(max_num_seqs=1))
    lock.add("r0", 6, max_tokens=3)
    lock.add("a1", 10, remote=RemoteKV(8), first=100)
    lock.add("a2", 10, remote=RemoteKV(8), first=200)
    for _ in range(3):
        lock.step()
        assert lock.state().connector.loads == {}  # type: ignore[union-attr]
    lock.step()  # r0 is gone: both loads start in one step
    assert lock.state().connector.loads == {"a1": "loading", "a2": "loading"}  # type: ignore[union-attr]
    lock.step(done=["a1", "a2"])
    run_to_end(lock)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_an_invalid_block_a_running_request_shares_parts_vllm_from_the_reference(
    policy: str,
) -> None:
    # A gap of the reference, not of vLLM: vLLM's _handle_invalid_blocks scans the
    # running requests too (its pass for sync loads, with a set of marked blocks of its
    # own), so an invalid block that a parked load shares with a running request (here
    # a local prefix hit) rolls that request back to the block ("recompute", its output
    # skipped) or fails it ("fail"). The reference scans parked loads only. A worker
    # reports only blocks it loaded, which a parked load shares with nobody: the
    # harness must name only those (a block past the load's local hit).
    lock = Lockstep(config(kv_load_failure_policy=policy))
    lock.add("r1", 9, max_tokens=10)
    lock.step()
    lock.step()
    lock.add("a1", 12, remote=RemoteKV(12))  # hits r1's first two blocks
    lock.step()
    shared = lock.state().requests["a1"].block_ids[0]
    assert shared == lock.state().requests["r1"].block_ids[0]
    out = [engine.schedule() for engine in lock.engines]
    report = KVConnectorOutput(frozenset({"a1"}), invalid_block_ids=frozenset({shared}))
    answer = ModelRunnerOutput({"r1": [TOKEN]}, report)
    ref_res = lock.ref.update_from_output(out[0], answer)
    vllm_res = lock.vllm.update_from_output(out[1], answer)
    assert ref_res["r1"].finish_status is None and "r1" in lock.ref.snapshot().requests
    if policy == "recompute":
        assert "r1" not in vllm_res  # its output skipped: it recomputes from block 0
        assert lock.vllm.snapshot().requests["r1"].num_computed_tokens == 0
    else:
        assert vllm_res["r1"].finish_status is RequestStatus.FINISHED_ERROR


def test_two_sends_that_finish_together_free_in_the_spec_ids_order() -> None:
    # vLLM frees in the order it iterates finished_sending; the adapter hands it the
    # ids sorted (a set of strings would iterate in string-hash order).
    lock = Lockstep(config())
    lock.add("p2", 6, max_tokens=1, remote=RemoteKV(0, send_on_finish=True))
    lock.add("p1", 6, max_tokens=1, remote=RemoteKV(0, send_on_finish=True), first=50)
    lock.step()
    assert set(lock.state().connector.held) == {"p1", "p2"}  # type: ignore[union-attr]
    lock.step(sent=["p2", "p1"])
    assert len(lock.state().kv.free_block_ids) == 20


def test_a_finished_load_for_a_request_without_one_is_refused() -> None:
    engine = VllmEngine(config())
    engine.add_request(Request("r1", prompt(5), 3))
    out = engine.schedule()
    reports = {
        "finished_recving": KVConnectorOutput(finished_recving=frozenset({"r1"})),
        "finished_sending": KVConnectorOutput(finished_sending=frozenset({"r1"})),
    }
    for name, report in reports.items():
        with pytest.raises(OutputError, match=name):
            engine.update_from_output(out, ModelRunnerOutput({"r1": [TOKEN]}, report))
    engine.update_from_output(out, ModelRunnerOutput({"r1": [TOKEN]}))


@pytest.mark.parametrize("seed", range(6))
def test_random_connector_traces_agree(seed: int) -> None:
    """Random requests, reports (only for what is in flight, as a worker would send:
    an invalid block is a load's last, never a local hit) and aborts.

    At most one load fails per step: vLLM finishes the loads that fail under "fail"
    in one update_from_output in the order it iterates a set of their ids (string-hash
    order, which changes from process to process), so with two their request_finished
    calls come in either order."""
    rng = random.Random(seed)
    overrides: dict[str, Any] = {
        "max_num_seqs": rng.choice([1, 2, 4]),
        "num_blocks": rng.choice([16, 40]),
        "kv_load_failure_policy": rng.choice(["fail", "recompute"]),
        "enable_prefix_caching": rng.random() < 0.7,
    }
    if ON_034 and rng.random() < 0.6:
        overrides["max_num_inflight_kv_loads"] = rng.choice([1, 2])
    lock = Lockstep(config(**overrides))
    for step in range(40):
        if step < 24 and rng.random() < 0.35:
            length = rng.randint(3, 20)
            remote = RemoteKV(
                rng.randint(0, length),
                load_async=rng.random() < 0.7,
                num_unready_queries=rng.choice([0, 0, 1]),
                send_on_finish=rng.random() < 0.3,
            )
            lock.add(f"q{step}", length, rng.randint(1, 5), remote, rng.choice([1, 100 + step]))
        state = lock.state()
        if rng.random() < 0.05 and state.requests:
            lock.abort(rng.choice(sorted(state.requests)))
            state = lock.state()
        assert state.connector is not None
        loads, held = state.connector.loads, state.connector.held
        in_flight = [r for r, p in loads.items() if p == "loading"]
        in_flight += [r for r, h in held.items() if h.reason == "loading"]
        done = [r for r in in_flight if rng.random() < 0.5]
        parked = [r for r in done if r in loads and state.requests[r].block_ids]
        failing = parked[0] if parked and rng.random() < 0.3 else None
        whole = rng.random() < 0.5
        failed = [failing] if failing and whole else []
        invalid = [state.requests[failing].block_ids[-1]] if failing and not whole else []
        sent = [r for r, h in held.items() if h.reason == "sending" and rng.random() < 0.5]
        lock.step(done=done, failed=failed, invalid=invalid, sent=sent)
