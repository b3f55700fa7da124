"""KitAdapter: an EngineAdapter whose bookkeeping is derived, for a synchronous engine.

A subclass translates five calls into its engine's and reads four things back:

    engine_add(request)          hand a request the spec's door accepted to the engine
    engine_schedule()            run one scheduling step: {request id: tokens}, in order
    engine_update(sampled)       apply the model's tokens: what each request kept, and why
                                 it finished (or None if the engine does not say)
    engine_abort(request_id)     abort one live request
    engine_request(request_id)   its outputs, computed count, status, block table and
                                 preemptions (kit.EngineRequest), or None once finished
    engine_queues()              the waiting and running request ids, in order
    engine_kv()                  the pool as the spec's KVState (translate block hashes
                                 with self.hashes.spec_or_none)
    engine_block_hashes(rid)     (prefix caching) the engine's hashes of the request's
                                 full blocks, in order

and the kit does the rest: the spec's door (validate_new_request) and duplicate ids, what
the harness gave each request (kit.Given), the in-flight counters (kit.Pipeline), the
spec's SchedulerOutput from the states around schedule() (kit.step_output), the requests
finished since the last step (kit.FinishedSince), the oldest-step-first landing check,
and learning block hashes before and after every call (kit.HashTranslator).

It claims the safety profile and declares no capability: a subclass declares what its
engine has (engines/capabilities.py). The kit serves a synchronous engine without drafts;
an engine with drafts overrides update_draft_token_ids (and declares DRAFTS), and one
with async scheduling keeps the placeholders its pipeline needs (docs/ADAPTERS.md,
"Growing it toward a profile").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence

from schedspec.adapters.in_flight import check_landing
from schedspec.adapters.kit.block_hashes import HashTranslator
from schedspec.adapters.kit.given import Given
from schedspec.adapters.kit.pipeline import Pipeline, ScheduledRow
from schedspec.adapters.kit.request_state import EngineRequest, request_state
from schedspec.adapters.kit.step_output import FinishedSince, step_output
from schedspec.engines.capabilities import Capability, refuses_drafts
from schedspec.spec import (
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
    State,
    validate_new_request,
)
from schedspec.spec.invariants import Profile


class KitAdapter(ABC):
    """The EngineAdapter protocol, implemented once over a subclass's engine_* methods."""

    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities: frozenset[Capability] = frozenset()

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.hashes = HashTranslator(config.block_size)
        self._given: dict[str, Given] = {}  # every request added and not seen finished
        self._num_arrivals = 0
        self._pipeline = Pipeline(config.async_scheduling)
        self._finished = FinishedSince()
        # Each step scheduled and not landed, oldest first: the spec's output and its rows
        # with the arrival of the request each was for (an id may be reused after an abort).
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, tuple[ScheduledRow, int]]]] = (
            deque()
        )

    # ------------------------------------------------------ what a subclass gives

    @abstractmethod
    def engine_add(self, request: Request) -> None:
        """Hand the engine a request the spec's door accepted (raise ValueError, changing
        nothing, for one the engine refuses on its own)."""

    @abstractmethod
    def engine_schedule(self) -> Mapping[str, int]:
        """One scheduling step: the tokens each request runs, in scheduling order."""

    @abstractmethod
    def engine_update(
        self, sampled: Mapping[str, Sequence[int]]
    ) -> Mapping[str, RequestOutput] | None:
        """Apply the model's tokens to the requests of the oldest step; return what each
        request kept and why it finished, or None if the engine does not say."""

    @abstractmethod
    def engine_abort(self, request_id: str) -> None:
        """Abort one live request."""

    @abstractmethod
    def engine_request(self, request_id: str) -> EngineRequest | None:
        """What the engine knows of a request, or None once it finished (or was aborted)."""

    @abstractmethod
    def engine_queues(self) -> tuple[Sequence[str], Sequence[str]]:
        """The waiting queue (head first) and the running requests, in order."""

    @abstractmethod
    def engine_kv(self) -> KVState:
        """The KV pool as the spec's KVState."""

    def engine_block_hashes(self, request_id: str) -> Sequence[Hashable]:
        """The engine's hashes of the request's full blocks (none without prefix caching)."""
        return ()

    # ----------------------------------------------------------------- the calls

    def add_request(self, request: Request) -> None:
        validate_new_request(request, self.config)
        if request.request_id in self._given:
            raise RequestError("request_id", f"duplicate request id {request.request_id!r}")
        self.engine_add(request)
        self._given[request.request_id] = Given.of(request, self._num_arrivals)
        self._num_arrivals += 1

    def schedule(self) -> SchedulerOutput:
        pre = self.snapshot()
        reported = self._finished.take()
        counts = dict(self.engine_schedule())
        after = self._requests()
        rows: dict[str, ScheduledRow] = {}
        for rid, num_tokens in counts.items():
            if rid not in pre.requests or rid not in after:
                raise RuntimeError(f"the engine scheduled {rid!r}, which it does not hold")
            before = after[rid].num_computed_tokens - num_tokens
            samples = before + num_tokens >= pre.requests[rid].num_tokens
            rows[rid] = ScheduledRow(rid, num_tokens, before, samples)
        for rid, request in after.items():
            if request.status is RequestStatus.PREEMPTED and rid in pre.running:
                self._pipeline.on_preempt(rid, drop_stale=False)
        self._pipeline.on_schedule(rows)
        post = self.snapshot()
        self._finished.note(pre, post)
        output = step_output(tuple(rows.values()), pre, post, reported)
        arrivals = {rid: (row, self._given[rid].arrival) for rid, row in rows.items()}
        self._in_flight.append((output, arrivals))
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        sampled = model_runner_output.sampled_token_ids
        oldest = self._in_flight[0][0] if self._in_flight else None
        check_landing(oldest, scheduler_output, sampled)
        if model_runner_output.kv_connector_output is not None:
            raise OutputError("kv_connector_output", "this engine has no KV connector")
        pre = self.snapshot()
        _, rows = self._in_flight.popleft()
        # Only requests still the ones the step scheduled (not aborted, not re-added).
        current = {rid for rid, (_, arrival) in rows.items() if self._is_live(rid, arrival)}
        reported = self.engine_update({r: t for r, t in sampled.items() if r in current})
        self._pipeline.on_land({rid: row for rid, (row, _) in rows.items() if rid in current})
        self._finished.note(pre, self.snapshot())
        return reported

    @refuses_drafts
    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        """The kit's engines have no drafts: none may be proposed (declare DRAFTS and
        override this to take them)."""
        if any(draft_token_ids.values()):
            raise OutputError("draft_token_ids", "this engine schedules no drafts")

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        pre = self.snapshot()
        for request_id in dict.fromkeys(request_ids):
            if request_id in pre.requests:
                self.engine_abort(request_id)
        self._finished.note(pre, self.snapshot())

    # ---------------------------------------------------- the refinement mapping

    def snapshot(self) -> State:
        requests = self._requests()
        waiting, running = self.engine_queues()
        return State(
            config=self.config,
            requests=requests,
            waiting=tuple(waiting),
            running=tuple(running),
            kv=self.engine_kv(),
        )

    def learn_hashes(self, request_id: str, tokens: Sequence[int]) -> None:
        """Pair the request's engine hashes with the spec's (done for every live request at
        every snapshot; call it inside engine_update for a request that caches a block and
        finishes in the same call)."""
        self.hashes.learn(request_id, self.engine_block_hashes(request_id), tokens)

    def _requests(self) -> dict[str, RequestState]:
        """Every live request's state; the ones the engine finished are forgotten."""
        requests: dict[str, RequestState] = {}
        for rid, given in list(self._given.items()):
            engine = self.engine_request(rid)
            if engine is None:
                del self._given[rid]
                self._pipeline.forget(rid)
                self.hashes.forget(rid)
                continue
            state = request_state(rid, given, engine, self._pipeline.of(rid))
            self.learn_hashes(rid, (*state.prompt_token_ids, *state.output_token_ids))
            requests[rid] = state
        return requests

    def _is_live(self, request_id: str, arrival: int) -> bool:
        given = self._given.get(request_id)
        return given is not None and given.arrival == arrival
