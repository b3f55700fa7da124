"""Is what an engine returned readable at all? The adapter protocol's shapes, checked.

The invariants judge what an engine's State and SchedulerOutput say; they take for
granted that those are well formed: ints where the spec has ints, block ids inside the
pool, queues naming known requests, a step scheduling requests that exist. A lying
adapter can break that, and an invariant then fails on a KeyError of its own, which
would read as a bug in schedspec. CheckedEngine therefore asks malformed() about what
the engine returned whenever the harness raises outside an engine call: a malformed
return makes it the engine's error (EngineContractError); a well-formed one leaves it
the harness's. Checked only on that path, so the hot loop pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from schedspec.spec import (
    CachedRequestData,
    KVState,
    NewRequestData,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
    shown,
)

_INT_FIELDS = (
    "priority",
    "arrival",
    "num_computed_tokens",
    "num_preemptions",
    "max_tokens",
    "num_in_flight_tokens",
    "num_output_placeholders",
    "num_stale_output_tokens",
)
_TOKEN_FIELDS = ("prompt_token_ids", "output_token_ids", "spec_token_ids", "stop_token_ids")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(values: object) -> bool:
    return isinstance(values, tuple) and all(_is_int(v) for v in values)


def _block_ids(values: object, num_blocks: int) -> bool:
    return isinstance(values, tuple) and all(_is_int(b) and 0 <= b < num_blocks for b in values)


def malformed_state(state: object) -> str | None:
    """What is wrong with a snapshot's shape, or None if it is a well-formed State."""
    if not isinstance(state, State):
        return f"is a {type(state).__name__}, not a State"
    if not isinstance(state.config, SchedulerConfig):
        return f"has config {shown(state.config)}, not a SchedulerConfig"
    kv = state.kv
    if not isinstance(kv, KVState):
        return f"has kv {shown(kv)}, not a KVState"
    found = _malformed_kv(kv)
    if found is not None:
        return found
    if not isinstance(state.requests, Mapping):
        return f"has requests {shown(state.requests)}, not a mapping"
    for rid, request in state.requests.items():
        found = _malformed_request(rid, request, kv.num_blocks)
        if found is not None:
            return found
    for name in ("waiting", "running"):
        queue = getattr(state, name)
        if not isinstance(queue, tuple):
            return f"has {name} {shown(queue)}, not a tuple of request ids"
        strangers = [rid for rid in queue if rid not in state.requests]
        if strangers:
            return f"has {name} naming {shown(strangers[0])}, which is not in requests"
    return None


def _malformed_kv(kv: KVState) -> str | None:
    n = kv.num_blocks
    if not _is_int(n) or n < 1:
        return f"has kv.num_blocks {shown(n)}, not an int >= 1"
    if not _block_ids(kv.free_block_ids, n):
        return f"has kv.free_block_ids {shown(kv.free_block_ids)}: not block ids in [0, {n})"
    if not _ints(kv.ref_counts) or len(kv.ref_counts) != n:
        return f"has kv.ref_counts {shown(kv.ref_counts)}: not {n} ints"
    if not isinstance(kv.block_hashes, tuple) or len(kv.block_hashes) != n:
        return f"has kv.block_hashes {shown(kv.block_hashes)}: not {n} entries"
    if not isinstance(kv.prefix_cache, tuple):
        return f"has kv.prefix_cache {shown(kv.prefix_cache)}, not a tuple"
    for entry in kv.prefix_cache:
        if not (isinstance(entry, tuple) and len(entry) == 2 and _block_ids(entry[1], n)):
            return f"has a kv.prefix_cache entry {shown(entry)}: not (hash, block ids)"
    return None


def _malformed_request(rid: object, request: object, num_blocks: int) -> str | None:
    if not isinstance(rid, str):
        return f"has a request keyed {shown(rid)}, not a string id"
    if not isinstance(request, RequestState):
        return f"has requests[{rid!r}] {shown(request)}, not a RequestState"
    if request.request_id != rid:
        return f"has requests[{rid!r}] with request_id {shown(request.request_id)}"
    for name in _INT_FIELDS:
        if not _is_int(getattr(request, name)):
            return f"has requests[{rid!r}].{name} {shown(getattr(request, name))}, not an int"
    for name in _TOKEN_FIELDS:
        if not _ints(getattr(request, name)):
            return (
                f"has requests[{rid!r}].{name} {shown(getattr(request, name))}: not a tuple of ints"
            )
    if not isinstance(request.status, RequestStatus):
        return f"has requests[{rid!r}].status {shown(request.status)}, not a RequestStatus"
    if not _block_ids(request.block_ids, num_blocks):
        return (
            f"has requests[{rid!r}].block_ids {shown(request.block_ids)}: not block ids in "
            f"[0, {num_blocks})"
        )
    return None


def malformed_output(output: object, state: State | None = None) -> str | None:
    """What is wrong with a schedule() result's shape (and, given the state right after
    the call, which ids it names that the state does not have), or None."""
    if not isinstance(output, SchedulerOutput):
        return f"is a {type(output).__name__}, not a SchedulerOutput"
    counts = output.num_scheduled_tokens
    if not isinstance(counts, Mapping) or not all(
        isinstance(k, str) and _is_int(v) for k, v in counts.items()
    ):
        return f"has num_scheduled_tokens {shown(counts)}: not a mapping of ids to ints"
    if not _is_int(output.total_num_scheduled_tokens):
        return f"has total_num_scheduled_tokens {shown(output.total_num_scheduled_tokens)}"
    spec = output.scheduled_spec_decode_tokens
    if not isinstance(spec, Mapping) or not all(
        isinstance(k, str) and isinstance(v, tuple) and all(_is_int(t) for t in v)
        for k, v in spec.items()
    ):
        return f"has scheduled_spec_decode_tokens {shown(spec)}: not ids to tuples of ints"
    for name in ("preempted_req_ids", "finished_req_ids"):
        ids = getattr(output, name)
        if not isinstance(ids, frozenset | set) or not all(isinstance(i, str) for i in ids):
            return f"has {name} {shown(ids)}: not a set of ids"
    found = _malformed_records(output.scheduled_new_reqs, NewRequestData, "scheduled_new_reqs")
    found = found or _malformed_records(
        output.scheduled_cached_reqs, CachedRequestData, "scheduled_cached_reqs"
    )
    if found is not None:
        return found
    if state is not None:
        named: Iterable[Any] = [*counts, *spec, *output.preempted_req_ids]
        strangers = [rid for rid in named if rid not in state.requests]
        if strangers:
            return f"names {shown(strangers[0])}, which the engine's own state does not have"
        listed = {r.request_id for r in output.scheduled_new_reqs}
        listed |= {r.request_id for r in output.scheduled_cached_reqs}
        unlisted = [rid for rid in counts if rid not in listed]
        if unlisted:
            return f"schedules {shown(unlisted[0])} without a new or cached record of it"
    return None


def _malformed_records(records: object, kind: type, name: str) -> str | None:
    if not isinstance(records, tuple) or not all(isinstance(r, kind) for r in records):
        return f"has {name} {shown(records)}: not a tuple of {kind.__name__}"
    for record in records:
        if isinstance(record, NewRequestData):
            ok = _ints(record.prompt_token_ids) and _ints(record.block_ids)
            ok = ok and _is_int(record.num_computed_tokens)
        else:
            ok = isinstance(record.resumed, bool) and _ints(record.new_block_ids)
            ok = ok and _is_int(record.num_computed_tokens) and _is_int(record.num_output_tokens)
        if not isinstance(record.request_id, str) or not ok:
            return f"has a {name} record {shown(record)} with a field of the wrong type"
    return None
