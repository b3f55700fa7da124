"""gpu_impl's BatchedScheduler with B = 1 as an EngineAdapter (`--engine gpu`).

The adapter owns what the spec's types carry and the tensors do not: the
request ids (id <-> slot), the token lists, the finished ids since the last
schedule() and the BLAKE2b hash behind each device content id (the spec
names cached blocks by BLAKE2b; the device by a 64-bit id, see
gpu_impl/hashing.py). It checks model outputs and drafts at the door as
the reference does, then hands the engine tensors, and reads each call's
result back in one go.

The refinement mapping (`snapshot`): per slot the request's fields; the
waiting queue by wait_key, the running list by run_key; the free queue as
the ref-0 blocks by free_key; the prefix-cache map grouped by content id,
holders oldest first. Keys of that map are ordered by their oldest holder
(the reference orders them by when the key was first inserted; they differ
only after the oldest of two holders of one hash is evicted, and no
decision reads that order).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from schedspec.adapters.kit import HashTranslator
from schedspec.engines.capabilities import VLLM_FAMILY_CAPABILITIES, Capability
from schedspec.gpu_impl.batch_state import (
    FINISHED_LENGTH_CAPPED,
    FINISHED_STOPPED,
    NO_HASH,
    NO_TOKEN,
    PREEMPTED,
    RUNNING,
    WAITING,
)
from schedspec.gpu_impl.engine import BatchedScheduler, NewRequests, default_device
from schedspec.gpu_impl.step_plan import SCHEDULED_NEW, SCHEDULED_RESUMED, StepPlan
from schedspec.spec import (
    CachedRequestData,
    KVState,
    ModelRunnerOutput,
    NewRequestData,
    OutputError,
    Request,
    RequestError,
    RequestOutput,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
    validate_new_request,
)
from schedspec.spec.invariants import Profile
from schedspec.spec.outputs import sampling_requests
from schedspec.spec.request import check_token_ids

DEVICE_ENV = "SCHEDSPEC_GPU_DEVICE"
_STATUS = {WAITING: RequestStatus.WAITING, RUNNING: RequestStatus.RUNNING}
_STATUS[PREEMPTED] = RequestStatus.PREEMPTED
_FINISH = {FINISHED_STOPPED: RequestStatus.FINISHED_STOPPED}
_FINISH[FINISHED_LENGTH_CAPPED] = RequestStatus.FINISHED_LENGTH_CAPPED


@dataclass
class HostRequest:
    """What the tensors do not hold about a request."""

    request: Request
    slot: int
    outputs: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [*self.request.prompt_token_ids, *self.outputs]


class GpuEngine:
    profiles: frozenset[Profile] = frozenset({"safety", "vllm-v1"})
    # Every vLLM-family knob but the KV connector (it refuses one).
    # No KV connector, and one KV cache group (gpu_impl does not follow hybrid groups).
    capabilities: frozenset[Capability] = VLLM_FAMILY_CAPABILITIES - {
        Capability.KV_CONNECTOR,
        Capability.HYBRID_KV,
    }

    def __init__(self, config: SchedulerConfig, device: torch.device | str | None = None) -> None:
        chosen = device if device is not None else os.environ.get(DEVICE_ENV) or default_device()
        self.config = config
        self.engine = BatchedScheduler(config, batch=1, slots=8, device=chosen)
        self.device = self.engine.device
        self.requests: dict[str, HostRequest] = {}  # every unfinished request, by arrival
        self.finished_req_ids: set[str] = set()
        # Steps scheduled and not landed, oldest first, with the requests each
        # scheduled: an id can be aborted and reused while its step is in flight.
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, HostRequest]]] = deque()
        self._hashes = HashTranslator(config.block_size)  # device content id -> BLAKE2b
        self._arrivals = 0

    # ----------------------------------------------------------------- requests

    @torch.inference_mode()
    def add_request(self, request: Request) -> None:
        validate_new_request(request, self.config)
        rid = request.request_id
        if rid in self.requests:
            raise RequestError("request_id", f"duplicate request id {rid!r}")
        slot = self._free_slot(len(request.stop_token_ids))
        prompt = torch.tensor([request.prompt_token_ids], dtype=torch.int64)
        stops = torch.tensor([[*request.stop_token_ids, NO_TOKEN]], dtype=torch.int64)
        eos = NO_TOKEN if request.eos_token_id is None else request.eos_token_id

        def one(value: int) -> torch.Tensor:
            return torch.tensor([value], dtype=torch.int64, device=self.device)

        self.engine.add_requests(
            NewRequests(
                inst=one(0),
                slot=one(slot),
                prompt=prompt.to(self.device),
                prompt_len=one(len(request.prompt_token_ids)),
                max_tokens=one(request.max_tokens),
                eos=one(eos),
                stops=stops.to(self.device),
                priority=one(request.priority),
            )
        )
        request.arrival = self._arrivals  # the engine counts arrivals the same way
        self._arrivals += 1
        host = HostRequest(request, slot)
        self.requests[rid] = host
        self._learn_hashes([host])

    def _free_slot(self, num_stops: int) -> int:
        used = {h.slot for h in self.requests.values()}
        slots = self.engine.state.slots
        if len(used) >= slots or num_stops + 1 > self.engine.state.stops.shape[2]:
            self.engine.grow(slots * 2 if len(used) >= slots else slots, num_stops + 1)
        return min(set(range(self.engine.state.slots)) - used)

    @torch.inference_mode()
    def finish_requests(self, request_ids: str | Iterable[str]) -> None:
        """Abort requests wherever they are; unknown or finished ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            if not isinstance(rid, str):
                raise RequestError("request_ids", f"ids must be str, got {rid!r}")
        aborted = [rid for rid in dict.fromkeys(ids) if rid in self.requests]
        if not aborted:
            return
        mask = torch.zeros((1, self.engine.state.slots), dtype=torch.bool)
        rank = torch.zeros((1, self.engine.state.slots), dtype=torch.int64)
        for position, rid in enumerate(aborted):
            slot = self.requests[rid].slot
            mask[0, slot] = True
            rank[0, slot] = position
        self.engine.finish_requests(mask.to(self.device), rank.to(self.device))
        for rid in aborted:
            del self.requests[rid]
            self._hashes.forget(rid)
            self.finished_req_ids.add(rid)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ----------------------------------------------------------------- schedule

    @torch.inference_mode()
    def schedule(self) -> SchedulerOutput:
        plan = self.engine.schedule()
        output = self._build_output(plan)
        self.finished_req_ids = set()
        scheduled = {rid: self.requests[rid] for rid in output.num_scheduled_tokens}
        self._in_flight.append((output, scheduled))
        return output

    def _build_output(self, plan: StepPlan) -> SchedulerOutput:
        state = self.engine.state
        scheduled = plan.scheduled[0].tolist()
        rank = plan.rank[0].tolist()
        kind = plan.kind[0].tolist()
        before = plan.computed_before[0].tolist()
        new_from = plan.new_from[0].tolist()
        num_drafts = plan.num_drafts[0].tolist()
        drafts = plan.drafts[0].tolist()
        preempted = plan.preempted[0].tolist()
        # The runner counts the outputs still in flight too.
        placeholders = plan.placeholders_before[0].tolist()
        tables = state.table[0].tolist()
        held = state.num_held[0].tolist()
        by_slot = {h.slot: h for h in self.requests.values()}
        order = sorted((rank[s], s) for s in by_slot if scheduled[s] > 0)
        new_reqs: list[NewRequestData] = []
        running: list[CachedRequestData] = []
        resumed: list[CachedRequestData] = []
        spec_tokens: dict[str, tuple[int, ...]] = {}
        for _, s in order:
            host = by_slot[s]
            rid = host.request.request_id
            table = tuple(tables[s][: held[s]])
            outputs = len(host.outputs) + placeholders[s]
            if kind[s] == SCHEDULED_NEW:
                new_reqs.append(
                    NewRequestData(rid, host.request.prompt_token_ids, table, before[s])
                )
            elif kind[s] == SCHEDULED_RESUMED:
                resumed.append(CachedRequestData(rid, True, table, before[s], outputs))
            else:
                new_ids = table[new_from[s] :]
                running.append(CachedRequestData(rid, False, new_ids, before[s], outputs))
            if num_drafts[s] > 0:
                spec_tokens[rid] = tuple(drafts[s][: num_drafts[s]])
        return SchedulerOutput(
            scheduled_new_reqs=tuple(new_reqs),
            scheduled_cached_reqs=(*running, *resumed),
            num_scheduled_tokens={by_slot[s].request.request_id: scheduled[s] for _, s in order},
            total_num_scheduled_tokens=sum(scheduled[s] for _, s in order),
            scheduled_spec_decode_tokens=spec_tokens,
            preempted_req_ids=frozenset(
                h.request.request_id for h in by_slot.values() if preempted[h.slot]
            ),
            finished_req_ids=frozenset(self.finished_req_ids),
        )

    # ------------------------------------------------------------------ outputs

    @torch.inference_mode()
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        """Land the step scheduler_output describes (with async scheduling, not always the
        latest): its live requests' tokens leave flight and the sampling ones take theirs."""
        if not self._in_flight or self._in_flight[0][0] is not scheduler_output:
            raise OutputError(
                "scheduler_output",
                "must be the oldest step this engine scheduled and has not applied "
                "(outputs are applied once each, in the order scheduled)",
            )
        scheduled_for = self._in_flight[0][1]
        sampling = self._sampling_requests(
            scheduler_output, model_runner_output.sampled_token_ids, scheduled_for
        )
        self._in_flight.popleft()
        # Ranks are positions in scheduling order (num_scheduled_tokens keeps it): the
        # engine registers and frees in that order. Aborted or finished requests ran no
        # step of the live ones: their ids no longer name their slot (or name a new
        # request's).
        landing = [
            (self.requests[rid], num, position)
            for position, (rid, num) in enumerate(scheduler_output.num_scheduled_tokens.items())
            if self.requests.get(rid) is scheduled_for[rid]
        ]
        if not landing:
            return {}
        slots = self.engine.state.slots
        width = self.config.num_speculative_tokens + 1
        tokens = torch.zeros((1, slots, width), dtype=torch.int64)
        count = torch.zeros((1, slots), dtype=torch.int64)
        drafts = torch.zeros((1, slots), dtype=torch.int64)
        rank = torch.zeros((1, slots), dtype=torch.int64)
        scheduled = torch.zeros((1, slots), dtype=torch.int64)
        for host, num, position in landing:
            scheduled[0, host.slot] = num
            rank[0, host.slot] = position
        for host, sampled, num_drafts in sampling:
            s = host.slot
            tokens[0, s, : len(sampled)] = torch.tensor(list(sampled), dtype=torch.int64)
            count[0, s] = len(sampled)
            drafts[0, s] = num_drafts
        to = self.device
        result = self.engine.update_from_output(
            tokens.to(to), count.to(to), drafts.to(to), rank.to(to), scheduled.to(to)
        )
        kept = result.kept[0].tolist()
        finish = result.finish[0].tolist()
        stale = result.stale[0].tolist() if result.stale is not None else [False] * slots
        state = self.engine.state
        confirmed = (state.num_computed[0] - state.num_in_flight[0]).tolist()
        outputs: dict[str, RequestOutput] = {}
        for host, sampled, _ in sampling:
            s = host.slot
            new_tokens = tuple(sampled[: kept[s]])
            host.outputs.extend(new_tokens)
            status = _FINISH.get(finish[s])
            if status is not None:
                host.request.status = status
            rid = host.request.request_id
            # Stale output reports no computed count: the preemption reset it.
            computed = None if stale[s] else confirmed[s]
            outputs[rid] = RequestOutput(rid, new_tokens, status, computed)
        self._learn_hashes([host for host, _, _ in sampling])
        for rid, output in outputs.items():
            if output.finish_status is not None:
                del self.requests[rid]
                self._hashes.forget(rid)
                self.finished_req_ids.add(rid)
        return outputs

    def _sampling_requests(
        self,
        scheduler_output: SchedulerOutput,
        sampled: Mapping[str, Sequence[int]],
        scheduled_for: Mapping[str, HostRequest],
    ) -> list[tuple[HostRequest, Sequence[int], int]]:
        """(request, tokens, drafts scheduled) per live request that sampled, of those the
        step was scheduled for; refuses an output that does not answer this step before
        anything changes."""
        requests = self.requests
        num_known_tokens = {  # a request aborted while the step ran is gone from requests
            rid: len(host.request.prompt_token_ids) + len(host.outputs)
            for rid, host in scheduled_for.items()
            if requests.get(rid) is host
        }
        return [
            (self.requests[rid], tokens, num_drafts)
            for rid, tokens, num_drafts in sampling_requests(
                scheduler_output, sampled, num_known_tokens
            )
        ]

    @torch.inference_mode()
    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        limit = self.config.num_speculative_tokens
        for rid, drafts in draft_token_ids.items():
            check_token_ids("draft_token_ids", drafts, OutputError)
            if len(drafts) > limit:
                raise OutputError(
                    "draft_token_ids",
                    f"request {rid!r}: at most num_speculative_tokens ({limit}) drafts, "
                    f"got {len(drafts)}",
                )
        known = [(self.requests[r], d) for r, d in draft_token_ids.items() if r in self.requests]
        if not known:
            return
        slots = self.engine.state.slots
        mask = torch.zeros((1, slots), dtype=torch.bool)
        tokens = torch.zeros((1, slots, max(limit, 1)), dtype=torch.int64)
        count = torch.zeros((1, slots), dtype=torch.int64)
        for host, drafts in known:
            mask[0, host.slot] = True
            count[0, host.slot] = len(drafts)
            if drafts:
                tokens[0, host.slot, : len(drafts)] = torch.tensor(list(drafts), dtype=torch.int64)
        to = self.device
        self.engine.update_draft_token_ids(mask.to(to), tokens.to(to), count.to(to))

    # ------------------------------------------------------------ content ids

    def _learn_hashes(self, hosts: list[HostRequest]) -> None:
        """Pair each request's device content ids (one per full block of its known tokens)
        with its BLAKE2b block hashes."""
        if not self.config.enable_prefix_caching or not hosts:
            return
        rows = self.engine.state.req_hash[0].tolist()
        size = self.config.block_size
        for host in hosts:
            tokens = host.tokens
            full = rows[host.slot][: len(tokens) // size]
            self._hashes.learn(host.request.request_id, full, tokens)

    # --------------------------------------------------------------- inspection

    @torch.inference_mode()
    def snapshot(self) -> State:
        st = self.engine.state
        status = st.status[0].tolist()
        computed = st.num_computed[0].tolist()
        num_spec = st.num_spec[0].tolist()
        spec = st.spec[0].tolist()
        tables = st.table[0].tolist()
        held = st.num_held[0].tolist()
        preemptions = st.num_preemptions[0].tolist()
        chunk = st.is_prefill_chunk[0].tolist()
        in_flight = st.num_in_flight[0].tolist()
        placeholders = st.num_placeholders[0].tolist()
        stale = st.num_stale[0].tolist()
        run_key = st.run_key[0].tolist()
        wait_key = st.wait_key[0].tolist()
        requests: dict[str, RequestState] = {}
        for rid, host in self.requests.items():
            s, r = host.slot, host.request
            requests[rid] = RequestState(
                request_id=rid,
                priority=r.priority,
                arrival=r.arrival,
                prompt_token_ids=r.prompt_token_ids,
                output_token_ids=tuple(host.outputs),
                spec_token_ids=tuple(spec[s][: num_spec[s]]),
                num_computed_tokens=computed[s],
                status=_STATUS[status[s]],
                block_ids=tuple(tables[s][: held[s]]),
                num_preemptions=preemptions[s],
                max_tokens=r.max_tokens,
                eos_token_id=r.eos_token_id,
                stop_token_ids=r.stop_token_ids,
                num_in_flight_tokens=in_flight[s],
                num_output_placeholders=placeholders[s],
                num_stale_output_tokens=stale[s],
                is_prefill_chunk=chunk[s],
            )
        waiting = sorted(
            (wait_key[h.slot], rid) for rid, h in self.requests.items() if status[h.slot] != RUNNING
        )
        running = sorted(
            (run_key[h.slot], rid) for rid, h in self.requests.items() if status[h.slot] == RUNNING
        )
        return State(
            config=self.config,
            requests=requests,
            waiting=tuple(rid for _, rid in waiting),
            running=tuple(rid for _, rid in running),
            kv=self._kv_state(),
        )

    def _kv_state(self) -> KVState:
        st = self.engine.state
        refs = st.ref_cnt[0].tolist()
        free_key = st.free_key[0].tolist()
        hashes = st.block_hash[0].tolist()
        reg_seq = st.reg_seq[0].tolist()
        free = sorted((free_key[b], b) for b, ref in enumerate(refs) if ref == 0)
        holders: dict[int, list[tuple[int, int]]] = {}
        for block, device_id in enumerate(hashes):
            if device_id != NO_HASH:
                holders.setdefault(device_id, []).append((reg_seq[block], block))
        keys = sorted(holders, key=lambda h: min(holders[h]))
        return KVState(
            num_blocks=self.config.num_blocks,
            free_block_ids=tuple(b for _, b in free),
            ref_counts=tuple(refs),
            block_hashes=tuple(None if h == NO_HASH else self._hashes.spec_of(h) for h in hashes),
            prefix_cache=tuple(
                (self._hashes.spec_of(h), tuple(b for _, b in sorted(holders[h]))) for h in keys
            ),
        )


def gpu_engine(config: SchedulerConfig) -> GpuEngine:
    return GpuEngine(config)
