"""The reference scheduler's side of the KV connector (docs/SPEC.md, "The KV connector").

vLLM 0.34.0's rules, one method each: parking an async load, the reservation that keeps
admitted loads finishable, promotion on the worker's report, block-level and
request-level load failures under both policies, and finished requests whose blocks
wait for a send or for a load aborted in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from schedspec.reference.sizing import cdiv
from schedspec.reference.vllm.kv_cache_manager import BLOCK_ID, KVCacheManager
from schedspec.reference.vllm.request_queue import WaitingQueue, make_waiting_queue
from schedspec.spec import OutputError, Request, RequestStatus, SchedulerConfig
from schedspec.spec.connector import (
    ConnectorModel,
    ConnectorState,
    HeldBlocks,
    HoldReason,
    KVConnectorOutput,
    LoadPhase,
)

_PARKED = RequestStatus.WAITING_FOR_REMOTE_KVS


def holds_blocks(request: Request) -> bool:
    """A waiting request that holds blocks: a parked load, or a promoted one that is
    not admitted yet (vLLM's _holds_kv_blocks)."""
    return request.num_computed_tokens > 0 or request.status is _PARKED


class KVLoads:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.connector = ConnectorModel()
        # kv_holding_waiting: requests that hold blocks while they wait. Admission
        # drains it before the other queues.
        self.holding: WaitingQueue = make_waiting_queue(config.policy)
        # async_kv_waiting (only under max_num_inflight_kv_loads): fresh requests whose
        # connector may load them async; they may start a load while the batch is full.
        self.async_waiting: WaitingQueue = make_waiting_queue(config.policy)
        self.received: set[str] = set()  # parked loads the worker reported finished
        self.failed: set[str] = set()  # ...reported failed, to recover at promotion
        # Blocks each parked load still needs for its whole sequence, fixed when it
        # parks and refreshed at promotion (the only points where its blocks change).
        self.parked_reservations: dict[str, int] = {}
        # Admitted requests still prefilling, and promoted loads until their prefill
        # ends: their remaining blocks are reserved against new async loads too.
        self.inflight_prefills: dict[str, Request] = {}
        self.aborted_loads: set[str] = set()  # aborted in flight, blocks still written
        # The loads max_num_inflight_kv_loads counts (vLLM's fetch stages in_progress and
        # completed_waiting): from the park, through the report and the promotion, until
        # the request runs, finishes, or looks its KV up again (a failed load that kept
        # nothing). Kept as a set, not read off the holding queue: a load started or
        # passed over earlier in the same waiting phase is out of that queue until the
        # phase ends, and vLLM counts it all the same.
        self.counted_loads: set[str] = set()
        self.held: dict[str, tuple[Request, HoldReason]] = {}
        self.spec_decode_step_blocks = (
            cdiv(1 + config.num_speculative_tokens + config.lookahead_tokens, config.block_size)
            if config.num_speculative_tokens
            else 0
        )

    # ------------------------------------------------------------- admission

    def remaining_blocks(self, request: Request) -> int:
        """Blocks the request still needs to hold its whole sequence (and, with drafts,
        one verify step past it): what a reservation keeps free for it."""
        config = self.config
        num_tokens = min(request.num_tokens, config.max_model_len)
        if config.num_speculative_tokens:
            num_tokens += 1 + config.num_speculative_tokens + config.lookahead_tokens
        held = len(self.kv.req_to_blocks.get(request.request_id, ()))
        return max(cdiv(num_tokens, config.block_size) - held, 0)

    def reserved_blocks(self, request: Request) -> int:
        """What a new async load of `request` must leave free: every other parked load's
        reservation, every in-flight prefill's remaining blocks, and one verify step of
        drafts. Not its own reservation: a load that failed with nothing valid keeps the
        one its promotion set, and vLLM (0.33.0 and 0.34.0) counts it against the
        retry's load (docs/FINDINGS.md F5), which then never fits a pool that holds it
        once."""
        own = self.parked_reservations.get(request.request_id, 0)
        return (
            sum(self.parked_reservations.values())
            - own
            + sum(self.remaining_blocks(r) for r in self.inflight_prefills.values())
            + self.spec_decode_step_blocks
        )

    def admits_inflight_load(self) -> bool:
        """Whether another async load stays within max_num_inflight_kv_loads: loads in
        progress, received and not running yet, and aborted in flight all count."""
        limit = self.config.max_num_inflight_kv_loads
        if limit is None:
            return True
        return len(self.counted_loads) + len(self.aborted_loads) < limit

    def park(self, request: Request, num_computed: int) -> None:
        """An async load was allocated: the request waits for its KV, holding blocks."""
        request.status = _PARKED
        request.num_computed_tokens = num_computed
        self.reserve_parked(request)
        self.counted_loads.add(request.request_id)

    def on_lookup(self, request: Request) -> None:
        """The connector answered a lookup for the request: whatever load it had is no
        longer counted (a new one counts once it parks)."""
        self.counted_loads.discard(request.request_id)

    def reserve_parked(self, request: Request) -> None:
        self.parked_reservations[request.request_id] = self.remaining_blocks(request)

    def on_admitted(self, request: Request, num_new_tokens: int) -> None:
        """A request joins running: it is an in-flight prefill if this chunk does not end
        its prefill, or if it was a parked load; its parked reservation ends."""
        rid = request.request_id
        still_prefilling = request.num_computed_tokens + num_new_tokens < request.num_tokens
        if still_prefilling or rid in self.parked_reservations:
            self.inflight_prefills[rid] = request
        self.parked_reservations.pop(rid, None)
        self.counted_loads.discard(rid)

    def on_scheduled(self, request: Request) -> None:
        """After schedule(): a request whose prefill ended is no longer in flight."""
        if not request.is_prefill_chunk:
            self.inflight_prefills.pop(request.request_id, None)

    def forget(self, request: Request) -> None:
        """Preempted or finished: nothing to reserve for it any more."""
        self.inflight_prefills.pop(request.request_id, None)
        self.parked_reservations.pop(request.request_id, None)
        self.counted_loads.discard(request.request_id)

    def is_ready(self, request: Request) -> bool:
        """A parked load may be promoted once the worker reported it."""
        return request.request_id in self.received

    def promote(self, request: Request) -> None:
        """The load is in: cache what it brought (a failed load, only its valid prefix; a
        load with nothing valid gives its blocks back), and leave the last token to
        compute. The request waits on as WAITING or PREEMPTED, holding its blocks."""
        rid = request.request_id
        if rid in self.failed:
            self.failed.discard(rid)
            if request.num_computed_tokens > 0:
                self.kv.cache_blocks(request, request.num_computed_tokens)
            else:
                self.kv.free(request)
        else:
            self.kv.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens -= 1  # its logits are what the next step is for
        self.received.discard(rid)
        self.reserve_parked(request)
        request.status = (
            RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        )

    # ---------------------------------------------------------------- finish

    def finished(self, request: Request, delay_free: bool) -> bool:
        """request_finished, exactly once per finished request and before any free; the
        blocks passed are those covering its computed tokens. Returns whether the blocks
        stay (a send, or a load still writing them), holding them if so."""
        rid = request.request_id
        self.forget(request)
        table = self.kv.req_to_blocks.get(rid, [])
        computed_blocks = cdiv(request.num_computed_tokens, self.config.block_size)
        block_ids = tuple(map(BLOCK_ID, table[:computed_blocks]))
        normal = request.status in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH_CAPPED,
        )
        sends = self.connector.request_finished(rid, request.remote_kv, normal, block_ids)
        if delay_free or sends:
            self.held[rid] = (request, "loading" if delay_free else "sending")
            return True
        return False

    def abort_parked(self, request: Request) -> bool:
        """An abort of a parked load: its blocks stay while the transfer is still in
        flight (the worker writes into them), until the load reports."""
        rid = request.request_id
        in_flight = rid not in self.received
        self.received.discard(rid)
        self.failed.discard(rid)
        if in_flight:
            self.aborted_loads.add(rid)
        return in_flight

    def release(self, request_id: str) -> None:
        request, _ = self.held.pop(request_id)
        self.aborted_loads.discard(request_id)
        self.kv.free(request)

    # --------------------------------------------------------------- reports

    def check_report(self, report: KVConnectorOutput, live: Mapping[str, Request]) -> None:
        """Refuse, before any change, a report of a transfer the engine is not waiting
        for: a load done or failed of a request not parked (or aborted while loading), a
        send of a request the connector does not hold for one (vLLM asserts halfway)."""

        def held_for(rid: str, reason: HoldReason) -> bool:
            return rid in self.held and self.held[rid][1] == reason

        def parked(rid: str) -> bool:
            return rid in live and live[rid].status is _PARKED

        def loading(rid: str) -> bool:
            return parked(rid) or held_for(rid, "loading")

        def sending(rid: str) -> bool:
            return held_for(rid, "sending")

        expected: dict[str, Callable[[str], bool]] = {
            "finished_recving": loading,
            "failed_recving": parked,
            "finished_sending": sending,
        }
        for name, waited_for in expected.items():
            unexpected = sorted(rid for rid in getattr(report, name) if not waited_for(rid))
            if unexpected:
                raise OutputError(
                    f"kv_connector_output.{name}",
                    f"request {unexpected[0]!r} has no such transfer in flight",
                )
        report.check_block_ids(self.config.num_blocks)

    def failed_requests(self, report: KVConnectorOutput) -> set[str]:
        """Apply the report's failures to the parked loads. Under "recompute" each
        affected load keeps its valid prefix (a request-level failure keeps nothing) and
        is marked to recover at promotion; under "fail" the affected loads are returned,
        to be finished with an error."""
        parked = [r for r in self.holding if r.status is _PARKED]
        affected: set[str] = set()
        for request in parked:
            if request.request_id in report.failed_recving:
                affected.add(request.request_id)
                if self.config.kv_load_failure_policy == "recompute":
                    request.num_computed_tokens = 0
        affected |= self._truncate_at_invalid_blocks(parked, report.invalid_block_ids)
        if self.config.kv_load_failure_policy == "recompute":
            self.failed |= affected
            return set()
        return affected

    def _truncate_at_invalid_blocks(
        self, parked: list[Request], invalid: frozenset[int]
    ) -> set[str]:
        """Each parked load's computed tokens end at its first invalid block; a block two
        loads share is recomputed by the first of them only."""
        if not invalid:
            return set()
        affected: set[str] = set()
        marked: set[int] = set()
        block_size = self.config.block_size
        for request in parked:
            table = self.kv.req_to_blocks.get(request.request_id, [])
            base = request.num_computed_tokens
            truncated = False
            hit = False
            for index, block in enumerate(table[: cdiv(base, block_size)]):
                if block.block_id not in invalid:
                    continue
                hit = True
                if block.block_id in marked:
                    continue
                marked.add(block.block_id)
                if not truncated:
                    truncated = True
                    request.num_computed_tokens = index * block_size
            if hit:
                affected.add(request.request_id)
        return affected

    def land_transfers(self, report: KVConnectorOutput, live: dict[str, Request]) -> None:
        """Completed loads: a parked one becomes promotable; one whose request finished
        meanwhile (aborted, or failed under "fail") frees its blocks. Completed sends
        free theirs."""
        self.connector.update_connector_output(report)
        for rid in sorted(report.finished_recving):
            request = live.get(rid)
            if request is not None and request.status is _PARKED:
                self.received.add(rid)
            elif rid in self.held and self.held[rid][1] == "loading":
                self.release(rid)
        for rid in sorted(report.finished_sending):
            if rid in self.held and self.held[rid][1] == "sending":
                self.release(rid)

    # ------------------------------------------------------------ inspection

    def waiting_requests(self) -> Iterator[Request]:
        yield from self.holding
        yield from self.async_waiting

    def snapshot(self, waiting: Iterable[Request]) -> ConnectorState:
        """The connector's part of the state; `waiting`: every waiting request."""
        loads: dict[str, LoadPhase] = {}
        tables = self.kv.req_to_blocks
        for request in waiting:
            rid = request.request_id
            if request.status is not _PARKED:
                # In, and waiting for admission with the blocks it loaded (a whole
                # one-token prompt's load left nothing computed, and holds its block).
                if tables.get(rid):
                    loads[rid] = "promoted"
            elif rid in self.failed:
                loads[rid] = "failed"
            elif rid in self.received:
                loads[rid] = "received"
            else:
                loads[rid] = "loading"
        held = {
            rid: HeldBlocks(tuple(map(BLOCK_ID, tables.get(rid, ()))), reason)
            for rid, (_, reason) in self.held.items()
        }
        return ConnectorState(loads, held, tuple(self.connector.finished_calls))
