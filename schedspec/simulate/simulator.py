"""Drive an engine over a timed workload with a step-time cost model.

The clock starts at 0. Before each iteration the requests that have arrived
by then are added; an idle engine jumps the clock to the next arrival. The
iteration runs as the engine core runs it (pipeline.EngineLoop: schedule ->
harness model -> update_from_output -> drafts; with async scheduling the step
scheduled now lands in the next iteration), the cost model prices the work of
the step that lands, and the clock moves on by that much: tokens it emitted
are stamped with its end. Under async scheduling a step is thus scheduled
when the one before it starts executing, and a request that arrives while a
step runs joins the step after next. Everything is read from what the engine publishes
(SchedulerOutput and the RequestOutputs of update_from_output), so any engine
behind the adapter protocol can be simulated; for an engine whose
update_from_output returns None, the length caps are applied here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from schedspec.engines.fake_model import FakeModel
from schedspec.engines.pipeline import EngineLoop
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.simulate.block_ledger import BlockLedger
from schedspec.simulate.cost_model import CostModel, StepWork
from schedspec.simulate.errors import SimulationInputError
from schedspec.simulate.timeline import (
    ScheduledEntry,
    computed_before,
    in_flight_outputs,
    scheduled_entries,
)
from schedspec.simulate.workloads import SimRequest
from schedspec.spec import (
    ModelRunnerOutput,
    RequestOutput,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
)


class SimulationStalledError(Exception):
    """The engine stopped making progress, or ran past max_steps."""


@dataclass(frozen=True)
class SimStep:
    """One iteration on the simulated clock."""

    start: float  # s
    duration: float  # s, from the cost model
    entries: list[ScheduledEntry]  # in scheduling order
    work: StepWork
    kv_usage: float  # after the step
    num_waiting: int  # arrived, unfinished and not running, after the step
    num_running: int
    preempted: list[str]


@dataclass
class RequestTimeline:
    """One request's life on the simulated clock, as the engine reported it."""

    request_id: str
    arrival_time: float
    prompt_len: int
    max_tokens: int
    first_scheduled: float | None = None
    emit_times: list[float] = field(default_factory=list)  # end of each step that emitted
    emit_counts: list[int] = field(default_factory=list)  # tokens emitted in that step
    finish_time: float | None = None
    finish_status: str | None = None
    num_preemptions: int = 0
    recomputed_tokens: int = 0  # KV computed again after preemption
    cached_tokens: int = 0  # prefix-cache hits at admissions (resumptions included)
    queried_tokens: int = 0  # known tokens at those admissions
    _high_water: int = 0  # most tokens ever computed
    # sum(emit_counts), kept as tokens are emitted: read for every scheduled request
    # every step, where summing the list made a long decode quadratic.
    _num_output_tokens: int = 0

    def emit(self, end: float, count: int) -> None:
        """count tokens delivered by the step that ends at `end`."""
        self.emit_times.append(end)
        self.emit_counts.append(count)
        self._num_output_tokens += count

    @property
    def num_output_tokens(self) -> int:
        return self._num_output_tokens

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self._num_output_tokens

    def account(self, entry: ScheduledEntry, before: int, fresh: bool, start: float) -> None:
        if self.first_scheduled is None:
            self.first_scheduled = start
        if fresh:
            self.cached_tokens += entry.num_cached
            self.queried_tokens += self.num_tokens
        after = before + entry.num_scheduled - (entry.num_drafts - entry.num_accepted)
        if entry.kind == "prefill":
            self.recomputed_tokens += max(0, min(self._high_water, after) - before)
        self._high_water = max(self._high_water, after)


@dataclass
class SimulationResult:
    name: str
    config: SchedulerConfig
    cost_model: CostModel
    steps: list[SimStep]
    requests: dict[str, RequestTimeline]  # in arrival order


def simulate(
    name: str,
    factory: EngineFactory,
    config: SchedulerConfig,
    workload: Iterable[SimRequest],
    cost_model: CostModel,
    seed: int,
    max_steps: int,
    on_step: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Run the workload (requests in arrival order, taken as they arrive) to completion;
    on_step gets the number of finished requests."""
    engine = factory(config)
    model = FakeModel(seed=seed, num_speculative_tokens=config.num_speculative_tokens)
    pending = _Arrivals(workload)
    timelines: dict[str, RequestTimeline] = {}
    ledger = BlockLedger(config.num_blocks)
    live: set[str] = set()  # arrived and unfinished
    running: set[str] = set()
    loop = EngineLoop(engine, model, config, lambda: bool(live))
    in_flight: deque[_Scheduled] = deque()
    steps: list[SimStep] = []
    clock = 0.0
    finished = 0
    while pending or live or loop.in_flight:
        if len(steps) >= max_steps:
            more = " (and more to arrive)" if pending else ""
            raise SimulationStalledError(
                f"{len(live)} requests unfinished{more} after max_steps={max_steps}"
            )
        if not live and not loop.in_flight:
            clock = max(clock, pending.next_time)
        while pending and pending.next_time <= clock:
            request = pending.take()
            _add(engine, request)
            timelines[request.request_id] = RequestTimeline(
                request.request_id,
                request.arrival_time,
                len(request.prompt_token_ids),
                request.max_tokens,
            )
            live.add(request.request_id)
        step = loop.step()
        if step.scheduled is not None:
            in_flight.append(_scheduled(step.scheduled, timelines))
            ledger.apply(step.scheduled)  # blocks are allocated when a step is scheduled
            for rid in step.scheduled.preempted_req_ids:
                running.discard(rid)
                timelines[rid].num_preemptions += 1
            running.update(step.scheduled.num_scheduled_tokens)
        if step.landed is None:
            continue  # async: the first step is in flight
        landed = in_flight.popleft()
        out, model_output, reported = landed.output, step.landed.model_output, step.landed.reported
        if out.total_num_scheduled_tokens == 0:
            if loop.in_flight or not live:
                # An empty step while another runs (a request awaits its output), or
                # the last one of an async run.
                continue
            if not pending:
                raise SimulationStalledError(
                    f"{name}: the engine scheduled nothing with {len(live)} requests unfinished"
                )
            clock = max(clock, pending.next_time)  # wait for the next arrival
            continue
        if reported is None:
            reported = _length_capped_outputs(model_output, timelines, config.max_model_len)
        assert isinstance(reported, Mapping), reported
        computed, fresh = computed_before(out)
        entries = scheduled_entries(
            out, model_output, landed.num_tokens, computed, fresh, landed.in_flight
        )
        work = _work(entries, computed)
        end = clock + cost_model.step_time(work, overlapped=config.async_scheduling)
        for entry in entries:
            rid = entry.request_id
            timelines[rid].account(entry, computed[rid], rid in fresh, clock)
        finished += _apply_outputs(reported, timelines, end, ledger, live, running)
        steps.append(
            SimStep(
                start=clock,
                duration=end - clock,
                entries=entries,
                work=work,
                kv_usage=ledger.usage,
                num_waiting=len(live) - len(running),
                num_running=len(running),
                preempted=sorted(out.preempted_req_ids),
            )
        )
        clock = end
        if on_step is not None:
            on_step(finished)
    return SimulationResult(name, config, cost_model, steps, timelines)


class _Arrivals:
    """The workload's requests taken one at a time, each once its time comes: only the
    next one is held (a workload may be drawn lazily). Refuses a request that arrives
    before the one taken last: the simulated clock cannot go back."""

    def __init__(self, workload: Iterable[SimRequest]) -> None:
        self._requests = iter(workload)
        self._next = next(self._requests, None)

    def __bool__(self) -> bool:
        return self._next is not None

    @property
    def next_time(self) -> float:
        assert self._next is not None
        return self._next.arrival_time

    def take(self) -> SimRequest:
        taken = self._next
        assert taken is not None
        self._next = next(self._requests, None)
        if self._next is not None and self._next.arrival_time < taken.arrival_time:
            where = self._next.source or f"request {self._next.request_id!r}"
            raise SimulationInputError(
                "workload", f"{where} arrives before the request ahead of it: not in arrival order"
            )
        return taken


@dataclass(frozen=True)
class _Scheduled:
    """A step in flight, with what the requests it scheduled had delivered then."""

    output: SchedulerOutput
    num_tokens: dict[str, int]
    in_flight: dict[str, int]  # output positions of earlier steps still in flight


def _scheduled(out: SchedulerOutput, timelines: Mapping[str, RequestTimeline]) -> _Scheduled:
    rids = out.num_scheduled_tokens
    outputs = {rid: timelines[rid].num_output_tokens for rid in rids}
    return _Scheduled(
        out,
        {rid: timelines[rid].num_tokens for rid in rids},
        in_flight_outputs(out, outputs),
    )


def _add(engine: EngineAdapter, request: SimRequest) -> None:
    """Add a request; a refusal names where the request came from."""
    try:
        engine.add_request(request.to_request())
    except ValueError as err:
        where = request.source or f"request {request.request_id!r}"
        raise SimulationInputError("workload", f"{where}: the engine refused it: {err}") from None


def _work(entries: list[ScheduledEntry], computed: Mapping[str, int]) -> StepWork:
    prefill = sum(e.num_scheduled for e in entries if e.kind == "prefill")
    total = sum(e.num_scheduled for e in entries)
    # Attention reads the request's whole context up to the last token of the step.
    kv_read = sum(computed[e.request_id] + e.num_scheduled for e in entries)
    return StepWork(prefill_tokens=prefill, decode_tokens=total - prefill, kv_tokens_read=kv_read)


def _length_capped_outputs(
    model_output: ModelRunnerOutput, timelines: Mapping[str, RequestTimeline], max_model_len: int
) -> dict[str, RequestOutput]:
    """What an engine that reports no RequestOutputs kept: workload requests carry
    no EOS or stop tokens, so only max_tokens and max_model_len trim the sampled
    tokens, and reaching either finishes the request."""
    outputs = {}
    for rid, sampled in model_output.sampled_token_ids.items():
        t = timelines[rid]
        room = min(t.max_tokens - t.num_output_tokens, max_model_len - t.num_tokens)
        kept = tuple(sampled[:room])
        done = len(kept) == room
        status = RequestStatus.FINISHED_LENGTH_CAPPED if done else None
        outputs[rid] = RequestOutput(rid, kept, status)
    return outputs


def _apply_outputs(
    reported: Mapping[object, object],
    timelines: dict[str, RequestTimeline],
    end: float,
    ledger: BlockLedger,
    live: set[str],
    running: set[str],
) -> int:
    """Stamp emitted tokens with the step's end; retire finished requests. Returns
    how many finished."""
    finished = 0
    for output in reported.values():
        assert isinstance(output, RequestOutput), output
        timeline = timelines[output.request_id]
        if output.new_token_ids:
            timeline.emit(end, len(output.new_token_ids))
        if output.finish_status is not None:
            timeline.finish_time = end
            timeline.finish_status = output.finish_status.name
            ledger.release(output.request_id)
            live.discard(output.request_id)
            running.discard(output.request_id)
            finished += 1
    return finished
