"""The reference scheduler's SGLang family: SGLang 0.5.23's scheduling policy, one rule per method.

Each step is one iteration of SGLang's event loop (Scheduler.get_next_batch_to_run,
then, when it lands, process_batch_result), seen through the spec's calls:
schedule() forms the step's batch and update_from_output() processes its
result. The policy, with SGLang's names:

- Prefill first. The previous step's prefill batch joins the running batch; then
  a prefill batch is formed if anything can be admitted (the chunked request's
  next chunk first, then waiting requests in queue order), and only if none
  forms do the running requests decode, one token each.
- Admission reserves each new request's whole future (sglang/admission.py); the
  first one that does not fit closes the admission latch (batch_is_full) until
  a request leaves the running batch.
- At most one chunked request; between its chunks it is cached in the radix
  tree and stays out of the running batch.
- A decode that cannot get its slots, even after evicting the tree, retracts
  the requests with the fewest outputs (ties: the longest prompt) until it fits,
  keeping at least one. Victims go to the back of the waiting queue with their
  outputs, and new_token_ratio jumps.
- Overlap scheduling (async_scheduling): the next step is formed before this
  one's result is processed; requests whose result in flight finishes them by
  length are left out of it, and a retracted request's result in flight is
  dropped.
- Aborts of running requests are deferred: the request runs once more and
  finishes aborted when that step lands; the chunked request is dropped at
  the start of the next step.

The abstract state (docs/SPEC.md, "Two families") is the spec's: pages are
blocks, the radix tree's pages are cached blocks, evictable ones are free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from schedspec.reference.sglang.admission import AddResult, NewTokenRatio, PrefillAdder
from schedspec.reference.sglang.batch import Batch
from schedspec.reference.sglang.kv import SGLangKV
from schedspec.reference.sglang.req import SGLangReq
from schedspec.spec import (
    BlockHash,
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
    SGLangState,
    State,
    validate_new_request,
)
from schedspec.spec.config import require_family
from schedspec.spec.outputs import sampling_requests
from schedspec.spec.request import check_token_ids, sglang_max_new_tokens
from schedspec.spec.sglang_arithmetic import prefill_budgets
from schedspec.spec.sglang_refresh import WAITING_QUEUE_PREFIX_MATCH_MAX, pass_refreshes
from schedspec.spec.state import BatchKind


@dataclass(frozen=True)
class _InFlight:
    """A scheduled step whose result has not been processed: the batch as it ran."""

    output: SchedulerOutput
    mode: str
    reqs: tuple[SGLangReq, ...]
    decoding_reqs: frozenset[int]  # ids of the mixed batch's decoding requests


class SGLangScheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        require_family(config, "the reference's SGLang family", ("sglang",))
        self.config = config
        self.page_size = config.block_size
        self.kv = SGLangKV(
            config.num_blocks, config.block_size, config.enable_prefix_caching, config.max_num_seqs
        )
        self.new_token_ratio = NewTokenRatio(config.schedule_conservativeness)
        self.max_prefill_tokens, self.chunked_prefill_size = prefill_budgets(config)
        self.overlap = config.async_scheduling
        self.reqs: dict[str, SGLangReq] = {}  # every unfinished request
        self.waiting: list[SGLangReq] = []
        self.running_batch = Batch([], "decode")
        self.last_batch: Batch | None = None
        self.chunked_req: SGLangReq | None = None
        self.pending_chunked_abort: SGLangReq | None = None
        # Left out of the running batch because their result in flight ends them (overlap).
        self.finishing_in_flight: list[SGLangReq] = []
        self.finished_req_ids: set[str] = set()  # since the previous schedule()
        self.last_batch_kind: BatchKind | None = None
        self._refresh_calls = 0
        self._num_arrivals = 0
        self._in_flight: deque[_InFlight] = deque()

    # ----------------------------------------------------------------- requests

    def add_request(self, request: Request) -> None:
        """The door: the spec's (and SGLang's) refusals, then max_new_tokens clipped
        as SGLang clips it (init_req_max_new_tokens); the request queues at the back."""
        validate_new_request(request, self.config)
        if request.request_id in self.reqs:
            raise RequestError("request_id", f"duplicate request id {request.request_id!r}")
        max_new = sglang_max_new_tokens(self.config, request.num_prompt_tokens, request.max_tokens)
        request.max_tokens = max(1, max_new)
        request.arrival = self._num_arrivals
        self._num_arrivals += 1
        req = SGLangReq(request, max_new)
        self.reqs[request.request_id] = req
        self.waiting.append(req)

    def finish_requests(self, request_ids: str | Iterable[str]) -> None:
        """SGLang's abort_request: a waiting request leaves at once; the chunked one
        is dropped at the start of the next step; any other running one runs once
        more and finishes aborted when that step lands. One whose result in flight
        finishes it by length is out of reach and finishes so."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            if not isinstance(rid, str):
                raise RequestError("request_ids", f"ids must be str, got {rid!r}")
        for rid in dict.fromkeys(ids):
            req = self.reqs.get(rid)
            if req is not None:
                self._abort(req)

    def _abort(self, req: SGLangReq) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            return
        # Every running request finishes when its next result lands (or, the chunked
        # one, at the next schedule): the abort is pending until then.
        req.request.abort_pending = True
        if req is self.chunked_req:
            self.pending_chunked_abort = req
        if any(req is r for r in self._in_flight_batch_reqs()):
            req.to_finish = True

    def _in_flight_batch_reqs(self) -> list[SGLangReq]:
        """collect_inflight_reqs: the running batch and the last batch formed."""
        reqs = list(self.running_batch.reqs)
        if self.last_batch is not None:
            reqs += self.last_batch.reqs
        return [r for r in reqs if not r.finished]

    def _finish(self, req: SGLangReq, status: RequestStatus) -> None:
        req.finished = True
        req.request.status = status
        del self.reqs[req.rid]
        self.finished_req_ids.add(req.rid)
        if req in self.finishing_in_flight:
            self.finishing_in_flight.remove(req)

    @property
    def requests(self) -> dict[str, Request]:
        """Every unfinished request (the spec Requests), as the vLLM family's scheduler has."""
        return {rid: req.request for rid, req in self.reqs.items()}

    @property
    def running(self) -> list[Request]:
        """The running requests in the abstract state's order."""
        return [req.request for req in self.running_order()]

    def has_unfinished_requests(self) -> bool:
        return bool(self.reqs)

    def get_num_unfinished_requests(self) -> int:
        return len(self.reqs)

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """SGLang's family has no drafts here: only empty proposals are accepted."""
        for rid, drafts in draft_token_ids.items():
            check_token_ids("draft_token_ids", drafts, OutputError)
            if drafts:
                raise OutputError(
                    "draft_token_ids",
                    f"request {rid!r}: at most num_speculative_tokens (0) drafts, "
                    f"got {len(drafts)}",
                )

    # ----------------------------------------------------------------- schedule

    def schedule(self) -> SchedulerOutput:
        finished_before = frozenset(self.finished_req_ids)
        self.finished_req_ids = set()
        self._process_pending_chunked_abort()
        retracted: list[SGLangReq] = []
        batch = self._get_next_batch_to_run(retracted)
        if batch is None:
            self._on_idle()
        output = self._build_output(batch, retracted, finished_before)
        self._mark_scheduled(output, batch)
        self._in_flight.append(
            _InFlight(
                output,
                batch.mode if batch is not None else "idle",
                tuple(batch.reqs) if batch is not None else (),
                frozenset(map(id, batch.decoding_reqs)) if batch is not None else frozenset(),
            )
        )
        self.last_batch = batch
        self.last_batch_kind = batch.mode if batch is not None else "idle"
        return output

    def _process_pending_chunked_abort(self) -> None:
        """An abort of the chunked request takes effect before the next chunk: its KV
        is released uncached and it is gone (reported with the next schedule)."""
        req, self.pending_chunked_abort = self.pending_chunked_abort, None
        if req is None or req is not self.chunked_req:
            return
        req.to_finish = False
        self.kv.release(req, checkpoint=False)
        self.chunked_req = None
        self._finish(req, RequestStatus.FINISHED_ABORTED)

    def _get_next_batch_to_run(self, retracted: list[SGLangReq]) -> Batch | None:
        """Merge the last prefill batch into the running batch, then prefill if any
        prefill batch forms, else decode the running batch."""
        running = self._merge_last_batch()
        if running.filter():
            running.batch_is_full = False
        new_batch, running = self._get_new_batch_prefill(running)
        self.running_batch = running
        if new_batch is not None:
            return new_batch
        if running.is_empty() or running.is_prefill_only:
            return None
        # No prefill batch formed though a request is chunked: the pass held its chunk
        # back (the pool had no slot for it), and the decode may retract it first.
        decode = self._update_running_batch(running, retracted, held_back=self.chunked_req)
        return decode if decode is not None and not decode.is_empty() else None

    def _merge_last_batch(self) -> Batch:
        """Cache the chunked request's last chunk, and let the last prefill batch's
        requests (all but the chunked one) join the running batch."""
        excluded: list[SGLangReq] = []
        chunked = self.chunked_req
        if chunked is not None:
            excluded.append(chunked)
            if chunked.extend_end > chunked.prefix_len:
                self._checkpoint(chunked)
        running = self.running_batch
        last = self.last_batch
        if last is None or not last.is_extend:
            return running
        if last.chunked_req is not None:
            excluded.append(last.chunked_req)
        if last.filter(excluded):
            running.batch_is_full = False
        if last.is_empty() or last is running:
            return running
        if running.is_empty():
            return last
        running.merge(last)
        return running

    def _checkpoint(self, req: SGLangReq) -> None:
        """checkpoint_kv_cache: cache what the request computed; its next extend
        starts after it."""
        self.kv.checkpoint(req, req.extend_end)
        req.prefix_len = req.extend_end

    # ----------------------------------------------------------------- prefill

    def _num_allocatable(self, running_bs: int, num_held_rows: int = 0) -> int:
        """Requests that may still join: seats under max_running_requests and free rows."""
        return min(
            self.config.max_num_seqs - running_bs,
            max(self.kv.rows_available() + num_held_rows, 0),
        )

    def _get_new_batch_prefill(self, running: Batch) -> tuple[Batch | None, Batch]:
        if running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None, running
        if self._num_allocatable(len(running.reqs)) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None, running
        self._touch_waiting_prefixes()
        adder = PrefillAdder(
            self.kv,
            running.reqs,
            self.new_token_ratio.current,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
            len(running.reqs) if self.config.enable_mixed_chunk else 0,
        )
        if self.chunked_req is not None:
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        self._admit_waiting(adder, running)
        can_run = adder.can_run_list
        if not can_run:
            return None, running
        admitted = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        new_batch = Batch(can_run, "extend")
        if self.chunked_req is not None and id(self.chunked_req) in admitted:
            self.chunked_req.inflight_middle_chunks += 1
            new_batch.chunked_req = self.chunked_req
        self.kv.alloc_for_extend(can_run)
        for req in can_run:
            req.is_retracted = False
        if self.config.enable_mixed_chunk and not running.is_empty():
            running = self._mix_running(new_batch, running)
        return new_batch, running

    def _touch_waiting_prefixes(self) -> None:
        """Every 32nd prefill pass, refresh the recency of the waiting requests'
        cached prefixes, the head last (so the LRU evicts in reverse queue order)."""
        if not self.waiting or not self.kv.tree.enabled:
            return
        refresh = pass_refreshes(self._refresh_calls)
        self._refresh_calls += 1
        if refresh:
            for req in reversed(self.waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
                self.kv.touch_prefix(req)

    def _admit_waiting(self, adder: PrefillAdder, running: Batch) -> None:
        """Waiting requests in queue order, until one does not fit (head-of-line)."""
        for req in self.waiting:
            if adder.budget_state() is AddResult.OTHER:
                break
            held = sum(1 for r in adder.can_run_list if r.row is not None)
            if len(adder.can_run_list) >= self._num_allocatable(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            self.kv.match_prefix(req)
            result = adder.add_one_req(req)
            if result is not AddResult.CONTINUE:
                if result is AddResult.NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or not running.is_empty()
                break

    def _mix_running(self, new_batch: Batch, running: Batch) -> Batch:
        """Mixed chunk: the running requests decode inside the prefill batch, if their
        slots fit; then the running batch is empty (the latch kept) until the next
        step merges the mixed batch back."""
        finishing = self._finishing_in_flight(running)
        running.filter(finishing)
        self.finishing_in_flight.extend(finishing)
        if finishing:
            running.batch_is_full = False
        if running.is_empty() or not self.kv.check_decode_mem(running.reqs):
            return running
        self.kv.alloc_for_decode(running.reqs)
        new_batch.mode = "mixed"
        new_batch.is_prefill_only = False
        new_batch.decoding_reqs = list(running.reqs)
        new_batch.reqs = new_batch.reqs + running.reqs
        return Batch([], "decode", batch_is_full=running.batch_is_full)

    def _finishing_in_flight(self, batch: Batch) -> list[SGLangReq]:
        """Overlap: requests whose result in flight brings them to max_new_tokens."""
        if not self.overlap or not self._in_flight:
            return []
        queued = set(map(id, self._in_flight[-1].reqs))
        return [r for r in batch.reqs if id(r) in queued and r.num_outputs + 1 >= r.max_new_tokens]

    # ----------------------------------------------------------------- decode

    def _update_running_batch(
        self, batch: Batch, retracted: list[SGLangReq], held_back: SGLangReq | None = None
    ) -> Batch | None:
        """The decode step: one token per running request; if their slots do not fit,
        retract until they do (`held_back`, a chunked request whose chunk this step held
        back, first). None when the step must wait for a result in flight."""
        initial_bs = len(batch.reqs)
        finishing = self._finishing_in_flight(batch)
        batch.filter(finishing)
        self.finishing_in_flight.extend(finishing)
        if batch.is_empty():
            batch.batch_is_full = False
            return batch
        if not self.kv.check_decode_mem(batch.reqs):
            if finishing:
                # The result in flight frees the finishing requests' KV: decode next step.
                batch.batch_is_full = False
                return None
            self._retract_decode(batch, retracted, held_back)
        else:
            self.new_token_ratio.decay_step()
        if len(batch.reqs) < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return batch
        self.kv.alloc_for_decode(batch.reqs)
        batch.mode = "decode"
        return batch

    @staticmethod
    def retraction_order(reqs: Sequence[SGLangReq]) -> list[int]:
        """Indices from the request to keep most to the first victim (the last): most
        outputs first, then shortest prompt; a stable sort keeps ties in batch order."""
        return sorted(
            range(len(reqs)),
            key=lambda i: (reqs[i].num_outputs, -reqs[i].request.num_prompt_tokens),
            reverse=True,
        )

    def _retract_decode(
        self, batch: Batch, retracted: list[SGLangReq], held_back: SGLangReq | None = None
    ) -> None:
        """retract_decode: pop victims off the end of the retraction order until the
        decode fits, always at least one and never the last; if even the last does
        not fit it is aborted. The batch keeps the survivors in retraction order.

        A chunked request held back this step (docs/SPEC.md, "A chunk the pool cannot
        hold") is the first victim: it holds slots and has no outputs, so it ranks below
        every decoding request; without this a lone decode beside it would be aborted."""
        order = self.retraction_order(batch.reqs)
        first = True
        if held_back is not None:
            self.kv.retract(held_back, len(order))
            self._preempt(held_back)
            retracted.append(held_back)
            self.chunked_req = None
            first = False
        while first or not self.kv.check_decode_mem([batch.reqs[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            victim = batch.reqs[order.pop()]
            self.kv.retract(victim, len(order))
            self._preempt(victim)
            retracted.append(victim)
        if len(order) <= 1 and not self.kv.check_decode_mem([batch.reqs[i] for i in order]):
            last = batch.reqs[order.pop()]
            self.kv.retract(last, 0)
            self._finish(last, RequestStatus.FINISHED_ABORTED)
        batch.reqs = [batch.reqs[i] for i in order]
        self.new_token_ratio.current = NewTokenRatio.after_retract(batch.reqs)
        self.waiting.extend(retracted)

    def _preempt(self, req: SGLangReq) -> None:
        """A retracted request in the abstract state: PREEMPTED, outputs kept, nothing
        computed; its result in flight (overlap) is stale and will be dropped."""
        request = req.request
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.drop_stale_output = request.num_in_flight_tokens > 0
        request.num_output_placeholders = 0

    # ----------------------------------------------------------------- idle

    def _on_idle(self) -> None:
        """A loop iteration that runs nothing resets new_token_ratio once nothing at
        all is left: no request anywhere and no batch behind (on_idle, is_fully_idle).
        The overlap loop only gets here with nothing in flight."""
        last = self.last_batch
        if self.overlap and last is not None:
            return
        if (
            self.running_batch.is_empty()
            and self.chunked_req is None
            and (last is None or last.is_empty())
            and not self.waiting
        ):
            self.new_token_ratio.reset()

    # ----------------------------------------------------------------- output

    def _build_output(
        self, batch: Batch | None, retracted: list[SGLangReq], finished: frozenset[str]
    ) -> SchedulerOutput:
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached_reqs: list[CachedRequestData] = []
        decoding = set(map(id, batch.decoding_reqs)) if batch is not None else set()
        for req in batch.reqs if batch is not None else ():
            request = req.request
            one = batch is not None and (batch.mode == "decode" or id(req) in decoding)
            num_scheduled[req.rid] = 1 if one else req.extend_len
            assert req.row is not None
            if request.status is RequestStatus.WAITING:
                new_reqs.append(
                    NewRequestData(
                        req.rid, request.prompt_token_ids, tuple(req.row), req.prefix_len
                    )
                )
                continue
            resumed = request.status is RequestStatus.PREEMPTED
            before = req.prefix_len if resumed else request.num_computed_tokens
            held = 0 if resumed else -(-before // self.page_size)
            cached_reqs.append(
                CachedRequestData(
                    req.rid,
                    resumed,
                    tuple(req.row[held:]),
                    before,
                    request.num_output_tokens + request.num_output_placeholders,
                )
            )
        return SchedulerOutput(
            scheduled_new_reqs=tuple(new_reqs),
            scheduled_cached_reqs=tuple(cached_reqs),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens={},
            preempted_req_ids=frozenset(r.rid for r in retracted),
            finished_req_ids=finished,
        )

    def _mark_scheduled(self, output: SchedulerOutput, batch: Batch | None) -> None:
        """The scheduled requests in the abstract state: running, their computed count
        at their KV, the step in flight (overlap: its output position a placeholder)."""
        if batch is None:
            return
        for req in batch.reqs:
            request = req.request
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = req.kv_committed_len
            request.num_in_flight_tokens += output.num_scheduled_tokens[req.rid]
            request.is_prefill_chunk = (
                request.num_computed_tokens < request.num_tokens + request.num_output_placeholders
            )
            if self.overlap and not request.is_prefill_chunk:
                request.num_output_placeholders += 1

    # ----------------------------------------------------------------- results

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        """process_batch_result: append each sampled token, finish what stops, cache
        finished requests' KV and free the rest; cache a finished prefill's prompt."""
        in_flight = self._in_flight
        if not in_flight or in_flight[0].output is not scheduler_output:
            raise OutputError(
                "scheduler_output",
                "must be the oldest step this scheduler scheduled and has not applied "
                "(outputs are applied once each, in the order scheduled)",
            )
        step = in_flight[0]
        by_rid = {r.rid: r for r in step.reqs}
        reqs = self.reqs
        # Output lands only on the request the step ran (a reused id names another).
        num_known_tokens = {
            rid: req.request.num_tokens for rid, req in by_rid.items() if reqs.get(rid) is req
        }
        sampling = sampling_requests(
            scheduler_output, model_runner_output.sampled_token_ids, num_known_tokens
        )
        in_flight.popleft()
        tokens = {rid: token_ids for rid, token_ids, _ in sampling}
        self._land_in_flight_tokens(scheduler_output, by_rid)
        outputs: dict[str, RequestOutput] = {}
        self.kv.pool.begin_group()
        for req in step.reqs:
            if step.mode == "decode":
                self._process_decode_req(req, tokens, outputs)
            else:
                self._process_prefill_req(req, id(req) in step.decoding_reqs, tokens, outputs)
        self.kv.pool.end_group()
        return outputs

    def _land_in_flight_tokens(
        self, output: SchedulerOutput, by_rid: Mapping[str, SGLangReq]
    ) -> None:
        """The step's tokens are no longer in flight for the requests it ran."""
        for rid, num_tokens in output.num_scheduled_tokens.items():
            req = by_rid[rid]
            if req.finished:
                continue
            request = req.request
            request.num_in_flight_tokens -= num_tokens
            if request.num_stale_output_tokens > 0:
                request.num_stale_output_tokens -= num_tokens
                if request.num_stale_output_tokens == 0:
                    request.drop_stale_output = False

    def _process_prefill_req(
        self,
        req: SGLangReq,
        decoding: bool,
        tokens: Mapping[str, Sequence[int]],
        outputs: dict[str, RequestOutput],
    ) -> None:
        """A prefill (or mixed) batch's request: a middle chunk samples nothing; else
        its token is appended, and a request that goes on has its prompt cached."""
        if (req.finished and req.inflight_middle_chunks <= 0) or req.is_retracted:
            return
        if req.inflight_middle_chunks > 0:
            req.inflight_middle_chunks -= 1
            return
        self._commit_token(req, tokens, outputs)
        if not req.finished and not decoding:
            self._checkpoint(req)

    def _process_decode_req(
        self, req: SGLangReq, tokens: Mapping[str, Sequence[int]], outputs: dict[str, RequestOutput]
    ) -> None:
        """A decode batch's request: its token is appended (overlap: not for a request
        that finished or was retracted since: that output is dropped)."""
        if req.finished or req.is_retracted:
            return
        self._commit_token(req, tokens, outputs)

    def _commit_token(
        self, req: SGLangReq, tokens: Mapping[str, Sequence[int]], outputs: dict[str, RequestOutput]
    ) -> None:
        """Append the sampled token, decide whether the request finished, and if it did
        cache its KV and release it (update_finish_state, release_kv_cache)."""
        request = req.request
        sampled = tokens[req.rid]
        before = request.num_output_tokens
        if request.num_output_placeholders > 0:
            request.num_output_placeholders -= len(sampled)
        for token in sampled:
            request.append_output_token_id(token)
        status = self._update_finish_state(req, sampled)
        if status is not None:
            self.kv.release(req, checkpoint=True)
            self._finish(req, status)
        # What SGLang hands the user stops at finished_len (output_ids_through_stop):
        # a stop demoted to the length cap is not delivered.
        delivered = len(sampled) if req.finished_len is None else req.finished_len - before
        confirmed = request.num_computed_tokens - request.num_in_flight_tokens
        outputs[req.rid] = RequestOutput(
            req.rid, tuple(sampled[: max(0, delivered)]), status, confirmed
        )

    def _update_finish_state(self, req: SGLangReq, sampled: Sequence[int]) -> RequestStatus | None:
        """SGLang's update_finish_state: a pending abort wins, then a stop or EOS
        token, then reaching max_new_tokens (at least one token is sampled). A stop
        past max_new_tokens is a length finish at max_new_tokens: with a clipped
        max_new_tokens of 0 the one token sampled may be a stop, and SGLang reports
        FINISH_LENGTH(0) with nothing delivered (_cap_finished_len_at_max_new_tokens)."""
        request = req.request
        if req.to_finish:
            req.to_finish = False
            return RequestStatus.FINISHED_ABORTED
        stops = set(request.stop_token_ids)
        if request.eos_token_id is not None:
            stops.add(request.eos_token_id)
        for index, token in enumerate(sampled):
            if token in stops:
                finished_len = request.num_output_tokens - len(sampled) + index + 1
                if finished_len > req.max_new_tokens:
                    req.finished_len = req.max_new_tokens
                    return RequestStatus.FINISHED_LENGTH_CAPPED
                req.finished_len = finished_len
                if token != request.eos_token_id:
                    request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= req.max_new_tokens:
            req.finished_len = req.max_new_tokens
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    # ----------------------------------------------------------------- inspection

    def running_order(self) -> list[SGLangReq]:
        """The running requests in the order SGLang's running batch will hold them after
        the next merge (docs/SPEC.md, "Two families"), the chunked request last."""
        order = [r for r in self.running_batch.reqs if not r.finished]
        seen = set(map(id, order))
        last = self.last_batch
        if last is not None and last is not self.running_batch:
            for req in last.reqs:
                if not req.finished and req is not self.chunked_req and id(req) not in seen:
                    order.append(req)
                    seen.add(id(req))
        order += [r for r in self.finishing_in_flight if id(r) not in seen]
        if self.chunked_req is not None:
            order.append(self.chunked_req)
        return [r for r in order if r.request.status is RequestStatus.RUNNING]

    def snapshot(self) -> State:
        """The abstract state (spec.State) of this scheduler, for the invariant checks."""
        return State(
            config=self.config,
            requests={
                rid: RequestState.of(r.request, tuple(r.row) if r.row is not None else ())
                for rid, r in self.reqs.items()
            },
            waiting=tuple(r.rid for r in self.waiting),
            running=tuple(r.rid for r in self.running_order()),
            kv=self._kv_snapshot(),
            sglang=SGLangState(
                new_token_ratio=self.new_token_ratio.current,
                batch_is_full=self.running_batch.batch_is_full,
                chunked_request_id=self.chunked_req.rid if self.chunked_req is not None else None,
                last_batch_kind=self.last_batch_kind,
                prefill_passes=self._refresh_calls,
            ),
        )

    def _kv_snapshot(self) -> KVState:
        """Pages are blocks; free ones are the pool's, in hand-out order, then the
        tree's evictable ones in eviction order; the tree's pages are cached blocks
        under the chain hash of the prefix they end."""
        kv = self.kv
        num_pages = kv.pool.num_pages
        refs = [0] * num_pages
        for req in self.reqs.values():
            for page in req.row or ():
                refs[page] += 1
        hashes: list[BlockHash | None] = [None] * num_pages
        prefix_cache = []
        for page, block_hash in kv.tree.page_hashes():
            hashes[page] = block_hash
            prefix_cache.append((block_hash, (page,)))
        return KVState(
            num_blocks=num_pages,
            free_block_ids=tuple(kv.pool.free_pages) + kv.tree.eviction_order(),
            ref_counts=tuple(refs),
            block_hashes=tuple(hashes),
            prefix_cache=tuple(prefix_cache),
        )
