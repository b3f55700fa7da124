"""The KV connector (docs/SPEC.md, "The KV connector"): each rule of the reference with a
worked example, the inputs refused where they enter, and every connector invariant both
ways (it holds on a real transition, and fires on one corrupted as a bug would)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from schedspec.engines.events import AddRequest, KVTransfers, Step
from schedspec.properties.connector_worker import WorkerClock, worker_output
from schedspec.spec import (
    ConfigError,
    HeldBlocks,
    KVConnectorOutput,
    OutputError,
    RemoteKV,
    Request,
    RequestError,
    RequestStatus,
    State,
)
from schedspec.spec.connector import ConnectorState
from schedspec.spec.invariants import CATALOGUE
from schedspec.traces.trace import Trace, TraceError, trace_from_json
from tests.invariant_builders import (
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    tokens,
    with_kv,
    with_request,
)
from tests.sched_helpers import make_config

cases = CaseRegistry()

CONNECTOR = {
    "block_size": 4,
    "num_blocks": 20,
    "max_num_batched_tokens": 64,
    "max_num_seqs": 4,
    "max_model_len": 64,
    "enable_prefix_caching": True,
    "kv_connector": True,
}


def driver(**overrides: Any) -> Driver:
    return Driver(**{**CONNECTOR, **overrides})


def done(
    *request_ids: str, failed: tuple[str, ...] = (), bad: tuple[int, ...] = ()
) -> KVConnectorOutput:
    """A worker report: these loads done (the failed ones too), these blocks bad."""
    return KVConnectorOutput(
        finished_recving=frozenset((*request_ids, *failed)),
        failed_recving=frozenset(failed),
        invalid_block_ids=frozenset(bad),
    )


def sent(*request_ids: str) -> KVConnectorOutput:
    return KVConnectorOutput(finished_sending=frozenset(request_ids))


def connector(state: State) -> ConnectorState:
    assert state.connector is not None
    return state.connector


# ------------------------------------------------------------ the rules, worked


def test_an_async_load_of_the_whole_prompt_parks_then_runs_its_last_token() -> None:
    """vLLM trace A: 10 tokens, all remote. The load parks holding 3 blocks and 10
    computed tokens, schedules nothing, caches nothing; once reported, the next step
    promotes it to 9 computed (the last token's logits are the point) and runs 1 token."""
    d = driver()
    d.add("a1", prompt=tokens(1, 10), max_tokens=3, remote_kv=RemoteKV(10))
    park, _ = d.step()
    a1 = park.post.requests["a1"]
    assert park.output.num_scheduled_tokens == {}
    assert a1.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert (a1.num_computed_tokens, len(a1.block_ids)) == (10, 3)
    assert all(park.post.kv.block_hashes[b] is None for b in a1.block_ids)
    assert connector(park.post).loads == {"a1": "loading"}
    still, _ = d.step()  # no report yet: it stays parked
    assert still.output.num_scheduled_tokens == {}
    d.update(d.schedule(), report=done("a1"))
    assert connector(d.state).loads == {"a1": "received"}
    promoted = d.schedule()
    assert promoted.output.num_scheduled_tokens == {"a1": 1}
    (new,) = promoted.output.scheduled_new_reqs
    assert new.num_computed_tokens == 9
    assert [promoted.post.kv.block_hashes[b] is not None for b in new.block_ids] == [
        True,
        True,
        False,
    ]


def test_a_sync_load_is_admitted_at_once_and_leaves_the_last_token_to_compute() -> None:
    """vLLM trace G: 12 tokens, 8 remote, sync: admitted with 8 computed, 4 scheduled."""
    d = driver()
    d.add("g1", prompt=tokens(1, 12), max_tokens=3, remote_kv=RemoteKV(8, load_async=False))
    t = d.schedule()
    assert t.output.num_scheduled_tokens == {"g1": 4}
    assert t.output.scheduled_new_reqs[0].num_computed_tokens == 8
    full = RemoteKV(12, load_async=False)
    d.add("g2", prompt=tokens(50, 12), max_tokens=3, remote_kv=full)
    assert d.schedule().output.scheduled_new_reqs[0].num_computed_tokens == 11


def test_a_lookup_not_ready_skips_the_request_for_as_many_steps_keeping_its_place() -> None:
    d = driver()
    d.add("a", prompt=tokens(1, 8), remote_kv=RemoteKV(8, num_unready_queries=2))
    d.add("b", prompt=tokens(100, 8))
    first, _ = d.step()
    assert first.output.num_scheduled_tokens == {"b": 8}
    assert first.post.waiting == ("a",)
    d.step()
    park, _ = d.step()
    assert connector(park.post).loads == {"a": "loading"}


def test_a_load_is_served_once_a_preempted_request_recomputes() -> None:
    d = driver()
    d.add("a", prompt=tokens(1, 8), max_tokens=3, remote_kv=RemoteKV(8))
    d.step()
    d.update(d.schedule(), report=done("a"))
    loads = d.scheduler.kv_loads  # type: ignore[union-attr]
    assert loads is not None
    remote = RemoteKV(8)
    assert loads.connector.get_num_new_matched_tokens("a", remote, 9, 0) == (0, False)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_bad_block_cuts_the_load_to_it_or_fails_the_request(policy: str) -> None:
    """vLLM trace D: 12 tokens, 10 remote, its second block bad. recompute: 10 -> 4
    computed, marked failed, promoted with the valid prefix cached and 8 tokens to run.
    fail: an error finish in that update, request_finished with the cut blocks, and the
    blocks freed as the report lands."""
    d = driver(kv_load_failure_policy=policy)
    d.add("a1", prompt=tokens(1, 12), max_tokens=3, remote_kv=RemoteKV(10))
    park, _ = d.step()
    table = park.post.requests["a1"].block_ids
    t = d.schedule()
    u = d.update(t, report=done("a1", bad=(table[1],)))
    if policy == "fail":
        assert "a1" not in u.post.requests
        assert u.request_outputs is not None
        assert u.request_outputs["a1"].finish_status is RequestStatus.FINISHED_ERROR
        assert connector(u.post).finished_calls == (("a1", table[:1]),)
        assert len(u.post.kv.free_block_ids) == 20
        return
    assert u.post.requests["a1"].num_computed_tokens == 4
    assert connector(u.post).loads == {"a1": "failed"}
    promoted = d.schedule()
    assert promoted.output.num_scheduled_tokens == {"a1": 8}


def test_a_load_that_failed_whole_recomputes_from_nothing() -> None:
    """vLLM trace E under recompute: failed_recving sets 0 computed; at promotion the
    blocks go back and the request looks its KV up again (a fresh load; the fake's
    remote side serves it this time)."""
    d = driver(kv_load_failure_policy="recompute")
    d.add("a1", prompt=tokens(1, 12), max_tokens=3, remote_kv=RemoteKV(12))
    d.step()
    u = d.update(d.schedule(), report=done(failed=("a1",)))
    assert u.post.requests["a1"].num_computed_tokens == 0
    again = d.schedule()
    assert connector(again.post).loads == {"a1": "loading"}
    assert again.output.num_scheduled_tokens == {}


def test_an_abort_while_loading_holds_the_blocks_until_the_load_reports() -> None:
    """vLLM trace C: request_finished at the abort; the blocks stay held for the load in
    flight until it reports, and only then are freed."""
    d = driver()
    d.add("a1", prompt=tokens(1, 8), max_tokens=3, remote_kv=RemoteKV(8))
    park, _ = d.step()
    blocks = park.post.requests["a1"].block_ids
    aborted = d.abort("a1")
    assert connector(aborted.post).held == {"a1": HeldBlocks(blocks, "loading")}
    assert connector(aborted.post).finished_calls == (("a1", blocks),)
    u = d.update(d.schedule(), report=done("a1"))
    assert connector(u.post).held == {}
    assert len(u.post.kv.free_block_ids) == 20


def test_an_abort_after_the_load_reported_frees_at_once() -> None:
    d = driver()
    d.add("a1", prompt=tokens(1, 8), max_tokens=3, remote_kv=RemoteKV(8))
    d.step()
    d.update(d.schedule(), report=done("a1"))
    aborted = d.abort("a1")
    assert connector(aborted.post).held == {}
    assert len(aborted.post.kv.free_block_ids) == 20


def test_a_send_keeps_the_blocks_and_the_id_until_it_is_reported() -> None:
    """vLLM trace F: request_finished asks to delay the free; the request is gone from
    the live ones but its blocks stay, and its id is refused, until finished_sending."""
    d = driver()
    d.add("p1", prompt=tokens(1, 6), max_tokens=1, remote_kv=RemoteKV(0, send_on_finish=True))
    _, u = d.step()
    held = connector(u.post).held
    assert set(held) == {"p1"} and held["p1"].reason == "sending"
    assert len(u.post.kv.free_block_ids) == 20 - len(held["p1"].block_ids)
    with pytest.raises(RequestError, match="still held by the KV connector"):
        d.scheduler.add_request(Request("p1", tokens(1, 6), 1))
    d.update(d.schedule(), report=sent("p1"))
    assert connector(d.state).held == {}
    assert len(d.state.kv.free_block_ids) == 20


def test_the_cap_starts_loads_while_the_batch_is_full_and_counts_them_until_they_run() -> None:
    """vLLM trace B/H: one seat, a cap of one load in flight. r0 runs; a1 starts its
    load beside it (the batch is full: loads only), a2 waits for the cap until a1 runs."""
    d = driver(max_num_seqs=1, max_num_inflight_kv_loads=1)
    d.add("r0", prompt=tokens(1, 6), max_tokens=3)
    d.add("a1", prompt=tokens(100, 10), remote_kv=RemoteKV(8))
    d.add("a2", prompt=tokens(200, 10), remote_kv=RemoteKV(8))
    first, _ = d.step()
    assert first.output.num_scheduled_tokens == {"r0": 6}
    assert connector(first.post).loads == {"a1": "loading"}
    d.update(d.schedule(), report=done("a1"))
    assert connector(d.state).loads == {"a1": "received"}
    assert "a2" not in connector(d.state).loads  # the received load still counts


def test_a_failed_load_retries_without_its_own_reservation() -> None:
    """FINDINGS F5: a load that failed with nothing valid keeps the reservation its
    promotion set; vLLM (0.33.0 and 0.34.0) counts it against the retry, which a pool
    holding the request once never fits. The reference leaves the request's own
    reservation out."""
    d = driver(num_blocks=3, max_model_len=12, kv_load_failure_policy="recompute")
    d.add("a1", prompt=tokens(1, 11), max_tokens=1, remote_kv=RemoteKV(11))
    d.step()
    d.update(d.schedule(), report=done(failed=("a1",)))
    retry = d.schedule()
    assert connector(retry.post).loads == {"a1": "loading"}


# ------------------------------------------------------------ refused inputs


def test_the_connector_knobs_need_a_connector_and_refuse_async_scheduling() -> None:
    with pytest.raises(ConfigError, match=r"kv_load_failure_policy.*needs kv_connector"):
        make_config(kv_load_failure_policy="recompute")
    with pytest.raises(ConfigError, match=r"max_num_inflight_kv_loads.*needs kv_connector"):
        make_config(max_num_inflight_kv_loads=2)
    with pytest.raises(ConfigError, match="max_num_inflight_kv_loads: must be >= 1"):
        make_config(kv_connector=True, max_num_inflight_kv_loads=0)
    with pytest.raises(ConfigError, match="kv_load_failure_policy: must be one of"):
        make_config(kv_connector=True, kv_load_failure_policy="retry")
    with pytest.raises(ConfigError, match="async_scheduling"):
        make_config(kv_connector=True, async_scheduling=True)
    with pytest.raises(ConfigError, match="kv_connector"):
        make_config(family="sglang", kv_connector=True, max_model_len=64)


def test_a_pool_too_small_for_a_load_beside_a_verify_step_is_refused() -> None:
    fields = {**CONNECTOR, "num_blocks": 16, "num_speculative_tokens": 4, "num_lookahead_tokens": 4}
    with pytest.raises(ConfigError, match="num_blocks: must be >= 19"):
        make_config(**fields)
    make_config(**{**fields, "num_blocks": 19})


@pytest.mark.parametrize(
    ("remote", "field"),
    [
        (RemoteKV(9), "remote_kv.num_tokens"),
        (RemoteKV(-1), "remote_kv.num_tokens"),
        (RemoteKV(2, num_unready_queries=65), "remote_kv.num_unready_queries"),
        (RemoteKV(2, load_steps=0), "remote_kv.load_steps"),
        (RemoteKV(2, load_failure="half"), "remote_kv.load_failure"),  # type: ignore[arg-type]
        (RemoteKV(2, send_never_finishes=True), "remote_kv.send_never_finishes"),
        (RemoteKV(2, load_async=1), "remote_kv.load_async"),  # type: ignore[arg-type]
    ],
)
def test_remote_kv_out_of_its_bounds_is_refused_at_add_request(
    remote: RemoteKV, field: str
) -> None:
    d = driver()
    before = d.state
    with pytest.raises(RequestError, match=field):
        d.scheduler.add_request(Request("a", tokens(1, 8), 1, remote_kv=remote))
    assert d.state == before


def test_remote_kv_without_a_connector_is_refused() -> None:
    d = Driver(**{**CONNECTOR, "kv_connector": False})
    with pytest.raises(RequestError, match="needs a config with kv_connector=True"):
        d.scheduler.add_request(Request("a", tokens(1, 8), 1, remote_kv=RemoteKV(4)))


def test_a_report_of_a_transfer_not_in_flight_is_refused_before_any_change() -> None:
    d = driver()
    d.add("a", prompt=tokens(1, 8), max_tokens=5)
    t = d.schedule()
    before = d.state
    from schedspec.spec import ModelRunnerOutput

    for report, field in (
        (done("a"), "finished_recving"),
        (sent("a"), "finished_sending"),
        (KVConnectorOutput(invalid_block_ids=frozenset({99})), "invalid_block_ids"),
    ):
        with pytest.raises(OutputError, match=field):
            d.scheduler.update_from_output(
                t.output, ModelRunnerOutput({"a": [1]}, kv_connector_output=report)
            )
        assert d.state == before


# ------------------------------------------------------------ the worker, traces


def test_the_worker_reports_only_what_the_engine_waits_for() -> None:
    d = driver()
    d.add("a1", prompt=tokens(1, 8), max_tokens=3, remote_kv=RemoteKV(8))
    park, _ = d.step()
    state = d.state
    transfers = KVTransfers(
        loads_done=("a1", "nobody"), blocks_failed=(("a1", 0), ("a1", 7)), sends_done=("a1",)
    )
    report = worker_output(transfers, state, frozenset())
    assert report == KVConnectorOutput(
        finished_recving=frozenset({"a1"}),
        invalid_block_ids=frozenset({park.post.requests["a1"].block_ids[0]}),
    )
    everything = worker_output(None, state, frozenset())
    assert everything is not None and everything.finished_recving == {"a1"}


def test_the_worker_clock_fails_a_load_once_then_serves_the_retry() -> None:
    d = driver(kv_load_failure_policy="recompute")
    event = AddRequest("a", tokens(1, 8), 3, remote_kv=RemoteKV(8, load_failure="request"))
    clock = WorkerClock()
    clock.on_add(event)
    d.scheduler.add_request(event.to_request())
    d.schedule()
    first = clock.transfers(d.state)
    assert first.loads_failed == ("a",)
    assert clock.transfers(d.state).loads_failed == ()


def test_a_trace_with_the_connector_round_trips_and_older_versions_refuse_it(
    tmp_path: Path,
) -> None:
    config = make_config(**CONNECTOR, kv_load_failure_policy="recompute")
    remote = RemoteKV(4, load_async=False, send_on_finish=True, load_failure="block")
    transfers = KVTransfers(("a",), ("b",), (("a", 1),), ("c",))
    trace = Trace(
        config, (AddRequest("a", (1, 2, 3, 4, 5), 2, remote_kv=remote), Step(kv=transfers))
    )
    path = tmp_path / "t.json"
    trace.save(path)
    assert Trace.load(path) == trace
    document = trace.to_json()
    document["version"] = 5
    document["config"] = {k: v for k, v in document["config"].items() if "kv" not in k}
    with pytest.raises(TraceError, match=r"events\[0\].remote_kv: not a field of version 5"):
        trace_from_json(document)
    bad = trace.to_json()
    bad["events"][0]["remote_kv"]["num_tokens"] = 6
    with pytest.raises(TraceError, match=r"remote_kv\.num_tokens"):
        trace_from_json(bad)
    bad = trace.to_json()
    bad["events"][1]["kv"]["blocks_failed"] = [["a", -1]]
    with pytest.raises(TraceError, match="blocks_failed"):
        trace_from_json(bad)


# ------------------------------------------------------------ the invariants, both ways


def _parked() -> tuple[Driver, Any]:
    d = driver()
    d.add("a1", prompt=tokens(1, 10), max_tokens=3, remote_kv=RemoteKV(10))
    d.add("r0", prompt=tokens(100, 6), max_tokens=2)
    return d, d.schedule()


@cases("LOAD-PARKED")
def case_parked_load_without_its_blocks() -> Case:
    d, _ = _parked()
    good = d.state
    bad = with_request(good, "a1", block_ids=())
    return Case("LOAD-PARKED", good, bad, "blocks do not cover the loaded tokens", "a1")


@cases("LOAD-PARKED")
def case_parked_load_the_connector_does_not_list() -> Case:
    d, _ = _parked()
    good = d.state
    bad = dataclasses.replace(good, connector=ConnectorState())
    return Case("LOAD-PARKED", good, bad, "parked but listed as None", "a1")


@cases("LOAD-UNCACHED")
def case_load_cached_at_park() -> Case:
    _, t = _parked()
    block = t.post.requests["a1"].block_ids[0]
    post = with_kv(t.post, block_hashes=_with_hash(t.post, block, 12345))
    return Case("LOAD-UNCACHED", t, dataclasses.replace(t, post=post), "cached before", "a1", block)


@cases("LOAD-UNCACHED-UPDATE")
def case_load_cached_by_an_update() -> Case:
    d, t = _parked()
    u = d.update(t)
    block = u.post.requests["a1"].block_ids[1]
    post = with_kv(u.post, block_hashes=_with_hash(u.post, block, 12345))
    bad = dataclasses.replace(u, post=post)
    return Case("LOAD-UNCACHED-UPDATE", u, bad, "cached before", "a1", block)


def _promotion() -> Any:
    d, t = _parked()
    d.update(t, report=done("a1"))
    return d.schedule()


@cases("LOAD-PROMOTION")
def case_promoted_before_the_report() -> Case:
    t = _promotion()
    pre = dataclasses.replace(
        t.pre, connector=dataclasses.replace(connector(t.pre), loads={"a1": "loading"})
    )
    bad = dataclasses.replace(t, pre=pre)
    return Case("LOAD-PROMOTION", t, bad, "promoted with its load not reported", "a1")


@cases("LOAD-PROMOTION")
def case_promoted_with_nothing_left_to_compute() -> Case:
    t = _promotion()
    post = with_request(t.post, "a1", num_computed_tokens=10)
    output = dataclasses.replace(
        t.output,
        scheduled_new_reqs=tuple(
            r._replace(num_computed_tokens=10) for r in t.output.scheduled_new_reqs
        ),
    )
    bad = dataclasses.replace(t, post=post, output=output)
    return Case("LOAD-PROMOTION", t, bad, "none left to compute", "a1", expected=9, actual=10)


def _send_finishes() -> Any:
    d = driver()
    d.add("p1", prompt=tokens(1, 6), max_tokens=1, remote_kv=RemoteKV(0, send_on_finish=True))
    _, u = d.step()
    return d, u


@cases("CONNECTOR-FINISHED")
def case_request_finished_never_called() -> Case:
    _, u = _send_finishes()
    post = dataclasses.replace(
        u.post, connector=dataclasses.replace(connector(u.post), finished_calls=())
    )
    bad = dataclasses.replace(u, post=post)
    return Case("CONNECTOR-FINISHED", u, bad, "not called exactly once", "p1", expected=1, actual=0)


@cases("CONNECTOR-FINISHED")
def case_send_held_past_its_report() -> Case:
    d, _ = _send_finishes()
    u = d.update(d.schedule(), report=sent("p1"))
    held = HeldBlocks((0, 1), "sending")
    pre = dataclasses.replace(
        u.pre, connector=dataclasses.replace(connector(u.pre), held={"p1": held})
    )
    post = dataclasses.replace(
        u.post, connector=dataclasses.replace(connector(u.post), held={"p1": held})
    )
    good = dataclasses.replace(u, pre=pre, post=dataclasses.replace(u.post))
    bad = dataclasses.replace(u, pre=pre, post=post)
    return Case("CONNECTOR-FINISHED", good, bad, "still held after the worker reported", "p1")


@cases("CONNECTOR-FINISHED-ABORT")
def case_abort_of_a_load_in_flight_frees_at_once() -> Case:
    d, t = _parked()
    d.update(t)
    good = d.abort("a1")
    post = dataclasses.replace(
        good.post, connector=dataclasses.replace(connector(good.post), held={})
    )
    bad = dataclasses.replace(good, post=post)
    return Case("CONNECTOR-FINISHED-ABORT", good, bad, "ended with its blocks freed", "a1")


@cases("LOAD-FAILURE")
def case_failed_load_lives_on_under_fail() -> Case:
    d, t = _parked()
    d.update(t)
    u = d.update(d.schedule(), report=done(failed=("a1",)))
    before = u.pre.requests["a1"]
    post = dataclasses.replace(u.post, requests={**u.post.requests, "a1": before})
    bad = dataclasses.replace(u, post=post)
    return Case("LOAD-FAILURE", u, bad, "a failed load's request lives on", "a1")


@cases("LOAD-FAILURE")
def case_bad_block_not_cut_under_recompute() -> Case:
    d = driver(kv_load_failure_policy="recompute")
    d.add("a1", prompt=tokens(1, 12), max_tokens=3, remote_kv=RemoteKV(10))
    park, _ = d.step()
    table = park.post.requests["a1"].block_ids
    u = d.update(d.schedule(), report=done("a1", bad=(table[1],)))
    bad = dataclasses.replace(u, post=with_request(u.post, "a1", num_computed_tokens=10))
    return Case(
        "LOAD-FAILURE", u, bad, "not cut to the first bad block", "a1", expected=4, actual=10
    )


def _with_hash(state: State, block: int, value: int) -> tuple[Any, ...]:
    hashes = list(state.kv.block_hashes)
    hashes[block] = value
    return tuple(hashes)


@pytest.mark.parametrize("build", cases.params())
def test_connector_invariant_holds_on_the_real_transition(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_connector_invariant_fires_on_the_corrupted_one(build: CaseBuilder) -> None:
    assert_caught(build())


def test_every_connector_invariant_has_a_case() -> None:
    ids = {i for i in CATALOGUE if i.startswith(("LOAD-", "CONNECTOR-"))}
    assert ids == cases.ids()


# ------------------------------------------------------------ the corners


def test_the_connector_corners_are_counted_where_they_happen() -> None:
    from schedspec.properties import corners

    counts: dict[str, int] = {}
    d = driver(kv_load_failure_policy="recompute")
    d.add("a1", prompt=tokens(1, 12), max_tokens=3, remote_kv=RemoteKV(10))
    d.add("a2", prompt=tokens(100, 8), max_tokens=3, remote_kv=RemoteKV(8))
    d.add("p1", prompt=tokens(200, 6), max_tokens=1, remote_kv=RemoteKV(0, send_on_finish=True))
    park = d.schedule()
    corners.count_schedule(counts, park)
    assert counts.get("load-in-progress") == 1
    table = park.post.requests["a1"].block_ids
    landed = d.update(park, report=done("a1", bad=(table[1],)))
    corners.count_update(counts, landed)
    assert counts.get("load-failed") == 1
    assert counts.get("send-delayed") == 1  # p1 ran its one token and finished
    before = d.state
    d.abort("a2")
    corners.count_abort_in_flight(counts, [], ("a2",), before)
    assert counts.get("abort-while-loading") == 1
    quiet: dict[str, int] = {}
    plain = driver()
    plain.add("r", prompt=tokens(1, 8))
    scheduled = plain.schedule()
    corners.count_schedule(quiet, scheduled)
    corners.count_update(quiet, plain.update(scheduled))
    assert not {"load-in-progress", "load-failed", "send-delayed"} & set(quiet)
