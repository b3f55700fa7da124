"""One swarm instance as a trace, and a plain (unchecked) replay of traces.

The swarm's draws depend only on (seed, instance id, tick), so re-running
instance i alone with B = 1 goes through the same ticks; `record_instance`
does that and writes each tick as trace events: Abort, AddRequest,
ProposeDrafts, then a Step whose decisions carry what the device model
drew (accepted drafts, forced stops). The stop token lies outside the harness
model's vocabulary, so a replay on any engine stops exactly where the swarm
did. Token values differ (the harness model draws its own): only
prefix-cache hits on two requests' identical output blocks can tell.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from schedspec.engines.events import Abort, AddRequest, Drain, Event, ProposeDrafts, Step
from schedspec.engines.fake_model import FakeModel, StepDecisions
from schedspec.engines.protocol import EngineAdapter
from schedspec.gpu_impl.engine import BatchedScheduler
from schedspec.gpu_impl.swarm_workload import STOP_TOKEN, VOCAB, SwarmWorkload, Tick, WorkloadShape
from schedspec.spec import SchedulerConfig
from schedspec.traces.trace import ModelParams, Trace


@dataclass(frozen=True)
class SwarmRun:
    """What fixes a swarm: the config, the seed, the workload shape, the slots."""

    config: SchedulerConfig
    seed: int
    shape: WorkloadShape = field(default_factory=WorkloadShape)
    slots: int = 12

    def model(self) -> ModelParams:
        return ModelParams(seed=self.seed, vocab_size=VOCAB)


def record_instance(
    run: SwarmRun, instance: int, ticks: int, device: torch.device | str = "cpu"
) -> Trace:
    """The first `ticks` ticks of one swarm instance, as a trace."""
    engine = BatchedScheduler(run.config, batch=1, slots=run.slots, device=device)
    workload = SwarmWorkload(engine, run.seed, torch.tensor([instance]), run.shape)
    events: list[Event] = []
    names: dict[int, str] = {}  # slot -> request id
    arrivals = 0
    for _ in range(ticks):
        tick = workload.tick()
        arrivals = _tick_events(tick, names, arrivals, events)
    return Trace(run.config, tuple(events), run.model())


def _tick_events(tick: Tick, names: dict[int, str], arrivals: int, events: list[Event]) -> int:
    """Append one tick's events (B = 1); returns the arrival counter."""
    aborted = int(tick.aborted[0])
    if aborted >= 0:
        events.append(Abort((names.pop(aborted),)))
    for new in tick.added:  # B = 1: at most one arrival, in either call
        if new.inst.numel():
            rid = f"r{arrivals}"
            arrivals += 1
            names[int(new.slot[0])] = rid
            length = int(new.prompt_len[0])
            eos = int(new.eos[0])
            events.append(
                AddRequest(
                    rid,
                    tuple(new.prompt[0, :length].tolist()),
                    int(new.max_tokens[0]),
                    eos_token_id=eos if eos >= 0 else None,
                    priority=int(new.priority[0]),
                )
            )
    proposed = tick.drafts[0].tolist()
    drafts = {names[s]: n for s, n in enumerate(proposed) if n >= 0 and s in names}
    if drafts:
        events.append(ProposeDrafts(drafts))
    sampled = tick.sampled[0].tolist()
    num_drafts = tick.landed.num_drafts[0].tolist()
    accepted = tick.accepted[0].tolist()
    stopped = tick.stopped[0].tolist()
    decisions = StepDecisions(
        stops={names[s]: STOP_TOKEN for s, hit in enumerate(stopped) if hit},
        accepted={names[s]: accepted[s] for s, n in enumerate(sampled) if n and num_drafts[s] > 0},
    )
    events.append(Step(decisions))
    for s, code in enumerate(tick.result.finish[0].tolist()):
        if code:
            names.pop(s)
    return arrivals


def drive(engine: EngineAdapter, trace: Trace) -> Iterator[int]:
    """Replay a synchronous trace on an engine with no checks (for timing); yields after
    each step. An async trace's steps land in the batch queue's order, which the
    harness keeps (checked_engine.replay): it is refused here."""
    if trace.config.async_scheduling:
        raise ValueError("drive: an async_scheduling trace replays through the harness")
    model = FakeModel(
        seed=trace.model.seed,
        vocab_size=trace.model.vocab_size,
        draft_acceptance=trace.model.draft_acceptance,
        num_speculative_tokens=trace.config.num_speculative_tokens,
    )
    for event in trace.events:
        if isinstance(event, AddRequest):
            engine.add_request(event.to_request())
        elif isinstance(event, Abort):
            engine.finish_requests(event.request_ids)
        elif isinstance(event, ProposeDrafts):
            proposals = {rid: model.drafts_for(rid, n) for rid, n in event.num_drafts.items()}
            engine.update_draft_token_ids(proposals)
        elif isinstance(event, Step):
            if event.aborts:
                raise ValueError("drive: a swarm trace has no aborts in flight")
            output = engine.schedule()
            engine.update_from_output(output, model.execute(output, event.decisions))
            yield 1
        elif isinstance(event, Drain):
            raise ValueError("drive: a swarm trace has no Drain event")
