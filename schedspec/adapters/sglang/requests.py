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

from array import array
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
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


def int_tuple(values: Any) -> tuple[int, ...]:
    """SGLang's token ids as ints: an array's items are ints already (SGLang keeps a
    request's prompt and outputs in array('q')), anything else is converted one by one."""
    if isinstance(values, array):
        return tuple(values)
    return tuple(int(t) for t in values)


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
        output_token_ids=int_tuple(req.output_ids),
        num_computed_tokens=req.kv.kv_allocated_len if running else 0,
        status=status,
        block_ids=blocks,
        num_preemptions=int(req.retraction_count),
        prompt_token_ids=int_tuple(req.origin_input_ids),
        max_tokens=max(1, int(req.sampling_params.max_new_tokens)),
        abort_pending=aborting,
    )
    return kit.request_state(spec_id(req.rid), given, engine, counters)


def _copy(values: Any) -> Any:
    """A copy that compares equal to `values` until they change (an array or a list)."""
    return array(values.typecode, values) if isinstance(values, array) else list(values)


@dataclass(frozen=True)
class _Read:
    """What request_state read of one request, and what it made of it."""

    req: Any
    given: Given
    inputs: tuple[Any, ...]
    prompt: Any
    outputs: Any
    state: RequestState


@dataclass
class RequestStates:
    """request_state, read again only for a request something it reads changed in: the
    waiting queue is most of the live requests, and a waiting request changes only when
    it is scheduled, retracted or aborted. Every input is compared with what was read last
    time: the same Req object and Given, its prompt and outputs item for item (copies of them, taken
    at the last read), and every other field and argument, so a state reused is the state
    request_state would build again."""

    _last: dict[str, _Read] = field(default_factory=dict)  # by SGLang rid

    def of(
        self,
        req: Any,
        given: Given,
        counters: InFlight,
        *,
        running: bool,
        blocks: tuple[int, ...],
        aborting: bool,
    ) -> RequestState:
        inputs = (
            counters.tokens,
            counters.placeholders,
            counters.stale,
            counters.drop_stale,
            counters.prefill_chunk,
            running,
            blocks,
            aborting,
            req.kv.kv_allocated_len if running else 0,
            req.retraction_count,
            req.sampling_params.max_new_tokens,
        )
        last = self._last.get(req.rid)
        if (
            last is not None
            and last.req is req
            and last.given is given
            and last.inputs == inputs
            and last.outputs == req.output_ids
            and last.prompt == req.origin_input_ids
        ):
            return last.state
        state = request_state(
            req, given, counters, running=running, blocks=blocks, aborting=aborting
        )
        self._last[req.rid] = _Read(
            req, given, inputs, _copy(req.origin_input_ids), _copy(req.output_ids), state
        )
        return state

    def forget(self, rid: str) -> None:
        self._last.pop(rid, None)


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
