"""The reference scheduler: vLLM V1's core scheduling path, one rule per method.

Each step serves running requests first, in running order, then admits
waiting ones in queue order, all out of one token budget. There are no
phases: every request just tries to bring num_computed_tokens up to
num_tokens_with_spec (prefill chunks, decodes and drafts alike).

With async_scheduling the next step is scheduled before this one's output
arrives (vLLM's AsyncScheduler): a request's in-flight sampling step counts
as num_output_placeholders known-to-be tokens, its next drafts are
placeholders the model runner fills, and output that arrives for a request
preempted meanwhile is stale: delivered, but it moves no reset counter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

from schedspec.reference.request_records import RequestRecords
from schedspec.reference.sizing import (
    apply_long_prefill_cap,
    num_drafts_to_schedule,
    padded_admission_tokens,
    rolled_back_computed,
    running_new_tokens,
    sure_to_reach_max_tokens,
)
from schedspec.reference.vllm.free_block_queue import KVCacheBlock
from schedspec.reference.vllm.hybrid_kv_cache_manager import (
    HybridKVCacheManager,
    make_kv_cache_manager,
)
from schedspec.reference.vllm.kv_cache_manager import BLOCK_ID, KVCacheManager
from schedspec.reference.vllm.kv_loads import KVLoads, holds_blocks
from schedspec.reference.vllm.mamba_split import MambaSplit
from schedspec.reference.vllm.request_queue import FCFSQueue, WaitingQueue, make_waiting_queue
from schedspec.reference.vllm.step_plan import StepPlan
from schedspec.reference.vllm.stop_checker import append_output_tokens
from schedspec.spec import (
    PLACEHOLDER_TOKEN_ID,
    CachedRequestData,
    ConnectorState,
    ModelRunnerOutput,
    NewRequestData,
    OutputError,
    Request,
    RequestError,
    RequestOutput,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
    validate_new_request,
)
from schedspec.spec.config import require_family
from schedspec.spec.connector import interleaved
from schedspec.spec.outputs import sampling_requests
from schedspec.spec.request import check_token_ids

# The NamedTuples built per request per step (schedule's CachedRequestData,
# update_from_output's RequestOutput) are made the way their own constructor makes them,
# the fields in order, without that constructor's Python-level call: half its cost.
_tuple_new = tuple.__new__
# Read per request per step. An enum member read off its class goes through EnumType's
# __getattr__ hook (Python 3.11), several times the cost of reading a global.
RUNNING = RequestStatus.RUNNING
# The snapshot's queue reader: map() over it walks a queue in C, twice a checked step.
_REQUEST_ID = attrgetter("request_id")


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        require_family(config, "the reference scheduler", ("vllm",))
        self.config = config
        self.kv_cache_manager = make_kv_cache_manager(config)
        # The KV connector's side (docs/SPEC.md, "The KV connector"); None without one
        # (a config refuses one with kv_cache_groups).
        self.kv_loads: KVLoads | None = None
        if config.kv_connector:
            assert isinstance(self.kv_cache_manager, KVCacheManager)
            self.kv_loads = KVLoads(config, self.kv_cache_manager)
        # Chunk ends cut to Mamba state boundaries (None: no Mamba group in align mode).
        self._mamba_split = MambaSplit.of(config)
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: WaitingQueue = make_waiting_queue(config.policy)
        self.running: list[Request] = []  # admission order
        self.finished_req_ids: set[str] = set()  # since the previous schedule()
        self._num_arrivals = 0
        # The last snapshot's request records, reused where a request has not changed.
        self._records = RequestRecords()
        # Steps scheduled whose output has not been applied, oldest first, with the
        # requests each scheduled that are still live (_free_request drops a finished one
        # from every step: an id can be aborted and reused meanwhile).
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, Request]]] = deque()
        self._drafting = config.num_speculative_tokens > 0
        # Read per request per step; the config is frozen.
        self._max_model_len = config.max_model_len
        self._lookahead_tokens = config.lookahead_tokens
        # Cache-aware admission reorders by queue position among requests ranked by
        # their cached prefix: it needs a FCFS queue and a prefix cache, and like
        # vLLM's Scheduler.__init__ the window is 0 (off) without either.
        self._cache_aware_window = (
            config.cache_aware_admission_window
            if config.policy == "fcfs" and config.enable_prefix_caching
            else 0
        )

    # ----------------------------------------------------------------- requests

    def add_request(self, request: Request) -> None:
        validate_new_request(request, self.config)
        loads = self.kv_loads
        if request.request_id in self.requests:
            raise RequestError("request_id", f"duplicate request id {request.request_id!r}")
        if loads is not None and request.request_id in loads.held:
            # Its blocks still wait for the worker, whose report names the id.
            raise RequestError(
                "request_id",
                f"request id {request.request_id!r} is still held by the KV connector",
            )
        request.arrival = self._num_arrivals
        self._num_arrivals += 1
        self.kv_cache_manager.hash_prompt(request)
        self.requests[request.request_id] = request
        if loads is None:
            self.waiting.add(request)
            return
        loads.connector.on_new_request(request.request_id)
        remote = request.remote_kv
        may_load_async = remote is not None and remote.num_tokens > 0 and remote.load_async
        if self.config.max_num_inflight_kv_loads is not None and may_load_async:
            loads.async_waiting.add(request)
        else:
            self.waiting.add(request)

    def finish_requests(self, request_ids: str | Iterable[str]) -> None:
        """Abort requests wherever they are; unknown or finished ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            if not isinstance(rid, str):
                raise RequestError("request_ids", f"ids must be str, got {rid!r}")
        self._finish(ids, RequestStatus.FINISHED_ABORTED)

    def _finish(self, ids: Iterable[str], status: RequestStatus) -> None:
        """Finish live requests wherever they are (an abort, or a failed load)."""
        aborted = [self.requests[rid] for rid in dict.fromkeys(ids) if rid in self.requests]
        running_ids = {r.request_id for r in aborted if r.status is RequestStatus.RUNNING}
        self.running = [r for r in self.running if r.request_id not in running_ids]
        waiting_ids = {r.request_id for r in aborted} - running_ids
        self.waiting.remove(waiting_ids)
        loads = self.kv_loads
        if loads is not None:
            loads.holding.remove(waiting_ids)
            loads.async_waiting.remove(waiting_ids)
        for request in aborted:
            # A parked load's blocks stay while its transfer still writes them.
            in_flight = (
                loads is not None
                and request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
                and loads.abort_parked(request)
            )
            request.status = status
            self._free_request(request, delay_free_blocks=in_flight)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> None:
        """A finished request leaves. With a connector, request_finished is called first
        (once, before any free), and the blocks stay if it or the scheduler delays."""
        assert request.is_finished
        loads = self.kv_loads
        held = loads is not None and loads.finished(request, delay_free_blocks)
        if not held:
            self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)
        # Output of a step still in flight lands on no finished request.
        for _, scheduled in self._in_flight:
            scheduled.pop(request.request_id, None)

    # ----------------------------------------------------------------- schedule

    def schedule(self) -> SchedulerOutput:
        if isinstance(self.kv_cache_manager, HybridKVCacheManager):
            self.kv_cache_manager.new_step_starts()
        step = StepPlan(token_budget=self.config.max_num_batched_tokens)
        cap = self._long_prefill_cap()
        self._schedule_running(step, cap)
        # A step that preempted admits nothing: the freed blocks go to the
        # running requests first, and the victim cannot bounce straight back.
        if not step.preempted:
            self._schedule_waiting(step, cap)
        output = self._build_output(step)
        if isinstance(self.kv_cache_manager, HybridKVCacheManager):
            self.kv_cache_manager.end_step()
        self._in_flight.append((output, self._update_after_schedule(step)))
        self.finished_req_ids = set()
        if self.kv_loads is not None:
            self.kv_loads.connector.on_schedule()
        return output

    def _update_after_schedule(self, step: StepPlan) -> dict[str, Request]:
        """Advance the scheduled requests as if their step had run (vLLM does the same);
        update_from_output corrects for rejected drafts and stops. Returns them by id."""
        requests = self.requests
        loads = self.kv_loads
        scheduled: dict[str, Request] = {}
        for rid, num_tokens in step.num_scheduled_tokens.items():
            scheduled[rid] = request = requests[rid]
            request.num_computed_tokens += num_tokens
            request.num_in_flight_tokens += num_tokens
            request.is_prefill_chunk = request.num_computed_tokens < (
                len(request.all_token_ids) + request.num_output_placeholders
            )
            if loads is not None:
                loads.on_scheduled(request)
        if self.config.async_scheduling:
            self._add_output_placeholders(step)
        return scheduled

    def _add_output_placeholders(self, step: StepPlan) -> None:
        """Async: each scheduled step that samples adds its 1 + drafts output positions
        as placeholders, and the request's next drafts are placeholders the model
        runner proposes itself; so the next step can be scheduled before this one's
        output arrives."""
        placeholders = [PLACEHOLDER_TOKEN_ID] * self.config.num_speculative_tokens
        for rid in step.num_scheduled_tokens:
            request = self.requests[rid]
            if request.is_prefill_chunk:
                continue
            num_drafts = len(step.spec_decode_tokens.get(rid, ()))
            request.num_output_placeholders += 1 + num_drafts
            request.spec_token_ids = list(placeholders)

    def _long_prefill_cap(self) -> int:
        """Per-request token cap for this step; 0 (no cap) when only one request exists.

        A lone request has nobody to be fair to, so it may use the whole budget.
        Under long_prefill_needs_chunked_prefill (vLLM 0.34.0, where Scheduler.schedule
        computes the threshold beside num_eligible_reqs) the cap is also 0 with chunked
        prefill off; vLLM 0.33.0 capped either way, so a capped prompt ran in chunks
        even with chunking off.
        """
        config = self.config
        if config.long_prefill_needs_chunked_prefill and not config.enable_chunked_prefill:
            return 0
        if len(self.running) + self._num_waiting() > 1:
            return config.long_prefill_token_threshold
        return 0

    def _num_waiting(self) -> int:
        """Requests in any waiting queue (parked loads among them)."""
        loads = self.kv_loads
        extra = 0 if loads is None else len(loads.holding) + len(loads.async_waiting)
        return len(self.waiting) + extra

    def _schedule_running(self, step: StepPlan, cap: int) -> None:
        # Locals: this loop runs once per running request per step.
        is_priority = self.config.policy == "priority"
        last_position = self.config.max_model_len - 1
        allocate_slots = self.kv_cache_manager.allocate_slots
        lookahead = self._lookahead_tokens
        mamba_split = self._mamba_split
        scheduled_running = step.scheduled_running
        running = self.running
        req_index = 0
        while req_index < len(running) and step.token_budget > 0:
            request = running[req_index]
            computed = request.num_computed_tokens
            if request.num_output_placeholders and sure_to_reach_max_tokens(
                computed,
                request.num_output_placeholders,
                request.num_prompt_tokens,
                request.max_tokens,
            ):
                req_index += 1  # async: the step in flight is its last
                continue
            # Leave room for the token this step samples: positions stay < max_model_len.
            # (Its known tokens and drafts: num_tokens_with_spec, without the property's call.)
            num_new = running_new_tokens(
                len(request.all_token_ids)
                + len(request.spec_token_ids)
                + request.num_output_placeholders
                - computed,
                cap,
                step.token_budget,
                last_position - computed,
            )
            assert num_new >= 0, f"{request} is past max_model_len"
            if mamba_split is not None:
                num_new = mamba_split.cut(request, computed, num_new)
            if num_new == 0:
                req_index += 1  # skip, not break: later requests may still fit
                continue
            # Preempt victims until the slots fit or the request preempted itself.
            while (
                blocks := allocate_slots(request, num_new, num_lookahead_tokens=lookahead)
            ) is None:
                victim, req_index = self._preempt_for(request, req_index, step)
                if victim is request:
                    break
            if blocks is None:
                if is_priority and request.status is RequestStatus.PREEMPTED:
                    continue  # it preempted itself; running[req_index] is the next one
                break  # out of KV: nothing after it runs this step
            step.schedule(request, num_new, tuple([b.block_id for b in blocks]) if blocks else ())
            scheduled_running.append(request)
            req_index += 1
            if request.spec_token_ids:
                self._schedule_drafts(request, num_new, step)

    def _preempt_for(self, request: Request, req_index: int, step: StepPlan) -> tuple[Request, int]:
        """Preempt one victim to make room for request, the running request that asked
        for slots (the victim may be request itself). Returns the victim and req_index
        adjusted for a victim removed before it."""
        victim_index = self._pick_victim_index()
        victim = self.running.pop(victim_index)
        if victim_index < req_index:
            req_index -= 1
        if victim.request_id in step.num_scheduled_tokens:
            # Priority only: give back its budget, and its cache
            # registrations for KV this step will no longer compute.
            step.unschedule(victim)
            self.kv_cache_manager.uncache_uncomputed_blocks(victim)
        self._preempt(victim)
        step.preempted.append(victim)
        return victim, req_index

    def _pick_victim_index(self) -> int:
        """fcfs: the newest running request. priority: the largest (priority, arrival)."""
        if self.config.policy == "fcfs":
            return len(self.running) - 1
        return max(
            range(len(self.running)),
            key=lambda i: (self.running[i].priority, self.running[i].arrival),
        )

    def _preempt(self, request: Request) -> None:
        """Preemption by recomputation: drop all KV, keep the tokens, queue it again."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        # Output still in flight is stale: it is delivered when it arrives (its
        # tokens are right), but it must not move the counters just reset.
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        # Its shared-prefix junction stays, as in vLLM: nothing reads it while it waits,
        # and the lookup that resumes it (nothing computed) records a new one.
        if self.kv_loads is not None:
            self.kv_loads.forget(request)
        self.waiting.prepend(request)

    @staticmethod
    def _schedule_drafts(request: Request, num_new: int, step: StepPlan) -> None:
        """Drafts ride in the same budget; a short budget drops the trailing ones.

        The request's drafts are consumed either way: fresh ones arrive
        through update_draft_token_ids before the next step.
        """
        # Drafts ride past the known tokens and the in-flight step's output positions.
        num_drafts = num_drafts_to_schedule(
            num_new,
            request.num_computed_tokens,
            request.num_tokens + request.num_output_placeholders,
        )
        if num_drafts > 0:
            step.spec_decode_tokens[request.request_id] = tuple(request.spec_token_ids[:num_drafts])
        request.spec_token_ids = []

    def _padded_admission(self, num_new: int, num_hit: int, step: StepPlan, cap: int) -> int:
        """Spec-decode padding (pad_spec_decode, vLLM's uniform decode batches): an
        admission with exactly one token to compute, when no running request's
        prefill continues in this step and either some running request is in the
        step or the admission hit the prefix cache, is scheduled as 1 + K tokens
        whose K drafts are placeholders, if that leaves room below max_model_len.
        Returns the padded count, 0 when not padded, or -1 when the padded count
        does not fit the budget left (the admission then waits: vLLM prefers no
        step to an unpadded one).

        Where the long-prefill cap would cut the padded count, the request is not
        padded: vLLM pads and then fails its own assertion (docs/FINDINGS.md F3).
        """
        config = self.config
        if not config.pad_spec_decode or any(r.is_prefill_chunk for r in step.scheduled_running):
            return 0
        if not step.scheduled_running and num_hit == 0:
            return 0
        padded = padded_admission_tokens(
            num_new, num_hit, config.num_speculative_tokens, config.max_model_len
        )
        if padded == 0:
            return 0
        if padded > step.token_budget:
            return -1
        if 0 < cap < padded:
            return 0
        return padded

    @staticmethod
    def _admission_chunk(num_to_compute: int, cap: int) -> int:
        """The first chunk of an admitted request, before the budget: its tokens
        past the prefix hit, under the long-prefill cap."""
        return apply_long_prefill_cap(num_to_compute, cap)

    def _awaits_stale_output(self, request: Request) -> bool:
        """Async: a preempted request whose stale output is still in flight waits for it;
        resumed now, it would compute again a position that output delivers."""
        return request.num_stale_output_tokens > 0 and not request.drop_stale_output

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """Cache-aware admission (vLLM 0.34.0): among the first cache_aware_window requests
        of the queue, the plain waiting ones (never run, nothing computed) trade places so
        that the deepest cached prefix comes first, queue position breaking ties. A
        preempted request keeps its exact place (a moving one may jump over it). Skipped
        while fewer than two wait, or while KV usage is below the threshold (there is
        room for every prompt, so nothing would be evicted). The queue stays reordered."""
        waiting = self.waiting
        assert isinstance(waiting, FCFSQueue)  # the window is 0 under priority
        kv = self.kv_cache_manager
        if len(waiting) < 2 or kv.usage < self.config.cache_aware_admission_threshold:
            return
        head = waiting.head(self._cache_aware_window)
        slots = [
            i
            for i, request in enumerate(head)
            if request.status is RequestStatus.WAITING and not request.num_computed_tokens
        ]
        if len(slots) < 2:
            return
        cached = {i: kv.get_num_cached_tokens(head[i]) for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        reordered = list(head)
        for slot, source in zip(slots, order, strict=True):
            reordered[slot] = head[source]
        waiting.replace_head(reordered)

    def _schedule_waiting(self, step: StepPlan, cap: int) -> None:
        # At the start of the waiting phase, after the running requests took their
        # blocks: the usage and the cache it reads are this step's.
        if self._cache_aware_window:
            self._reorder_waiting_by_cached_prefix()
        skips = _Skips()
        try:
            self._admit_waiting(step, cap, skips)
        finally:
            skips.requeue(self.waiting, self.kv_loads)

    def _next_queue(self, loads_only: bool, take_async: bool) -> WaitingQueue | None:
        """The queue the next admission comes from, or None to stop. Requests holding
        blocks (parked and promoted loads) go first; then the plain queue, or the
        async-load queue when its head arrived first. When the batch or the budget is
        full, only async loads may start: they take neither until their KV is in."""
        loads = self.kv_loads
        if loads_only:
            if loads is None or not take_async or not loads.async_waiting:
                return None
            return loads.async_waiting
        queue: WaitingQueue = self.waiting
        if loads is not None:
            if loads.holding:
                return loads.holding
            async_waiting = loads.async_waiting
            if take_async and async_waiting:
                first = not self.waiting or self._goes_first(
                    async_waiting.peek(), self.waiting.peek()
                )
                queue = async_waiting if first else self.waiting
        return queue if queue else None

    def _admit_waiting(self, step: StepPlan, cap: int, skips: _Skips) -> None:
        config = self.config
        kv = self.kv_cache_manager
        loads = self.kv_loads
        take_async = True
        while True:
            loads_only = len(self.running) >= config.max_num_seqs or step.token_budget <= 0
            queue = self._next_queue(loads_only, take_async)
            if queue is None:
                break
            request = queue.peek()
            if request.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
                assert loads is not None
                if not loads.is_ready(request):
                    skips.skip(queue, loads)
                    continue
                loads.promote(request)
            if self._awaits_stale_output(request):
                skips.skip(queue, loads)
                continue
            hit_blocks: list[KVCacheBlock] = []
            num_hit = external = 0
            load_async = False
            # Only a request with nothing computed looks up the cache and the connector;
            # a promoted load starts from what it loaded.
            if request.num_computed_tokens == 0:
                # A hybrid lookup also records the request's shared-prefix junction.
                hit_blocks, num_hit = kv.get_computed_blocks(request)
                if loads is not None:
                    matched, load_async = loads.connector.get_num_new_matched_tokens(
                        request.request_id, request.remote_kv, request.num_tokens, num_hit
                    )
                    if matched is None:  # not ready: ask again next step
                        skips.skip(queue, loads)
                        continue
                    loads.on_lookup(request)
                    external = matched
            if (load_async and loads is not None and not loads.admits_inflight_load()) or (
                loads_only and not load_async
            ):
                # It waits at its queue's head; other queues may still admit.
                if loads is None or queue is not loads.async_waiting:
                    break
                take_async = False
                continue
            computed = request.num_computed_tokens + num_hit + external
            num_new = padded = 0  # an async load computes nothing until its KV is in
            if not load_async:
                num_new = request.num_tokens - computed
                padded = self._padded_admission(num_new, computed, step, cap)
                if padded < 0:
                    break
                num_new = padded or self._admission_chunk(num_new, cap)
                if not config.enable_chunked_prefill and num_new > step.token_budget:
                    break  # head-of-line: nothing behind it is tried this step
                num_new = min(num_new, step.token_budget)
                if self._mamba_split is not None:
                    num_new = self._mamba_split.cut(request, computed, num_new)
                    if num_new == 0:
                        break  # it waits for a step with more budget; nothing behind it
            blocks = kv.allocate_slots(
                request,
                num_new,
                num_new_computed_tokens=num_hit,
                new_computed_blocks=hit_blocks,
                # An async load runs no forward pass yet: no lookahead slots.
                num_lookahead_tokens=0 if load_async else config.lookahead_tokens,
                full_sequence_must_fit=True,
                has_running_requests=bool(self.running),
                num_external_computed_tokens=external,
                delay_cache_blocks=load_async,
                reserved_blocks=loads.reserved_blocks(request) if load_async and loads else 0,
            )
            if blocks is None:
                break  # head-of-line on KV too
            if load_async:
                assert loads is not None
                loads.park(request, computed)
                skips.skip(queue, loads)  # now holding blocks: queued behind the holders
                continue
            queue.pop()
            self.running.append(request)
            kv.record_prefix_cache_lookup(request, num_hit)
            if request.status is RequestStatus.WAITING:
                step.scheduled_new.append(request)
            else:
                step.scheduled_resumed.append(request)
            # New and resumed requests get their whole table, hits included.
            step.schedule(request, num_new, kv.get_block_ids(request.request_id))
            if padded:
                step.spec_decode_tokens[request.request_id] = (PLACEHOLDER_TOKEN_ID,) * (padded - 1)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = computed
            if loads is not None:
                loads.on_admitted(request, num_new)

    def _build_output(self, step: StepPlan) -> SchedulerOutput:
        new_reqs = tuple(
            NewRequestData(
                request_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                block_ids=step.new_block_ids[r.request_id],
                num_computed_tokens=r.num_computed_tokens,
            )
            for r in step.scheduled_new
        )
        # One per running request per step, made as RequestOutput is (_tuple_new): the
        # fields in order (request_id, resumed, new_block_ids, num_computed_tokens,
        # num_output_tokens).
        new_block_ids = step.new_block_ids
        # A list first: tuple() over a generator resumes it once per request.
        cached_reqs = tuple(
            [
                _tuple_new(
                    CachedRequestData,
                    (
                        r.request_id,
                        resumed,
                        new_block_ids[r.request_id],
                        r.num_computed_tokens,
                        # The runner counts the outputs of a step still in flight too.
                        len(r.output_token_ids) + r.num_output_placeholders,
                    ),
                )
                for resumed, group in (
                    (False, step.scheduled_running),
                    (True, step.scheduled_resumed),
                )
                for r in group
            ]
        )
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            # The step plan is dropped after this: its dicts need no copy.
            num_scheduled_tokens=step.num_scheduled_tokens,
            total_num_scheduled_tokens=self.config.max_num_batched_tokens - step.token_budget,
            scheduled_spec_decode_tokens=step.spec_decode_tokens,
            preempted_req_ids=frozenset(r.request_id for r in step.preempted),
            finished_req_ids=frozenset(self.finished_req_ids),
        )

    # ------------------------------------------------------------------ outputs

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        """Apply the model's tokens: roll back rejected drafts, append, stop, free.

        Returns, per request that sampled, the tokens it kept and its finish status.
        """
        in_flight = self._in_flight
        if not in_flight or in_flight[0][0] is not scheduler_output:
            raise OutputError(
                "scheduler_output",
                "must be the oldest step this scheduler scheduled and has not applied "
                "(outputs are applied once each, in the order scheduled)",
            )
        requests = self.requests
        # The requests the step ran that are still live: output lands on no other (one
        # that finished or was aborted meanwhile left every step in flight).
        live = in_flight[0][1]
        sampling = sampling_requests(
            scheduler_output,
            model_runner_output.sampled_token_ids,
            {rid: len(r.all_token_ids) for rid, r in live.items()},
        )
        report = model_runner_output.kv_connector_output
        loads = self.kv_loads
        if report is not None:
            if loads is None:
                raise OutputError("kv_connector_output", "this scheduler has no KV connector")
            loads.check_report(report, requests)
        in_flight.popleft()
        # Failed loads first: their requests take no output this step.
        failed_loads = loads.failed_requests(report) if loads is not None and report else set()
        stale = self._land_in_flight_tokens(scheduler_output, live)
        stopped: set[str] = set()
        stopped_waiting: set[str] = set()  # stale output stopped a preempted request
        outputs: dict[str, RequestOutput] = {}
        apply_sampled = self._apply_sampled
        for rid, tokens, num_drafts in sampling:
            request = live[rid]
            was_running = request.status is RUNNING
            outputs[rid] = apply_sampled(request, tokens, num_drafts, rid in stale)
            if request.status.is_finished:  # its output's finish_status, without the read
                (stopped if was_running else stopped_waiting).add(rid)
                self._free_request(request)
        if stopped:
            self.running = [r for r in self.running if r.request_id not in stopped]
        if stopped_waiting:
            self.waiting.remove(stopped_waiting)
        if loads is not None and report:
            # Under "fail" a failed load ends its request; then the completed transfers
            # land (an aborted or failed load's blocks are freed once it reports).
            self._finish(sorted(failed_loads), RequestStatus.FINISHED_ERROR)
            for rid in sorted(failed_loads):
                outputs[rid] = RequestOutput(rid, (), RequestStatus.FINISHED_ERROR, None)
            loads.land_transfers(report, requests)
        return outputs

    def _land_in_flight_tokens(
        self, scheduler_output: SchedulerOutput, live: Mapping[str, Request]
    ) -> set[str]:
        """The step's tokens are no longer in flight for the live requests it ran;
        return those whose output from it is stale (they were preempted after it was
        scheduled)."""
        stale: set[str] = set()
        num_scheduled_tokens = scheduler_output.num_scheduled_tokens
        for rid, request in live.items():
            num_tokens = num_scheduled_tokens[rid]
            request.num_in_flight_tokens -= num_tokens
            if request.num_stale_output_tokens > 0:
                request.num_stale_output_tokens -= num_tokens
                stale.add(rid)
        return stale

    def _apply_sampled(
        self, request: Request, tokens: Sequence[int], num_drafts: int, stale: bool
    ) -> RequestOutput:
        """One sampling request's tokens: roll back its rejected drafts, append up to a
        stop, register the blocks its confirmed KV filled. Stale output (from a step
        before the request's preemption) is delivered but moves no reset counter."""
        if not stale and num_drafts:
            rejected = num_drafts + 1 - len(tokens)
            request.num_computed_tokens = rolled_back_computed(
                request.num_computed_tokens, num_drafts, len(tokens)
            )
            if request.num_output_placeholders > 0:
                request.num_output_placeholders -= rejected
        status = request.status
        had_placeholders = request.num_output_placeholders > 0
        kept = append_output_tokens(request, tokens, self._max_model_len, not stale)
        # Most steps keep every token: no slice to copy first.
        new_token_ids = tuple(tokens) if kept == len(tokens) else tuple(tokens[:kept])
        if stale:
            finish = request.status if request.status.is_finished else None
            return RequestOutput(request.request_id, new_token_ids, finish, None)
        if had_placeholders:
            # Every returned position resolves a placeholder, those dropped at a stop too.
            request.num_output_placeholders -= len(tokens)
        if status is RUNNING and (had_placeholders or self._drafting):
            # Accepted drafts filled blocks the schedule-time registration could not
            # know about; only KV whose step has landed is registered.
            self.kv_cache_manager.cache_blocks(request, request.num_confirmed_computed_tokens)
        finish = request.status if request.status.is_finished else None
        confirmed = request.num_computed_tokens - request.num_in_flight_tokens
        return _tuple_new(RequestOutput, (request.request_id, new_token_ids, finish, confirmed))

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """Set the drafts to verify next step. Drafts for a finished, unknown,
        waiting or mid-prefill request are dropped, as vLLM does."""
        limit = self.config.num_speculative_tokens
        for rid, drafts in draft_token_ids.items():
            check_token_ids("draft_token_ids", drafts, OutputError)
            if len(drafts) > limit:
                raise OutputError(
                    "draft_token_ids",
                    f"request {rid!r}: at most num_speculative_tokens ({limit}) drafts, "
                    f"got {len(drafts)}",
                )
        for rid, drafts in draft_token_ids.items():
            request = self.requests.get(rid)
            if request is None:
                continue
            usable = request.status is RequestStatus.RUNNING and not request.is_prefill_chunk
            request.spec_token_ids = list(drafts) if usable else []

    # --------------------------------------------------------------- inspection

    def snapshot(self) -> State:
        """The abstract state (spec.State) of this scheduler, for the invariant checks."""
        kv = self.kv_cache_manager
        record = self._records.record
        if isinstance(kv, HybridKVCacheManager):
            requests = {
                rid: record(r, kv.get_block_ids(rid), kv.group_block_ids(rid))
                for rid, r in self.requests.items()
            }
        else:
            tables = kv.req_to_blocks
            requests = {
                rid: record(r, tuple(map(BLOCK_ID, tables.get(rid, ()))))
                for rid, r in self.requests.items()
            }
        self._records.done()
        return State(
            config=self.config,
            requests=requests,
            waiting=self._waiting_order(),
            running=tuple(map(_REQUEST_ID, self.running)),
            kv=kv.snapshot(),
            connector=None if self.kv_loads is None else self._connector_state(),
        )

    def _connector_state(self) -> ConnectorState:
        loads = self.kv_loads
        assert loads is not None
        return loads.snapshot([*loads.holding, *self.waiting, *loads.async_waiting])

    def _waiting_order(self) -> tuple[str, ...]:
        """Every waiting request in the order admission looks at them: the block
        holders, then the plain queue, then the async-load queue (whose head may go
        before the plain queue's when it arrived first)."""
        if self.kv_loads is None:
            return tuple(map(_REQUEST_ID, self.waiting))
        loads = self.kv_loads
        rest = interleaved(list(self.waiting), list(loads.async_waiting), self._goes_first)
        return tuple(r.request_id for r in [*loads.holding, *rest])

    def _goes_first(self, async_head: Request, head: Request) -> bool:
        """Does the async-load queue's head go before the plain queue's?"""
        if self.config.policy == "priority":
            return (async_head.priority, async_head.arrival) < (head.priority, head.arrival)
        return async_head.arrival < head.arrival


class _Skips:
    """Requests passed over in this step's waiting phase, by where they go back: each
    queue's skipped ones return to its front in their order, and loads started this
    step join the holders' queue behind the older ones (vLLM 0.34.0)."""

    def __init__(self) -> None:
        self.waiting: list[Request] = []
        self.holding: list[Request] = []
        self.async_waiting: list[Request] = []
        self.started_loads: list[Request] = []

    def skip(self, queue: WaitingQueue, loads: KVLoads | None) -> None:
        request = queue.pop()
        if loads is None:
            self.waiting.append(request)
        elif holds_blocks(request):
            started = queue is not loads.holding
            (self.started_loads if started else self.holding).append(request)
        elif queue is loads.async_waiting:
            self.async_waiting.append(request)
        else:
            self.waiting.append(request)

    def requeue(self, waiting: WaitingQueue, loads: KVLoads | None) -> None:
        if loads is not None:
            for request in reversed(self.holding):
                loads.holding.prepend(request)
            for request in self.started_loads:
                loads.holding.add(request)
            for request in reversed(self.async_waiting):
                loads.async_waiting.prepend(request)
        for request in reversed(self.waiting):
            waiting.prepend(request)
