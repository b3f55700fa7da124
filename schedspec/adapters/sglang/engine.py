"""SGLang's scheduler under schedspec: an EngineAdapter, on CPU, with no model download.

SGLang 0.5.23's real `Scheduler` runs in this process (adapters/sglang/runtime.py says
how it is built and what stands in for a GPU). Install it into a venv of its own with
`schedspec install sglang VENV`; SGLang is imported only when an engine is built.

The config's translation, and the configs refused, are adapters/sglang/config.py's.

Translation of the calls. One engine step is what SGLang's event loop does per
iteration, split where the harness's engine core splits it (pipeline.BatchQueue):
schedule() is the scheduling half (get_next_batch_to_run, which merges the last prefill
batch into the running batch, stashes the chunked request, retracts, decays
new_token_ratio and forms a prefill or else a decode batch) and the launch of the batch
(run_batch), or SGLang's idle housekeeping (on_idle) when no batch forms and nothing
lands; update_from_output() processes the oldest launched batch's result
(process_batch_result: append the token, check finish, cache or release the KV) with the
harness's tokens written into the result first, then, under the overlap scheduler, runs
the newest batch's deferred sampling as the loop does. With async_scheduling the
harness's queue of two is SGLang's overlap loop: batch N+1 is scheduled and launched
before batch N's result is processed (event_loop_overlap); without it, the plain loop
(event_loop_normal).

add_request checks what the spec's door checks (validate_new_request) and a duplicate
live id, then hands SGLang the request as its tokenizer manager would
(handle_generate_request with a TokenizedGenerateReqInput; EOS and stop tokens are its
stop_token_ids, greedy sampling). SGLang's own door aborts a request it cannot serve (a
prompt too long for its context) by queueing it already finished; the adapter takes such
a request back out of the queue before anything runs it and raises RequestError with
SGLang's message, so the spec's DOOR judges the refusal. Each request gets an SGLang rid
of its own (adapters/sglang/requests.py says why); ids are translated back everywhere.
finish_requests aborts one id at a time through SGLang's abort_request: a waiting request
leaves at once, a running one is marked and finishes when its next forward lands.
update_from_output refuses a step that is not the oldest in flight, or tokens for a
request the step did not schedule, before SGLang sees them (adapters/in_flight.py);
update_draft_token_ids refuses any draft (the family schedules none).

The refinement mapping (`snapshot`) is adapters/sglang/kv.py's for the pool and the radix
cache, and adapters/sglang/requests.py's per request and for the running order; waiting
is SGLang's waiting queue. `State.sglang` carries new_token_ratio, the batch_is_full
latch, the chunked request and the kind of the last batch. SGLang's state is read once
per change: every call that changes it (or the steps in flight) drops the last read; a
request whose inputs to its RequestState did not change keeps the one read last
(requests.RequestStates: the waiting queue is most requests, and rarely changes), a
running request's table is kept while its row is (kv.SlotContents), and the allocator's
free pages and the radix cache's checked hashes while what they were read from is
(kv.KVReads).
"""

from __future__ import annotations

import weakref
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schedspec.adapters.engine_import import TINY_VOCAB_SIZE
from schedspec.adapters.in_flight import check_landing
from schedspec.adapters.kit import FinishedSince, Given, Pipeline, ScheduledRow, step_output
from schedspec.adapters.sglang.config import build_scheduler
from schedspec.adapters.sglang.kv import KVReads, SlotContents
from schedspec.adapters.sglang.requests import (
    RequestStates,
    abort_pending,
    finish_status,
    known_tokens,
    message,
    running_reqs,
    sglang_rid,
    spec_id,
)
from schedspec.adapters.sglang.runtime import Sglang, load_sglang
from schedspec.engines.capabilities import SGLANG_FAMILY_CAPABILITIES, Capability
from schedspec.spec import (
    BatchKind,
    ModelRunnerOutput,
    OutputError,
    Request,
    RequestError,
    RequestOutput,
    RequestState,
    SchedulerConfig,
    SchedulerOutput,
    SGLangState,
    State,
    validate_new_request,
)
from schedspec.spec.config import require_family, require_single_kv_group
from schedspec.spec.invariants import Profile

# A token the harness never samples: the result row of a request whose step samples
# nothing (a prefill chunk), which SGLang does not read.
_UNREAD_TOKEN = 0
_BATCH_KIND: dict[str, BatchKind] = {"EXTEND": "extend", "DECODE": "decode", "MIXED": "mixed"}


def generate_request(v: Sglang, rid: str, prompt: Sequence[int], params: Any) -> Any:
    """What SGLang's tokenizer manager sends the scheduler for a tokenized prompt."""
    return v.TokenizedGenerateReqInput(
        rid=rid,
        input_text=None,
        input_ids=array("q", prompt),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=params,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
    )


@dataclass(frozen=True)
class _Launched:
    """A step in flight: the spec's output, SGLang's batch and result (None: idle), and
    its rows by SGLang rid."""

    output: SchedulerOutput
    batch: Any
    result: Any
    rows: dict[str, ScheduledRow]


# Why the adapter keeps one KV cache group (docs/HYBRID.md, "SGLang").
SGLANG_ONE_GROUP = (
    "it builds SGLang's full-attention token pool and radix cache; SGLang's sliding-window "
    "and Mamba pools are not built under it yet (docs/HYBRID.md, 'SGLang')"
)


class SGLangEngine:
    """SGLang 0.5.23's Scheduler seen through the spec. It claims the sglang profile:
    it is the policy that profile states."""

    profiles: frozenset[Profile] = frozenset({"safety", "sglang"})
    capabilities: frozenset[Capability] = SGLANG_FAMILY_CAPABILITIES

    def __init__(self, config: SchedulerConfig) -> None:
        # First: a hybrid config is of family vllm, and the groups are what to name.
        require_single_kv_group(config, "the SGLang adapter", SGLANG_ONE_GROUP)
        require_family(config, "SGLang's scheduler", ("sglang",))
        self.config = config
        self._v = load_sglang()
        built = build_scheduler(self._v, config)
        self.scheduler: Any = built.scheduler
        weakref.finalize(self, built.close)
        self._num_arrivals = 0
        self._given: dict[str, Given] = {}  # by SGLang rid, live requests
        self._rid: dict[str, str] = {}  # spec id -> SGLang rid of its latest request
        self._in_flight: deque[_Launched] = deque()
        self._pipeline = Pipeline(config.async_scheduling)
        self._contents = SlotContents(config.block_size)
        self._kv = KVReads(self._contents, config.num_blocks)
        self._request_states = RequestStates()
        # Requests that finished since the last schedule() (spec ids), and the running
        # order of the last snapshot (for requests a queued result is about to finish).
        self._finished = FinishedSince()
        self._running_order: tuple[str, ...] = ()
        self._last_kind: BatchKind | None = None
        self._state: State | None = None  # the last snapshot, while nothing changed
        if config.async_scheduling:
            # What event_loop_overlap sets up before its first iteration: the queue of
            # launched batches whose results are not processed yet (SGLang reads it to
            # keep a request its queued result finishes out of the next decode batch).
            self.scheduler.enable_skip_finishing_decode = True
            self.scheduler.result_queue = deque()

    # ------------------------------------------------------------------ calls

    def add_request(self, request: Request) -> None:
        validate_new_request(request, self.config)
        if self._live_rid(request.request_id) is not None:
            raise RequestError("request_id", f"duplicate request id {request.request_id!r}")
        v = self._v
        rid = sglang_rid(request.request_id, self._num_arrivals)
        stops = set(request.stop_token_ids)
        if request.eos_token_id is not None:
            stops.add(request.eos_token_id)
        params = v.SamplingParams(
            max_new_tokens=request.max_tokens,
            stop_token_ids=sorted(stops) or None,
            temperature=0.0,
        )
        # As SGLang's tokenizer manager does before it sends a request on.
        params.normalize(None)
        params.verify(TINY_VOCAB_SIZE)
        s = self.scheduler
        queued = len(s.waiting_queue)
        self._changing()
        s.handle_generate_request(generate_request(v, rid, request.prompt_token_ids, params))
        added = [r for r in s.waiting_queue[queued:] if r.rid == rid]
        if len(added) != 1 or len(s.waiting_queue) != queued + 1:
            raise RuntimeError(f"SGLang did not queue request {rid!r} once at the back")
        req = added[0]
        if req.to_finish is not None or req.finished():
            # SGLang's door: queued already finished. Taken back before anything runs it.
            s.waiting_queue.pop()
            reason = req.to_finish or req.finished_reason
            raise RequestError("prompt_token_ids", f"SGLang refused it: {message(reason)}")
        self._num_arrivals += 1
        self._rid[request.request_id] = rid
        self._given[rid] = Given.of(request, self._num_arrivals - 1)

    def schedule(self) -> SchedulerOutput:
        s = self.scheduler
        pre = self.snapshot()
        self._changing()
        # Requests that vanish inside this call (an aborted chunked request, SGLang's
        # abort of the last request retraction cannot fit) are the next call's to report.
        reported = self._finished.take()
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        for req in s.waiting_queue:
            if req.is_retracted and spec_id(req.rid) in pre.running:
                self._pipeline.on_preempt(req.rid, drop_stale=True)
        rows = self._rows(batch, pre)
        nothing_to_land = not self._in_flight or self._in_flight[-1].batch is None
        if batch is not None:
            result = s.run_batch(batch)
            if s.enable_overlap:
                # The overlap loop queues a copy: the running batch goes on changing.
                launched_batch = batch.copy()
                s.result_queue.append((launched_batch, result))
            else:
                launched_batch = batch
        else:
            result = launched_batch = None
            if not s.enable_overlap or s.last_batch is None:
                s.on_idle()
        if s.enable_overlap and nothing_to_land:
            # With no earlier batch to process first, the loop samples this one now.
            s.launch_batch_sample_if_needed(result, batch)
        s.last_batch = batch
        self._last_kind = "idle" if batch is None else _BATCH_KIND[batch.forward_mode.name]
        self._pipeline.on_schedule(rows)
        post = self.snapshot()
        self._finished.note(pre, post)
        output = step_output(tuple(rows.values()), pre, post, reported)
        self._in_flight.append(_Launched(output, launched_batch, result, rows))
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        """Process the oldest launched batch's result with the harness's tokens; return
        each of its requests that sampled or finished: its new tokens and finish status."""
        sampled = model_runner_output.sampled_token_ids
        oldest = self._in_flight[0].output if self._in_flight else None
        check_landing(oldest, scheduler_output, sampled)
        # Before the step leaves the in-flight queue: a request only it still holds (one
        # its result finishes, out of the running batch already) is live until it lands.
        pre = self.snapshot()
        self._changing()
        launched = self._in_flight.popleft()
        reported: dict[str, RequestOutput] = {}
        s = self.scheduler
        if launched.batch is not None:
            if s.enable_overlap:
                queued_batch, _ = s.result_queue.popleft()
                if queued_batch is not launched.batch:
                    raise RuntimeError("SGLang's result queue is out of step with the harness")
            reported = self._process(launched, sampled)
        self._pipeline.on_land(launched.rows)
        if s.enable_overlap and self._in_flight:
            # The loop samples the newest batch once the one before it is processed.
            newest = self._in_flight[-1]
            s.launch_batch_sample_if_needed(newest.result, newest.batch)
        post = self.snapshot()
        self._finished.note(pre, post)
        return reported

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """The family has no drafts (num_speculative_tokens is 0): nothing to take."""
        if any(draft_token_ids.values()):
            raise OutputError("draft_token_ids", "SGLang's family schedules no drafts")

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        pre = self.snapshot()
        self._changing()
        for request_id in dict.fromkeys(request_ids):
            rid = self._live_rid(request_id)
            if rid is not None:
                self.scheduler.abort_request(self._v.AbortReq(rid=rid))
        post = self.snapshot()
        self._finished.note(pre, post)

    # --------------------------------------------------------------- helpers

    def _live_rid(self, request_id: str) -> str | None:
        """SGLang's rid of the live request the spec calls request_id, if there is one."""
        rid = self._rid.get(request_id)
        return rid if rid is not None and rid in self._given else None

    def _rows(self, batch: Any, pre: State) -> dict[str, ScheduledRow]:
        """The batch's rows (see ScheduledRow), by SGLang rid, in batch order."""
        if batch is None:
            return {}
        chunked = self.scheduler.chunked_req
        rows: dict[str, ScheduledRow] = {}
        if batch.forward_mode.is_decode():
            for req in batch.reqs:
                before = pre.requests[spec_id(req.rid)].num_computed_tokens
                rows[req.rid] = ScheduledRow(spec_id(req.rid), 1, before, True)
            return rows
        for req, prefix, extend in zip(
            batch.reqs, batch.prefix_lens, batch.extend_lens, strict=True
        ):
            samples = req is not chunked
            rows[req.rid] = ScheduledRow(spec_id(req.rid), int(extend), int(prefix), samples)
        return rows

    def _process(
        self, launched: _Launched, sampled: Mapping[str, Sequence[int]]
    ) -> dict[str, RequestOutput]:
        """process_batch_result on the launched batch, the harness's token in each row."""
        batch = launched.batch
        tokens = []
        pool = _slot_rows(self.scheduler)
        for req in batch.reqs:
            emitted = sampled.get(spec_id(req.rid), ())
            tokens.append(emitted[-1] if emitted else _UNREAD_TOKEN)
            if emitted and not req.finished() and not req.is_retracted:
                # SGLang appends the token and may finish the request and put its slots
                # into the radix cache in this one call, with no look in between: the
                # content of the block the token completes is recorded now.
                allocated = req.kv.kv_allocated_len
                row = pool[req.kv.req_pool_idx, :allocated].tolist() if allocated else []
                self._contents.observe(req.rid, [*known_tokens(req), emitted[-1]], row)
        before = {req.rid: len(req.output_ids) for req in batch.reqs}
        launched.result.next_token_ids = self._v.torch.tensor(tokens, dtype=self._v.torch.int64)
        self.scheduler.process_batch_result(batch, launched.result)
        reported: dict[str, RequestOutput] = {}
        for req in batch.reqs:
            if req.rid not in self._given:
                continue  # finished or aborted earlier
            # What SGLang delivers stops at finished_len (output_ids_through_stop): a
            # stop demoted to a length finish at the cap is sampled but not delivered.
            new_tokens = tuple(int(t) for t in req.output_ids_through_stop[before[req.rid] :])
            status = finish_status(req.finished_reason)
            if new_tokens or status is not None:
                reported[spec_id(req.rid)] = RequestOutput(spec_id(req.rid), new_tokens, status)
        return reported

    # ---------------------------------------------------- the refinement mapping

    def snapshot(self) -> State:
        """The refinement mapping of SGLang's state, read once per change: every call
        that changes SGLang's state (or the steps in flight) drops the one read last."""
        if self._state is None:
            self._state = self._read_state()
        return self._state

    def _changing(self) -> None:
        """About to change SGLang's state or the steps in flight: the last read is stale."""
        self._state = None

    def _read_state(self) -> State:
        s = self.scheduler
        waiting = [req for req in s.waiting_queue if not req.finished()]
        running = running_reqs(
            s,
            (launched.batch for launched in self._in_flight if launched.batch is not None),
            self._given,
            self._running_order,
        )
        live = {req.rid: req for req in (*running, *waiting)}
        # Forget requests that finished or were aborted since the last look.
        for rid in [r for r in self._given if r not in live]:
            self._forget(rid)
        tables: dict[str, tuple[int, ...]] = {}  # the running requests' block tables
        pool = _slot_rows(s)
        observe = self._contents.observe
        for req in running:
            allocated = req.kv.kv_allocated_len
            row = pool[req.kv.req_pool_idx, :allocated].tolist() if allocated else []
            tables[req.rid] = observe(req.rid, known_tokens(req), row)
        requests: dict[str, RequestState] = {}
        # Bound once: this runs per live request per change.
        state_of, in_flight, given = self._request_states.of, self._pipeline.of, self._given
        finish_abort = self._v.FINISH_ABORT
        for rid, req in live.items():
            blocks = tables.get(rid)  # None: not running
            requests[spec_id(rid)] = state_of(
                req,
                given[rid],
                in_flight(rid),
                running=blocks is not None,
                blocks=blocks or (),
                aborting=abort_pending(s, req, finish_abort),
            )
        running_order = tuple(spec_id(req.rid) for req in running)
        self._running_order = running_order
        return State(
            config=self.config,
            requests=requests,
            waiting=tuple(spec_id(req.rid) for req in waiting),
            running=running_order,
            kv=self._kv.read(s, requests),
            sglang=SGLangState(
                new_token_ratio=float(s.new_token_ratio_tracker.current),
                batch_is_full=bool(s.running_batch.batch_is_full),
                chunked_request_id=(
                    spec_id(s.chunked_req.rid)
                    if s.chunked_req is not None and not s.chunked_req.finished()
                    else None
                ),
                last_batch_kind=self._last_kind,
                # The Rust radix tree exposes no access times (docs/FINDINGS.md G2): the
                # evictable tail is listed by block id, not in eviction order.
                eviction_order_observed=False,
            ),
        )

    def _forget(self, rid: str) -> None:
        del self._given[rid]
        self._pipeline.forget(rid)
        self._request_states.forget(rid)
        self._contents.forget(self._given)
        request_id = spec_id(rid)
        if self._rid.get(request_id) == rid:
            del self._rid[request_id]


def _slot_rows(scheduler: Any) -> Any:
    """SGLang's req_to_token table (each request's token slots, a row per pool index) as
    a NumPy view of the same memory (the pool is on the CPU): a row read through it costs
    a fraction of a torch index and tolist, and this runs per running request per read."""
    return scheduler.req_to_token_pool.req_to_token.numpy()
