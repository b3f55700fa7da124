"""Drive the reference's SGLang family as SGLang's event loop is driven, and read back
per step what the worked examples compare with SGLang 0.5.23's observed behaviour.

The observed rows were recorded by stepping SGLang's real Scheduler on CPU through
the peer-probe recipe (shared/research/peer-probe/sglang): its model emits
fake_token(sequence length) for every request that samples, and so does `drive`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schedspec.reference import SGLangScheduler
from schedspec.spec import ModelRunnerOutput, Request, SchedulerConfig, SchedulerOutput

# (kind, request id, prompt, max_new_tokens) for "add"; (kind, request id) for "abort".
Event = tuple[str, str] | tuple[str, str, Sequence[int], int]


def fake_token(seq_len: int) -> int:
    """The probe model: the next token is a function of the sequence length."""
    return (seq_len * 31 + 100) % 20000 + 3


def prompt(seed: int, length: int) -> list[int]:
    """Distinct prompts per seed (the probe scenarios' prompts)."""
    return [(seed * 101 + j) % 30000 + 3 for j in range(length)]


@dataclass(frozen=True)
class Row:
    """What one loop iteration left behind, as the worked examples read it from SGLang:
    the batch run (None: idle) and its tokens per request, the waiting queue, the
    chunked request, the pool's (free, evictable, protected) tokens, new_token_ratio
    and the admission latch."""

    batch: str | None
    scheduled: dict[str, int]
    waiting: tuple[str, ...]
    chunked: str | None
    slots: tuple[int, int, int]
    ratio: float
    latch: bool


ObservedRow = tuple[str | None, dict[str, int], tuple[str, ...], str | None,
                    tuple[int, int, int], float, bool]  # fmt: skip


def as_row(observed: ObservedRow) -> Row:
    return Row(*observed)


class Driver:
    """The reference stepped as SGLang's loop steps: sync, each step lands at once;
    overlap (async_scheduling), step N lands after step N + 1 is scheduled."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.scheduler = SGLangScheduler(config)
        self.requests: dict[str, Request] = {}
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, list[int]]]] = deque()
        self.outputs: list[SchedulerOutput] = []

    def apply(self, event: Event) -> None:
        if event[0] == "add":
            _, rid, tokens, max_new = event  # type: ignore[misc]
            request = Request(rid, list(tokens), max_new)
            self.requests[rid] = request
            self.scheduler.add_request(request)
        else:
            self.scheduler.finish_requests(event[1])

    def step(self) -> Row:
        s = self.scheduler
        output = s.schedule()
        self.outputs.append(output)
        state = s.snapshot()
        tokens = {
            rid: [fake_token(state.requests[rid].num_computed_tokens)]
            for rid in output.num_scheduled_tokens
            if rid in state.requests and not state.requests[rid].is_prefill_chunk
        }
        self._in_flight.append((output, tokens))
        if not s.config.async_scheduling or len(self._in_flight) > 1:
            self._land()
        kind = s.last_batch_kind
        return Row(
            None if kind == "idle" else kind,
            dict(output.num_scheduled_tokens),
            tuple(r.rid for r in s.waiting),
            s.chunked_req.rid if s.chunked_req is not None else None,
            (s.kv.pool.available_tokens(), s.kv.tree.evictable_size, s.kv.tree.protected_size),
            round(s.new_token_ratio.current, 6),
            s.running_batch.batch_is_full,
        )

    def _land(self) -> None:
        output, tokens = self._in_flight.popleft()
        live = {rid: t for rid, t in tokens.items() if rid in self.scheduler.reqs}
        self.scheduler.update_from_output(output, ModelRunnerOutput(live))

    def run(self, events: Mapping[int, Sequence[Event]], steps: int) -> list[Row]:
        rows = []
        for step in range(steps):
            for event in events.get(step, ()):
                self.apply(event)
            rows.append(self.step())
        return rows
