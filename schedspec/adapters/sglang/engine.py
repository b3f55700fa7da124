"""SGLang's scheduler under schedspec: an EngineAdapter, on CPU, with no model download.

SGLang 0.5.23's real `Scheduler` runs in this process (adapters/sglang/runtime.py says
how it is built and what stands in for a GPU). Install it into a venv of its own with
`scripts/install_sglang.sh VENV_DIR`; SGLang is imported only when an engine is built.

Translation of the config (family "sglang", docs/SPEC.md "Two families"): page_size =
block_size; max_total_tokens = num_blocks * block_size; context_length = max_model_len;
max_running_requests = max_num_seqs; with chunked prefill chunked_prefill_size =
max_num_batched_tokens (max_prefill_tokens left at SGLang's 16384, never the tighter
bound here), without it chunked_prefill_size = -1 and max_prefill_tokens =
max_num_batched_tokens (SGLang then bounds a prefill batch by that); disable_radix_cache
= not enable_prefix_caching; schedule_conservativeness and enable_mixed_chunk as they
are; the overlap scheduler exactly when async_scheduling (disable_overlap_schedule
otherwise); schedule_policy fcfs. `_check_translation` refuses to go on if SGLang's
argument resolution changed any of these.

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
SGLang's message, so the spec's DOOR judges the refusal. Each request gets the SGLang rid
"<arrival>#<spec id>": SGLang aborts every request whose rid starts with the aborted one,
and no rid starts with another's "<arrival>#"; ids are translated back everywhere.
finish_requests aborts one id at a time through SGLang's abort_request: a waiting request
leaves at once, a running one is marked and finishes when its next forward lands.

The refinement mapping (`snapshot`) is adapters/sglang/kv.py's for the pool and the radix
cache, and, per request: SGLang's prompt and output ids, its allocated KV length as the
computed count, status (a request in the waiting queue is PREEMPTED once retracted,
else WAITING; a request in the running batch, the batch just formed or the chunked one
is RUNNING), retraction count, clipped max_new_tokens, and the in-flight counters
(sglang_output.Pipeline). waiting is SGLang's waiting queue; running is the order the
running batch will have after the next merge: the running batch, the unmerged requests
of the last prefill batch, requests a queued result is about to finish, then the chunked
request. `State.sglang` carries new_token_ratio, the batch_is_full latch, the chunked
request and the kind of the last batch.
"""

from __future__ import annotations

import weakref
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st

from schedspec.adapters.sglang.kv import (
    SlotContents,
    TreeWalk,
    free_block_order,
    table_blocks,
)
from schedspec.adapters.sglang.output import BatchRow, Pipeline, spec_output
from schedspec.adapters.sglang.runtime import (
    INSTALL_STEP,
    MAX_CONTEXT_LENGTH,
    VOCAB_SIZE,
    Sglang,
    load_sglang,
)
from schedspec.properties.strategies.configs import sglang_configs
from schedspec.spec import (
    BatchKind,
    ConfigError,
    KVState,
    ModelRunnerOutput,
    OutputError,
    Request,
    RequestError,
    RequestOutput,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    SGLangState,
    State,
    validate_new_request,
)
from schedspec.spec.config import require_family
from schedspec.spec.invariants import Profile

__all__ = ["INSTALL_STEP", "SGLangEngine", "sglang_default_configs"]

# SGLang's prefill budget when chunked prefill is on (its max_prefill_tokens default).
SGLANG_MAX_PREFILL_TOKENS = 16384
# SGLang's initial new_token_ratio, before schedule_conservativeness scales it.
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
# A token the harness never samples: the result row of a request whose step samples
# nothing (a prefill chunk), which SGLang does not read.
_UNREAD_TOKEN = 0

# ------------------------------------------------------------------------- ids

RID_SEPARATOR = "#"


def sglang_rid(request_id: str, arrival: int) -> str:
    """The rid the adapter gives SGLang for the request_id's arrival-th request."""
    return f"{arrival}{RID_SEPARATOR}{request_id}"


def spec_id(rid: str) -> str:
    """The spec's request id behind an SGLang rid the adapter made (sglang_rid's inverse)."""
    return rid.partition(RID_SEPARATOR)[2]


# ------------------------------------------------------------------ the config


def max_running_requests(config: SchedulerConfig) -> int:
    """The most running requests SGLang allows with this pool: it caps
    max_running_requests at half the pool's tokens (KVCacheConfigurator.
    resolve_max_num_reqs), whatever was asked."""
    return config.num_blocks * config.block_size // 2


def refusal(config: SchedulerConfig) -> ConfigError | None:
    """Why the adapter cannot run this config as the spec states it (the field at fault
    and the reason), or None if it can."""
    if config.max_model_len > MAX_CONTEXT_LENGTH:
        return ConfigError(
            "max_model_len", f"above {MAX_CONTEXT_LENGTH}, the tiny model's position limit"
        )
    cap = max_running_requests(config)
    if config.max_num_seqs > cap:
        return ConfigError(
            "max_num_seqs",
            f"SGLang caps max_running_requests at half the pool's tokens, {cap} here: "
            f"got {config.max_num_seqs}",
        )
    return None


def _within_sglangs_caps(config: SchedulerConfig) -> SchedulerConfig:
    """The config with max_num_seqs lowered to what SGLang allows its pool."""
    return replace(config, max_num_seqs=min(config.max_num_seqs, max_running_requests(config)))


def sglang_default_configs(max_model_len_cap: int = 96) -> st.SearchStrategy[SchedulerConfig]:
    """`--engine sglang`'s default configs: the suite's SGLang-family configs (page sizes
    1, 2 and 4, chunked prefill on and off, radix cache on and off, conservativeness
    1, 0.3 and 0.1, mixed chunk on and off, plain and overlap loops), max_num_seqs
    within SGLang's cap."""
    return sglang_configs(max_model_len_cap).map(_within_sglangs_caps)


def server_args(v: Sglang, config: SchedulerConfig) -> Any:
    """SGLang's ServerArgs for the config (the module docstring's translation)."""
    chunked = config.enable_chunked_prefill
    return v.ServerArgs(
        model_path=v.model_dir,
        device="cpu",
        skip_tokenizer_init=True,
        load_format="dummy",
        disable_cuda_graph=True,
        attention_backend="torch_native",
        log_level="error",
        random_seed=0,
        page_size=config.block_size,
        max_total_tokens=config.num_blocks * config.block_size,
        context_length=config.max_model_len,
        chunked_prefill_size=config.max_num_batched_tokens if chunked else -1,
        max_prefill_tokens=(
            SGLANG_MAX_PREFILL_TOKENS if chunked else config.max_num_batched_tokens
        ),
        max_running_requests=config.max_num_seqs,
        schedule_policy="fcfs",
        schedule_conservativeness=config.schedule_conservativeness,
        enable_mixed_chunk=config.enable_mixed_chunk,
        disable_radix_cache=not config.enable_prefix_caching,
        disable_overlap_schedule=not config.async_scheduling,
    )


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
class _Built:
    scheduler: Any
    outputs: Any  # the PULL socket standing in for the tokenizer manager


def build_scheduler(v: Sglang, config: SchedulerConfig) -> _Built:
    """SGLang's Scheduler for the config, built by its own __init__ (sglang_runtime)."""
    refused = refusal(config)
    if refused is not None:
        raise refused
    built = start_scheduler(v, server_args(v, config))
    _check_translation(built.scheduler, config)
    return built


def start_scheduler(v: Sglang, args: Any) -> _Built:
    """SGLang's Scheduler for its ServerArgs `args`, with the socket that stands in for
    the tokenizer manager (build_scheduler's, for a config; tests give SGLang arguments
    no config expresses)."""
    ports = v.PortArgs.init_new(args)
    # Bound before the scheduler connects (sglang_runtime, 4).
    outputs = v.zmq.Context.instance().socket(v.zmq.PULL)
    outputs.setsockopt(v.zmq.LINGER, 0)
    outputs.bind(ports.tokenizer_ipc_name)
    ranks = v.SpawnRanks(
        world_rank=v.spawn_world_rank(args, tp_rank=0, pp_rank=0), dp_rank=None, gpu_id=0
    )
    v.publish(args, role="scheduler", ranks=ranks)
    return _Built(v.Scheduler(args, ports), outputs)


def _check_translation(scheduler: Any, config: SchedulerConfig) -> None:
    """SGLang's argument resolution may rewrite a value; refuse to test anything but ours."""
    chunked = config.enable_chunked_prefill
    seen = {
        "page_size": scheduler.page_size,
        "max_total_num_tokens": scheduler.max_total_num_tokens,
        "available_tokens": scheduler.token_to_kv_pool_allocator.available_size(),
        "context_len": scheduler.model_config.context_len,
        "chunked_prefill_size": scheduler.chunked_prefill_size,
        "max_prefill_tokens": scheduler.max_prefill_tokens,
        "max_running_requests": scheduler.max_running_requests,
        "radix_cache": not scheduler.tree_cache.disable,
        "mixed_chunk": scheduler.is_mixed_chunk,
        "overlap": scheduler.enable_overlap,
        "initial_new_token_ratio": scheduler.new_token_ratio_tracker.init,
    }
    wanted = {
        "page_size": config.block_size,
        "max_total_num_tokens": config.num_blocks * config.block_size,
        "available_tokens": config.num_blocks * config.block_size,
        "context_len": config.max_model_len,
        "chunked_prefill_size": config.max_num_batched_tokens if chunked else None,
        "max_prefill_tokens": (
            SGLANG_MAX_PREFILL_TOKENS if chunked else config.max_num_batched_tokens
        ),
        "max_running_requests": config.max_num_seqs,
        "radix_cache": config.enable_prefix_caching,
        "mixed_chunk": config.enable_mixed_chunk,
        "overlap": config.async_scheduling,
        "initial_new_token_ratio": min(
            SGLANG_INIT_NEW_TOKEN_RATIO * config.schedule_conservativeness, 1.0
        ),
    }
    differ = {name: (wanted[name], got) for name, got in seen.items() if got != wanted[name]}
    if differ:
        raise RuntimeError(f"SGLang did not take the config as given (wanted, got): {differ}")


# ------------------------------------------------------------------- the adapter

_FINISH_STATUS = {
    "FINISH_MATCHED_TOKEN": RequestStatus.FINISHED_STOPPED,
    "FINISH_LENGTH": RequestStatus.FINISHED_LENGTH_CAPPED,
    "FINISH_ABORT": RequestStatus.FINISHED_ABORTED,
}
_BATCH_KIND: dict[str, BatchKind] = {"EXTEND": "extend", "DECODE": "decode", "MIXED": "mixed"}


@dataclass(frozen=True)
class _Given:
    """What the harness said about a request that SGLang keeps in other words."""

    arrival: int
    priority: int
    eos_token_id: int | None
    stop_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class _Launched:
    """A step in flight: the spec's output, SGLang's batch and result (None: idle), and
    its rows by SGLang rid."""

    output: SchedulerOutput
    batch: Any
    result: Any
    rows: dict[str, BatchRow]


class SGLangEngine:
    """SGLang 0.5.23's Scheduler seen through the spec. It claims the sglang profile:
    it is the policy that profile states."""

    profiles: frozenset[Profile] = frozenset({"safety", "sglang"})

    def __init__(self, config: SchedulerConfig) -> None:
        require_family(config, "SGLang's scheduler", ("sglang",))
        self.config = config
        self._v = load_sglang()
        built = build_scheduler(self._v, config)
        self.scheduler: Any = built.scheduler
        self._outputs = built.outputs
        weakref.finalize(self, built.outputs.close, 0)
        self._num_arrivals = 0
        self._given: dict[str, _Given] = {}  # by SGLang rid, live requests
        self._rid: dict[str, str] = {}  # spec id -> SGLang rid of its latest request
        self._in_flight: deque[_Launched] = deque()
        self._pipeline = Pipeline(config.async_scheduling)
        self._contents = SlotContents(config.block_size)
        # Requests that finished since the last schedule() (spec ids), and the running
        # order of the last snapshot (for requests a queued result is about to finish).
        self._finished: set[str] = set()
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
        params.verify(VOCAB_SIZE)
        s = self.scheduler
        queued = len(s.waiting_queue)
        self._changing()
        s.handle_generate_request(generate_request(v, rid, request.prompt_token_ids, params))
        self._drain_outputs()
        added = [r for r in s.waiting_queue[queued:] if r.rid == rid]
        if len(added) != 1 or len(s.waiting_queue) != queued + 1:
            raise RuntimeError(f"SGLang did not queue request {rid!r} once at the back")
        req = added[0]
        if req.to_finish is not None or req.finished():
            # SGLang's door: queued already finished. Taken back before anything runs it.
            s.waiting_queue.pop()
            reason = req.to_finish or req.finished_reason
            raise RequestError("prompt_token_ids", f"SGLang refused it: {_message(reason)}")
        self._num_arrivals += 1
        self._rid[request.request_id] = rid
        self._given[rid] = _Given(
            arrival=self._num_arrivals - 1,
            priority=request.priority,
            eos_token_id=request.eos_token_id,
            stop_token_ids=tuple(request.stop_token_ids),
        )

    def schedule(self) -> SchedulerOutput:
        s = self.scheduler
        pre = self.snapshot()
        self._changing()
        # Requests that vanish inside this call (an aborted chunked request, SGLang's
        # abort of the last request retraction cannot fit) are the next call's to report.
        reported = frozenset(self._finished)
        self._finished.clear()
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        for req in s.waiting_queue:
            if req.is_retracted and spec_id(req.rid) in pre.running:
                self._pipeline.on_retract(req.rid)
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
        self._note_finished(pre, post)
        output = spec_output(tuple(rows.values()), pre, post, reported)
        self._in_flight.append(_Launched(output, launched_batch, result, rows))
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        """Process the oldest launched batch's result with the harness's tokens; return
        each of its requests that sampled or finished: its new tokens and finish status."""
        if not self._in_flight or (
            self._in_flight[0].output is not scheduler_output
            and self._in_flight[0].output != scheduler_output
        ):
            raise OutputError("scheduler_output", "not the oldest schedule() output in flight")
        sampled = model_runner_output.sampled_token_ids
        strangers = sorted(set(sampled) - set(scheduler_output.num_scheduled_tokens))
        if strangers:
            raise OutputError("sampled_token_ids", f"requests not scheduled: {strangers}")
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
        self._note_finished(pre, post)
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
        self._drain_outputs()
        post = self.snapshot()
        self._note_finished(pre, post)

    # --------------------------------------------------------------- helpers

    def _live_rid(self, request_id: str) -> str | None:
        """SGLang's rid of the live request the spec calls request_id, if there is one."""
        rid = self._rid.get(request_id)
        return rid if rid is not None and rid in self._given else None

    def _rows(self, batch: Any, pre: State) -> dict[str, BatchRow]:
        """The batch's rows (see BatchRow), by SGLang rid, in batch order."""
        if batch is None:
            return {}
        chunked = self.scheduler.chunked_req
        rows: dict[str, BatchRow] = {}
        if batch.forward_mode.is_decode():
            for req in batch.reqs:
                before = pre.requests[spec_id(req.rid)].num_computed_tokens
                rows[req.rid] = BatchRow(spec_id(req.rid), 1, before, True)
            return rows
        for req, prefix, extend in zip(
            batch.reqs, batch.prefix_lens, batch.extend_lens, strict=True
        ):
            samples = req is not chunked
            rows[req.rid] = BatchRow(spec_id(req.rid), int(extend), int(prefix), samples)
        return rows

    def _process(
        self, launched: _Launched, sampled: Mapping[str, Sequence[int]]
    ) -> dict[str, RequestOutput]:
        """process_batch_result on the launched batch, the harness's token in each row."""
        batch = launched.batch
        tokens = []
        pool = self.scheduler.req_to_token_pool.req_to_token
        for req in batch.reqs:
            emitted = sampled.get(spec_id(req.rid), ())
            tokens.append(emitted[-1] if emitted else _UNREAD_TOKEN)
            if emitted and not req.finished() and not req.is_retracted:
                # SGLang appends the token and may finish the request and put its slots
                # into the radix cache in this one call, with no look in between: the
                # content of the block the token completes is recorded now.
                allocated = req.kv.kv_allocated_len
                row = pool[req.kv.req_pool_idx, :allocated].tolist() if allocated else []
                self._contents.observe(req.rid, [*_tokens(req), emitted[-1]], row)
        before = {req.rid: len(req.output_ids) for req in batch.reqs}
        launched.result.next_token_ids = self._v.torch.tensor(tokens, dtype=self._v.torch.int64)
        self.scheduler.process_batch_result(batch, launched.result)
        self._drain_outputs()
        reported: dict[str, RequestOutput] = {}
        for req in batch.reqs:
            if req.rid not in self._given:
                continue  # finished or aborted earlier
            new_tokens = tuple(int(t) for t in req.output_ids[before[req.rid] :])
            status = _finish_status(req.finished_reason)
            if new_tokens or status is not None:
                reported[spec_id(req.rid)] = RequestOutput(spec_id(req.rid), new_tokens, status)
        return reported

    def _note_finished(self, pre: State, post: State) -> None:
        """Requests live before a call and gone after it finished during it."""
        for request_id in pre.requests:
            if request_id not in post.requests:
                self._finished.add(request_id)

    def _drain_outputs(self) -> None:
        """Read and drop what the scheduler streamed to the tokenizer manager's socket, so
        that ZeroMQ's queue stays empty (the adapter reads outcomes from SGLang's Reqs)."""
        zmq = self._v.zmq
        while True:
            try:
                self._outputs.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

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
        page_size = self.config.block_size
        waiting = [req for req in s.waiting_queue if not req.finished()]
        running = self._running_reqs()
        live = {req.rid: req for req in (*running, *waiting)}
        # Forget requests that finished or were aborted since the last look.
        for rid in [r for r in self._given if r not in live]:
            self._forget(rid)
        rows: dict[str, list[int]] = {}
        pool = s.req_to_token_pool.req_to_token
        for req in running:
            allocated = req.kv.kv_allocated_len
            row = pool[req.kv.req_pool_idx, :allocated].tolist() if allocated else []
            rows[req.rid] = row
            self._contents.observe(req.rid, _tokens(req), row)
        requests: dict[str, RequestState] = {}
        running_ids = {req.rid for req in running}
        for rid, req in live.items():
            requests[spec_id(rid)] = self._request_state(
                req, rid in running_ids, table_blocks(rows.get(rid, ()), page_size)
            )
        running_order = tuple(spec_id(req.rid) for req in running)
        self._running_order = running_order
        return State(
            config=self.config,
            requests=requests,
            waiting=tuple(spec_id(req.rid) for req in waiting),
            running=running_order,
            kv=self._kv_state(requests),
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

    def _running_reqs(self) -> list[Any]:
        """The running requests in the order the running batch will have after the next
        merge (module docstring)."""
        s = self.scheduler
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
            for launched in self._in_flight
            if launched.batch is not None
            for req in launched.batch.reqs
            if not req.finished()
            and req.rid not in placed
            and req.rid not in waiting
            and req is not chunked
            and req.rid in self._given
        }
        order = {rid: i for i, rid in enumerate(self._running_order)}
        for rid in sorted(leaving, key=lambda r: order.get(spec_id(r), len(order))):
            placed[rid] = leaving[rid]
        if chunked is not None and not chunked.finished():
            placed.setdefault(chunked.rid, chunked)
        return list(placed.values())

    def _request_state(self, req: Any, running: bool, blocks: tuple[int, ...]) -> RequestState:
        given = self._given[req.rid]
        counters = self._pipeline.of(req.rid)
        if running:
            status = RequestStatus.RUNNING
        elif req.retraction_count:
            status = RequestStatus.PREEMPTED
        else:
            status = RequestStatus.WAITING
        return RequestState(
            request_id=spec_id(req.rid),
            priority=given.priority,
            arrival=given.arrival,
            prompt_token_ids=tuple(int(t) for t in req.origin_input_ids),
            output_token_ids=tuple(int(t) for t in req.output_ids),
            spec_token_ids=(),
            num_computed_tokens=req.kv.kv_allocated_len if running else 0,
            status=status,
            block_ids=blocks,
            num_preemptions=int(req.retraction_count),
            max_tokens=max(1, int(req.sampling_params.max_new_tokens)),
            eos_token_id=given.eos_token_id,
            stop_token_ids=given.stop_token_ids,
            num_in_flight_tokens=counters.tokens,
            num_output_placeholders=counters.placeholders,
            num_stale_output_tokens=counters.stale,
            drop_stale_output=counters.drop_stale,
            abort_pending=self._abort_pending(req),
            is_prefill_chunk=counters.prefill_chunk,
        )

    def _abort_pending(self, req: Any) -> bool:
        """abort_request marked it (to_finish, or the chunked request's deferred abort)
        and it finishes when the next step that runs it lands."""
        s = self.scheduler
        return isinstance(req.to_finish, self._v.FINISH_ABORT) or (
            s._pending_chunked_abort_req is req
        )

    def _kv_state(self, requests: Mapping[str, RequestState]) -> KVState:
        s = self.scheduler
        page_size = self.config.block_size
        num_blocks = self.config.num_blocks
        held = [0] * num_blocks
        for request in requests.values():
            for block in request.block_ids:
                if 0 <= block < num_blocks:
                    held[block] += 1
        hashes: list[int | None] = [None] * num_blocks
        cached: dict[int, list[int]] = {}
        evictable: tuple[int, ...] = ()
        if not s.tree_cache.disable:
            core = s.tree_cache.tree_core
            walk = TreeWalk.of(core, unlocked_only=False)
            walk.check(self._contents)
            for block in walk.blocks(page_size):
                content = self._contents.content_of(block)
                hashes[block] = content
                cached.setdefault(content, []).append(block)
            evictable = TreeWalk.of(core, unlocked_only=True).blocks(page_size)
        return KVState(
            num_blocks=num_blocks,
            free_block_ids=free_block_order(s.token_to_kv_pool_allocator, evictable),
            ref_counts=tuple(held),
            block_hashes=tuple(hashes),
            prefix_cache=tuple((h, tuple(blocks)) for h, blocks in cached.items()),
        )

    def _forget(self, rid: str) -> None:
        del self._given[rid]
        self._pipeline.forget(rid)
        self._contents.forget(self._given)
        request_id = spec_id(rid)
        if self._rid.get(request_id) == rid:
            del self._rid[request_id]


def _tokens(req: Any) -> list[int]:
    """A request's known tokens: its prompt, then its outputs."""
    return [*req.origin_input_ids, *req.output_ids]


def _finish_status(reason: Any) -> RequestStatus | None:
    """SGLang's finish reason (None while live) as the spec's status."""
    if reason is None:
        return None
    status = _FINISH_STATUS.get(type(reason).__name__)
    if status is None:
        # Stop strings, regexes and vocabulary-boundary finishes need inputs the
        # harness never gives; seeing one is an adapter gap.
        raise RuntimeError(f"SGLang finish reason {type(reason).__name__}")
    return status


def _message(reason: Any) -> str:
    """The text of an SGLang finish reason."""
    found = reason.to_json() if hasattr(reason, "to_json") else reason
    if isinstance(found, dict):
        return str(found.get("message", found))
    return str(found)
