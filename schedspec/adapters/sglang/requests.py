"""SGLang's requests (its Req objects) as the spec's: their ids, their RequestState, the
running order, and their finish reasons.

Nothing here imports SGLang: the functions read SGLang's objects (typed Any) that the
adapter (adapters/sglang/engine.py) hands them.

Ids. Each request gets the SGLang rid "<arrival>#<spec id>" (`sglang_rid`): SGLang
aborts every request whose rid starts with the aborted one, and no rid starts with
another's "<arrival>#"; `spec_id` translates a rid back.

A request's state (`request_state`): SGLang's prompt and output ids, its allocated KV
length as the computed count (0 unless running), status (a request in the waiting queue
is PREEMPTED once retracted, else WAITING; a request in the running batch, the batch
just formed or the chunked one is RUNNING), retraction count, clipped max_new_tokens
(at least 1), abort_pending when SGLang marked it aborted and will finish it when its
next step lands, the in-flight counters (the adapter kit's Pipeline); what SGLang keeps
in other words (arrival, priority, EOS and stop tokens) as the harness gave it (the
kit's `Given`), the RequestState itself built by the kit (adapters/kit/).

The running order (`running_reqs`) is the order the running batch will have after the
next merge: the running batch, the unmerged requests of the last prefill batch,
requests a queued result is about to finish, then the chunked request.

Finish reasons (`finish_status`): a matched stop token is FINISHED_STOPPED, length
FINISHED_LENGTH_CAPPED, an abort FINISHED_ABORTED; any other (stop strings, regexes,
vocabulary-boundary finishes) needs inputs the harness never gives, and seeing one is
a RuntimeError (an adapter gap).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from schedspec.adapters import kit
from schedspec.adapters.kit import EngineRequest, Given, InFlight
from schedspec.spec import RequestState, RequestStatus

RID_SEPARATOR = "#"
_FINISH_STATUS = {
    "FINISH_MATCHED_TOKEN": RequestStatus.FINISHED_STOPPED,
    "FINISH_LENGTH": RequestStatus.FINISHED_LENGTH_CAPPED,
    "FINISH_ABORT": RequestStatus.FINISHED_ABORTED,
}


def sglang_rid(request_id: str, arrival: int) -> str:
    """The rid the adapter gives SGLang for the request_id's arrival-th request."""
    return f"{arrival}{RID_SEPARATOR}{request_id}"


def spec_id(rid: str) -> str:
    """The spec's request id behind an SGLang rid the adapter made (sglang_rid's inverse)."""
    return rid.partition(RID_SEPARATOR)[2]


def known_tokens(req: Any) -> list[int]:
    """A request's known tokens: its prompt, then its outputs."""
    return [*req.origin_input_ids, *req.output_ids]


def running_reqs(
    scheduler: Any, launched: Iterable[Any], live: Collection[str], last_order: Sequence[str]
) -> list[Any]:
    """The running requests in the order the running batch will have after the next
    merge (the module docstring). launched: the batches in flight; live: the rids of the
    requests the adapter gave SGLang and has not seen finish; last_order: the spec ids
    of the last running order read."""
    s = scheduler
    chunked = s.chunked_req
    placed: dict[str, Any] = {}
    for req in s.running_batch.reqs:
        if not req.finished() and req is not chunked:
            placed.setdefault(req.rid, req)
    last = s.last_batch
    if last is not None and last.forward_mode.is_extend() and last is not s.running_batch:
        for req in last.reqs:
            if not req.finished() and req is not chunked and not req.is_retracted:
                placed.setdefault(req.rid, req)
    # A request a queued result is about to finish by length is out of the running
    # batch but not finished yet (overlap only): in its previous place.
    waiting = {req.rid for req in s.waiting_queue}
    leaving = {
        req.rid: req
        for batch in launched
        for req in batch.reqs
        if not req.finished()
        and req.rid not in placed
        and req.rid not in waiting
        and req is not chunked
        and req.rid in live
    }
    order = {rid: i for i, rid in enumerate(last_order)}
    for rid in sorted(leaving, key=lambda r: order.get(spec_id(r), len(order))):
        placed[rid] = leaving[rid]
    if chunked is not None and not chunked.finished():
        placed.setdefault(chunked.rid, chunked)
    return list(placed.values())


def abort_pending(scheduler: Any, req: Any, finish_abort: type) -> bool:
    """abort_request marked it (to_finish, or the chunked request's deferred abort)
    and it finishes when the next step that runs it lands."""
    return isinstance(req.to_finish, finish_abort) or (scheduler._pending_chunked_abort_req is req)


def request_state(
    req: Any,
    given: Given,
    counters: InFlight,
    *,
    running: bool,
    blocks: tuple[int, ...],
    aborting: bool,
) -> RequestState:
    """The spec's state of SGLang's request `req` (the module docstring)."""
    if running:
        status = RequestStatus.RUNNING
    elif req.retraction_count:
        status = RequestStatus.PREEMPTED
    else:
        status = RequestStatus.WAITING
    engine = EngineRequest(
        output_token_ids=tuple(int(t) for t in req.output_ids),
        num_computed_tokens=req.kv.kv_allocated_len if running else 0,
        status=status,
        block_ids=blocks,
        num_preemptions=int(req.retraction_count),
        prompt_token_ids=tuple(int(t) for t in req.origin_input_ids),
        max_tokens=max(1, int(req.sampling_params.max_new_tokens)),
        abort_pending=aborting,
    )
    return kit.request_state(spec_id(req.rid), given, engine, counters)


def finish_status(reason: Any) -> RequestStatus | None:
    """SGLang's finish reason (None while live) as the spec's status."""
    if reason is None:
        return None
    status = _FINISH_STATUS.get(type(reason).__name__)
    if status is None:
        # Stop strings, regexes and vocabulary-boundary finishes need inputs the
        # harness never gives; seeing one is an adapter gap.
        raise RuntimeError(f"SGLang finish reason {type(reason).__name__}")
    return status


def message(reason: Any) -> str:
    """The text of an SGLang finish reason."""
    found = reason.to_json() if hasattr(reason, "to_json") else reason
    if isinstance(found, dict):
        return str(found.get("message", found))
    return str(found)
