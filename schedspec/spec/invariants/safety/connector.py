"""The KV connector's invariants (docs/SPEC.md, "The KV connector"): what any engine with
a connector keeps, on every path a load or a send can take."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.connector import ConnectorState, KVConnectorOutput
from schedspec.spec.invariants.registry import Violation, invariant, or_absent
from schedspec.spec.invariants.transitions import (
    AbortTransition,
    ScheduleTransition,
    UpdateTransition,
)
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import State

_PARKED = RequestStatus.WAITING_FOR_REMOTE_KVS
_EMPTY = ConnectorState()


def _connector(state: State) -> ConnectorState:
    return state.connector if state.connector is not None else _EMPTY


@invariant(
    "LOAD-PARKED",
    "state",
    "safety",
    "A request parked for a KV load (WAITING_FOR_REMOTE_KVS) waits, holds blocks covering "
    "its computed tokens, and has no drafts and nothing in flight; the connector lists "
    "exactly the parked and the promoted-not-yet-running loads, each waiting; a promoted "
    "one is WAITING or PREEMPTED with computed tokens its blocks cover; a finished "
    "request held by the connector is no longer live.",
)
def check_load_parked(state: State) -> list[Violation]:
    connector = _connector(state)
    out: list[Violation] = []
    waiting = set(state.waiting)
    size = state.config.block_size
    for rid, request in state.requests.items():
        phase = connector.loads.get(rid)
        parked = request.status is _PARKED
        if parked and phase not in ("loading", "received", "failed"):
            out.append(
                Violation(
                    "LOAD-PARKED",
                    f"parked but listed as {phase!r}",
                    rid,
                    expected="loading, received or failed",
                    actual=or_absent(phase, "not listed"),
                )
            )
        if phase == "promoted" and request.status not in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            out.append(
                Violation(
                    "LOAD-PARKED",
                    f"promoted load is {request.status.name}",
                    rid,
                    expected="WAITING or PREEMPTED",
                    actual=request.status.name,
                )
            )
        if phase is None and not parked:
            continue
        if rid not in waiting:
            out.append(
                Violation(
                    "LOAD-PARKED",
                    "a load that is not waiting",
                    rid,
                    expected="waiting",
                    actual=state.queue_of(rid),
                )
            )
        if len(request.block_ids) * size < request.num_computed_tokens:
            out.append(
                Violation(
                    "LOAD-PARKED",
                    "blocks do not cover the loaded tokens",
                    rid,
                    None,
                    expected=request.num_computed_tokens,
                    actual=len(request.block_ids) * size,
                )
            )
        if request.spec_token_ids or request.num_in_flight_tokens:
            out.append(
                Violation(
                    "LOAD-PARKED",
                    "a load with drafts or tokens in flight",
                    rid,
                    expected=(0, 0),
                    actual=(len(request.spec_token_ids), request.num_in_flight_tokens),
                )
            )
    for rid in connector.loads:
        if rid not in state.requests:
            out.append(
                Violation(
                    "LOAD-PARKED",
                    "a load of no live request",
                    rid,
                    expected="live",
                    actual="not live",
                )
            )
    for rid in connector.held:
        if rid in state.requests:
            out.append(
                Violation(
                    "LOAD-PARKED",
                    "held for the connector but still live",
                    rid,
                    expected="finished",
                    actual=state.requests[rid].status.name,
                )
            )
    return out


def _newly_cached_by_loads(pre: State, post: State, name: str) -> list[Violation]:
    """Blocks that gained a prefix-cache registration while only parked loads hold them
    (a block another request computes may be registered by it, and hit by a load)."""
    before = pre.kv.block_hashes
    after = post.kv.block_hashes
    parked = [(rid, r) for rid, r in post.requests.items() if r.status is _PARKED]
    # Nothing parked, or no block's hash changed (most steps): no block to report.
    if not parked or before == after:
        return []
    computing = {
        block
        for request in post.requests.values()
        if request.status is not _PARKED
        for block in request.block_ids
    }
    out: list[Violation] = []
    for rid, request in parked:
        for block in request.block_ids:
            if not 0 <= block < min(len(before), len(after)) or block in computing:
                continue  # CONSERVATION reports ids out of range
            if after[block] is not None and before[block] != after[block]:
                out.append(
                    Violation(
                        name,
                        "a block cached before its load is in",
                        rid,
                        block,
                        expected=or_absent(before[block], "no hash"),
                        actual=after[block],
                    )
                )
    return out


@invariant(
    "LOAD-UNCACHED",
    "schedule",
    "safety",
    "schedule() caches no block that only parked loads hold: the load's KV is not there "
    "yet, and a prefix hit on it would read garbage.",
)
def check_load_uncached(t: ScheduleTransition) -> list[Violation]:
    return _newly_cached_by_loads(t.pre, t.post, "LOAD-UNCACHED")


@invariant(
    "LOAD-UNCACHED-UPDATE",
    "update",
    "safety",
    "update_from_output() caches no block that only parked loads hold.",
)
def check_load_uncached_update(t: UpdateTransition) -> list[Violation]:
    return _newly_cached_by_loads(t.pre, t.post, "LOAD-UNCACHED-UPDATE")


@invariant(
    "LOAD-PROMOTION",
    "schedule",
    "safety",
    "A load is promoted only after the worker reported it: a request parked with no report "
    "is still parked after schedule() (or gone). A promoted load claims no more computed "
    "tokens than it loaded, and leaves at least the last token to compute.",
)
def check_load_promotion(t: ScheduleTransition) -> list[Violation]:
    pre_loads = _connector(t.pre).loads
    out: list[Violation] = []
    for rid, phase in pre_loads.items():
        after = t.post.requests.get(rid)
        before = t.pre.requests.get(rid)
        if after is None or before is None or before.status is not _PARKED:
            continue
        if after.status is _PARKED:
            continue
        if phase == "loading":
            out.append(
                Violation(
                    "LOAD-PROMOTION",
                    "promoted with its load not reported",
                    rid,
                    expected=_PARKED.name,
                    actual=after.status.name,
                )
            )
            continue
        if phase == "failed":
            continue  # it may look its KV up again and load anew: LOAD-FAILURE set the cut
        computed = t.computed_before.get(rid, after.num_computed_tokens)
        if computed > before.num_computed_tokens or computed >= after.num_tokens:
            out.append(
                Violation(
                    "LOAD-PROMOTION",
                    "promoted with more computed tokens than loaded, or none left to compute",
                    rid,
                    None,
                    expected=min(before.num_computed_tokens, after.num_tokens - 1),
                    actual=computed,
                )
            )
    return out


def _check_calls(
    pre: State, post: State, name: str, failed_loads: Iterable[str] = ()
) -> list[Violation]:
    """request_finished once for each request that left, before its blocks were freed
    (the blocks passed are a prefix of what it held, none only if it had nothing
    computed, or a failed load was cut to nothing), and for no other."""
    cut = set(failed_loads)
    calls = _connector(post).finished_calls
    new_calls = calls[len(_connector(pre).finished_calls) :]
    if pre.connector is None:
        return []
    left = {rid for rid in pre.requests if rid not in post.requests}
    out: list[Violation] = []
    seen: dict[str, int] = {}
    for rid, blocks in new_calls:
        seen[rid] = seen.get(rid, 0) + 1
        before = pre.requests.get(rid)
        if rid not in left or before is None:
            out.append(
                Violation(
                    name,
                    "request_finished for a request that did not finish",
                    rid,
                    expected="a request that left this call",
                    actual="live" if rid in post.requests else "not live before",
                )
            )
            continue
        if tuple(blocks) != before.block_ids[: len(blocks)]:
            out.append(
                Violation(
                    name,
                    "request_finished was not passed the blocks the request held",
                    rid,
                    None,
                    expected=before.block_ids,
                    actual=tuple(blocks),
                )
            )
        elif (
            not blocks
            and before.block_ids
            and before.num_confirmed_computed_tokens > 0
            and rid not in cut
        ):
            out.append(
                Violation(
                    name,
                    "request_finished after the blocks were freed",
                    rid,
                    expected=before.block_ids,
                    actual=tuple(blocks),
                )
            )
    for rid in sorted(left):
        if seen.get(rid, 0) != 1:
            out.append(
                Violation(
                    name,
                    "request_finished not called exactly once",
                    rid,
                    None,
                    expected=1,
                    actual=seen.get(rid, 0),
                )
            )
    return out


def _check_held(
    pre: State, post: State, name: str, report: KVConnectorOutput | None
) -> list[Violation]:
    """The connector holds a finished request's blocks only for a load aborted in flight
    or a send it asked for, unchanged until the worker reports, and frees them then."""
    before = _connector(pre).held
    after = _connector(post).held
    out: list[Violation] = []
    reported = report.finished_recving if report is not None else frozenset()
    for rid, phase in _connector(pre).loads.items():
        ended = rid not in post.requests and rid not in after
        if phase == "loading" and ended and rid not in reported:
            # The worker still writes into them (vLLM #46283's class, the other way).
            out.append(
                Violation(
                    name,
                    "a load in flight ended with its blocks freed",
                    rid,
                    expected="blocks held until the worker reports",
                    actual="freed",
                )
            )
    for rid, held in after.items():
        old = before.get(rid)
        if old is not None:
            if old != held:
                out.append(
                    Violation(
                        name,
                        "held blocks changed while held",
                        rid,
                        expected=old,
                        actual=held,
                    )
                )
            continue
        request = pre.requests.get(rid)
        if request is None:
            out.append(
                Violation(
                    name,
                    "held blocks of a request that was not live",
                    rid,
                    expected="live before the call",
                    actual="not live",
                )
            )
        elif held.block_ids != request.block_ids:
            # Held means not freed: every block it held stays allocated for the worker.
            out.append(
                Violation(
                    name,
                    "held, but not the blocks it held (some were freed)",
                    rid,
                    None,
                    expected=request.block_ids,
                    actual=held.block_ids,
                )
            )
        elif held.reason == "loading" and _connector(pre).loads.get(rid) != "loading":
            out.append(
                Violation(
                    name,
                    "held for a load that is not in flight",
                    rid,
                    expected="loading",
                    actual=_connector(pre).loads.get(rid),
                )
            )
        elif held.reason == "sending" and not (
            request.remote_kv is not None and request.remote_kv.send_on_finish
        ):
            out.append(
                Violation(
                    name,
                    "held for a send it never asked for",
                    rid,
                    expected="send_on_finish",
                    actual=request.remote_kv,
                )
            )
    for rid, held in before.items():
        due = report is not None and rid in (
            report.finished_recving if held.reason == "loading" else report.finished_sending
        )
        if due and rid in after:
            out.append(
                Violation(
                    name,
                    f"still held after the worker reported ({held.reason})",
                    rid,
                    expected="released",
                    actual=after[rid].block_ids,
                )
            )
        if not due and rid not in after:
            out.append(
                Violation(
                    name,
                    f"freed before the worker reported ({held.reason})",
                    rid,
                    expected=held.block_ids,
                    actual="freed",
                )
            )
    return out


@invariant(
    "CONNECTOR-FINISHED",
    "update",
    "safety",
    "update_from_output() calls request_finished exactly once for each request that "
    "finishes, before its blocks are freed, and for no other; the connector holds a "
    "finished request's blocks only for a send it asked for or a load aborted in flight, "
    "and frees held blocks exactly when the worker reports them.",
)
def check_connector_finished(t: UpdateTransition) -> list[Violation]:
    if t.pre.connector is None:
        return []
    report = t.model_output.kv_connector_output
    failed = [rid for rid in t.pre.requests if ended_by_failed_load(t, rid)]
    return _check_calls(t.pre, t.post, "CONNECTOR-FINISHED", failed) + _check_held(
        t.pre, t.post, "CONNECTOR-FINISHED", report
    )


@invariant(
    "CONNECTOR-FINISHED-ABORT",
    "abort",
    "safety",
    "An abort calls request_finished exactly once for each request it finishes, before its "
    "blocks are freed; a load aborted in flight keeps its blocks until the worker reports, "
    "one whose load already reported frees them now.",
)
def check_connector_finished_abort(t: AbortTransition) -> list[Violation]:
    if t.pre.connector is None:
        return []
    return _check_calls(t.pre, t.post, "CONNECTOR-FINISHED-ABORT") + _check_held(
        t.pre, t.post, "CONNECTOR-FINISHED-ABORT", None
    )


@invariant(
    "LOAD-FAILURE",
    "update",
    "safety",
    "A failed load (failed_recving, or a bad block) under the 'fail' policy finishes its "
    "request with an error in this update; under 'recompute' the request stays parked, "
    "marked failed, with its computed tokens cut to its first bad block (to 0 for a "
    "failed_recving). A load reported done without failure is promotable (received).",
)
def check_load_failure(t: UpdateTransition) -> list[Violation]:
    report = t.model_output.kv_connector_output
    if report is None or t.pre.connector is None:
        return []
    out: list[Violation] = []
    size = t.pre.config.block_size
    policy = t.pre.config.kv_load_failure_policy
    post_loads = _connector(t.post).loads
    for rid, phase in _connector(t.pre).loads.items():
        before = t.pre.requests.get(rid)
        if phase != "loading" or before is None or rid not in report.finished_recving:
            continue
        bad = [
            i
            for i, block in enumerate(before.block_ids[: cdiv(before.num_computed_tokens, size)])
            if block in report.invalid_block_ids
        ]
        failed = rid in report.failed_recving or bool(bad)
        after = t.post.requests.get(rid)
        if not failed:
            if after is not None and post_loads.get(rid) != "received":
                out.append(
                    Violation(
                        "LOAD-FAILURE",
                        "reported done but not promotable",
                        rid,
                        expected="received",
                        actual=post_loads.get(rid),
                    )
                )
            continue
        if policy == "fail":
            if after is not None:
                out.append(
                    Violation(
                        "LOAD-FAILURE",
                        "a failed load's request lives on",
                        rid,
                        expected="ended (policy fail)",
                        actual=after.status.name,
                    )
                )
            continue
        expected = 0 if rid in report.failed_recving else bad[0] * size
        if after is None or post_loads.get(rid) != "failed":
            out.append(
                Violation(
                    "LOAD-FAILURE",
                    "a failed load is not marked to recompute",
                    rid,
                    expected="failed",
                    actual="not live" if after is None else post_loads.get(rid),
                )
            )
        elif after.num_computed_tokens != expected:
            out.append(
                Violation(
                    "LOAD-FAILURE",
                    "computed tokens not cut to the first bad block",
                    rid,
                    None,
                    expected=expected,
                    actual=after.num_computed_tokens,
                )
            )
    return out


def is_load(pre: State, post: State, request_id: str) -> bool:
    """Is the request a KV connector load on either side of the transition (parked, or
    promoted and not running yet)? Its blocks and computed tokens move outside any step
    (parking, promotion, a failure): LOAD-* judge those moves, not the step checks."""
    # Spelled out rather than any() over a generator: the step checks ask this of every
    # request on every step, and most configs have no connector at all.
    before, after = pre.connector, post.connector
    return (before is not None and request_id in before.loads) or (
        after is not None and request_id in after.loads
    )


def connector_in_play(pre: State, post: State) -> bool:
    """Could the KV connector have shaped this transition's admissions? A request with
    remote KV waits, or a load or a held table exists on either side. The vllm-v1
    profile's admission arithmetic does not model the connector's lookups, parking and
    reservations (docs/FORMAL.md, "What is left free"): it stands aside then, and the
    safety profile's LOAD-* and CONNECTOR-* invariants judge."""
    if not pre.config.kv_connector:
        return False
    for state in (pre, post):
        connector = state.connector
        if connector is not None and (connector.loads or connector.held):
            return True
        for rid in state.waiting:
            remote = state.requests[rid].remote_kv
            if remote is not None and remote.num_tokens > 0:
                return True
    return False


def ended_by_failed_load(t: UpdateTransition, request_id: str) -> bool:
    """Did this update end the request because its load failed (the 'fail' policy)?
    It samples nothing and leaves with an error (LOAD-FAILURE judges it)."""
    report = t.model_output.kv_connector_output
    before = t.pre.requests.get(request_id)
    if report is None or before is None or t.pre.config.kv_load_failure_policy != "fail":
        return False
    if _connector(t.pre).loads.get(request_id) != "loading" or request_id in t.post.requests:
        return False
    return request_id in report.failed_recving or any(
        block in report.invalid_block_ids for block in before.block_ids
    )


ScheduleCheck = Callable[[ScheduleTransition], list[Violation]]


def stands_aside_for_connector(check: ScheduleCheck) -> ScheduleCheck:
    """A vllm-v1 admission check that does not model the KV connector's lookups, parking
    and queues: it holds nothing to account where the connector is in play
    (connector_in_play; docs/FORMAL.md lists them), and judges every other step."""

    @functools.wraps(check)
    def judged(t: ScheduleTransition) -> list[Violation]:
        if connector_in_play(t.pre, t.post):
            return []
        return check(t)

    return judged
