"""The KV connector's worker side, played by the harness (docs/SPEC.md, "The KV connector").

A step's KVTransfers name requests, and failed blocks by their index in a request's
table, so that a trace means the same on every engine. At the landing the harness turns
them into the engine's KVConnectorOutput, from the engine's own state: it keeps only
what the engine is waiting for (a report for anything else would be a worker bug, not
the scheduler's), and a failed load is reported done as well, as vLLM's workers do.
In a drain the worker reports every transfer it ever will: all loads in flight done,
all sends done but those that never finish.
"""

from __future__ import annotations

from schedspec.engines.events import AddRequest, KVTransfers
from schedspec.spec import KVConnectorOutput, RemoteKV, State


def loads_in_flight(state: State) -> list[str]:
    """Requests whose load the worker still writes: parked with no report yet, or
    aborted while loading (their blocks held until the load reports)."""
    connector = state.connector
    if connector is None:
        return []
    parked = [rid for rid, phase in connector.loads.items() if phase == "loading"]
    aborted = [rid for rid, held in connector.held.items() if held.reason == "loading"]
    return parked + aborted


def sends_pending(state: State, never_finish: frozenset[str]) -> list[str]:
    """Finished requests whose blocks wait for a send the worker will report."""
    connector = state.connector
    if connector is None:
        return []
    return [
        rid
        for rid, held in connector.held.items()
        if held.reason == "sending" and rid not in never_finish
    ]


def failed_block_id(state: State, request_id: str, index: int) -> int | None:
    """The engine's id of a parked load's block at this index, if the load brought it:
    within the computed tokens, not cached, held by this request alone (a bad block of
    a local prefix hit would be another request's business too)."""
    request = state.requests.get(request_id)
    connector = state.connector
    if request is None or connector is None or connector.loads.get(request_id) != "loading":
        return None
    size = state.config.block_size
    if not 0 <= index < min(len(request.block_ids), -(-request.num_computed_tokens // size)):
        return None
    block = request.block_ids[index]
    kv = state.kv
    if not 0 <= block < kv.num_blocks or kv.block_hashes[block] is not None:
        return None
    return block if kv.ref_counts[block] == 1 else None


def worker_output(
    transfers: KVTransfers | None, state: State, never_finish: frozenset[str]
) -> KVConnectorOutput | None:
    """The engine's KVConnectorOutput for this landing (None: no connector). transfers
    None: a drain step, in which every transfer that will ever report does."""
    if state.connector is None:
        return None
    loading = loads_in_flight(state)
    pending = sends_pending(state, never_finish)
    if transfers is None:
        return KVConnectorOutput(frozenset(loading), frozenset(), frozenset(), frozenset(pending))
    parked = {rid for rid in loading if rid in state.requests}
    failed = {rid for rid in transfers.loads_failed if rid in parked}
    bad_blocks: set[int] = set()
    bad_loads: set[str] = set()
    for rid, index in transfers.blocks_failed:
        block = failed_block_id(state, rid, index)
        if block is not None:
            bad_blocks.add(block)
            bad_loads.add(rid)
    done = {rid for rid in transfers.loads_done if rid in loading} | failed | bad_loads
    sent = {rid for rid in transfers.sends_done if rid in pending}
    return KVConnectorOutput(
        frozenset(done), frozenset(failed), frozenset(bad_blocks), frozenset(sent)
    )


def reports_pending(state: State, never_finish: frozenset[str]) -> bool:
    """Does the worker still owe this engine a report (a drain goes on until none)?"""
    return bool(loads_in_flight(state) or sends_pending(state, never_finish))


class WorkerClock:
    """The fake remote side's timing, for the state machine: each load reports after its
    RemoteKV's load_steps engine steps in flight (failing as its load_failure says), each
    send after send_steps, a never-finishing send never. The reports it makes are explicit
    KVTransfers in the trace, so the trace replays without it."""

    def __init__(self) -> None:
        self._remote: dict[str, RemoteKV] = {}
        self._waited: dict[str, int] = {}  # transfer -> steps it has been in flight
        # A remote side fails a request's load once: the retry that recompute's re-lookup
        # starts then succeeds (a side that always failed would retry forever).
        self._failed_once: set[str] = set()

    def on_add(self, event: AddRequest) -> None:
        if event.remote_kv is not None:
            self._remote[event.request_id] = event.remote_kv

    def transfers(self, state: State) -> KVTransfers:
        """The reports that land with the next step, and one more step for every
        transfer in flight."""
        if state.connector is None:
            return KVTransfers()
        in_flight = [(rid, "load") for rid in loads_in_flight(state)]
        in_flight += [(rid, "send") for rid in sends_pending(state, frozenset())]
        # A request's load and its send never overlap: its id keys either.
        waited = {rid: self._waited.get(rid, 0) + 1 for rid, _ in in_flight}
        self._waited = waited
        done: list[str] = []
        failed: list[str] = []
        bad_blocks: list[tuple[str, int]] = []
        sent: list[str] = []
        for rid, kind in in_flight:
            remote = self._remote.get(rid)
            if remote is None:
                continue
            if kind == "send":
                if not remote.send_never_finishes and waited[rid] >= remote.send_steps:
                    sent.append(rid)
                continue
            if waited[rid] < remote.load_steps:
                continue
            done.append(rid)
            if remote.load_failure == "none" or rid in self._failed_once:
                continue
            self._failed_once.add(rid)
            if remote.load_failure == "request":
                failed.append(rid)
            else:
                index = first_loaded_block(state, rid)
                if index is not None:
                    bad_blocks.append((rid, index))
        return KVTransfers(tuple(done), tuple(failed), tuple(bad_blocks), tuple(sent))


def first_loaded_block(state: State, request_id: str) -> int | None:
    """The index of the first block a parked load brought (failed_block_id accepts it)."""
    request = state.requests.get(request_id)
    if request is None:
        return None
    for index in range(len(request.block_ids)):
        if failed_block_id(state, request_id, index) is not None:
            return index
    return None
