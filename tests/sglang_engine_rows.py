"""Drive any engine of the SGLang family (the reference's, SGLang's own through the
adapter) as SGLang's event loop is driven, and read each step's row from the engine's
snapshot alone, so that one worked example holds every engine to SGLang's observed
behaviour (tests/test_sglang_reference.py recorded the rows from SGLang 0.5.23 on CPU).

The rows are tests/sglang_helpers.Row, read here from the abstract State: the batch
kind and the admission latch and new_token_ratio from State.sglang, the pool's free,
evictable and protected tokens from the KV state (free: free blocks with no hash;
evictable: free blocks that keep their hash; protected: held blocks the radix cache
holds, i.e. with a hash), times the page size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from schedspec.engines.protocol import EngineAdapter
from schedspec.spec import ModelRunnerOutput, Request, SchedulerOutput, State
from tests.sglang_helpers import Event, Row, fake_token


def pool_tokens(state: State) -> tuple[int, int, int]:
    """(free, evictable, protected) tokens of the state's pool, as SGLang counts them."""
    kv = state.kv
    page = state.config.block_size
    free = set(kv.free_block_ids)
    evictable = sum(1 for b in free if kv.block_hashes[b] is not None)
    protected = sum(
        1
        for b in range(kv.num_blocks)
        if b not in free and kv.ref_counts[b] > 0 and kv.block_hashes[b] is not None
    )
    return ((len(free) - evictable) * page, evictable * page, protected * page)


def row_of(output: SchedulerOutput, state: State) -> Row:
    """The row a step leaves, read from the state after its schedule() (overlap) or its
    update (plain loop), as the worked examples read SGLang."""
    sglang = state.sglang
    assert sglang is not None, "an engine of the SGLang family fills State.sglang"
    kind = sglang.last_batch_kind
    return Row(
        None if kind == "idle" else kind,
        dict(output.num_scheduled_tokens),
        state.waiting,
        sglang.chunked_request_id,
        pool_tokens(state),
        round(sglang.new_token_ratio, 6),
        sglang.batch_is_full,
    )


class EngineDriver:
    """An engine stepped as SGLang's loop steps: plain, each step lands at once;
    overlap (async_scheduling), step N lands after step N + 1 is scheduled."""

    def __init__(self, engine: EngineAdapter, async_scheduling: bool) -> None:
        self.engine = engine
        self.async_scheduling = async_scheduling
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, list[int]]]] = deque()
        self.outputs: list[SchedulerOutput] = []

    def apply(self, event: Event) -> None:
        if event[0] == "add":
            _, rid, tokens, max_new = event  # type: ignore[misc]
            self.engine.add_request(Request(rid, list(tokens), max_new))
        else:
            self.engine.finish_requests([event[1]])

    def step(self) -> Row:
        output = self.engine.schedule()
        self.outputs.append(output)
        state = self.engine.snapshot()
        tokens = {
            rid: [fake_token(state.requests[rid].num_computed_tokens)]
            for rid in output.num_scheduled_tokens
            if rid in state.requests and not state.requests[rid].is_prefill_chunk
        }
        self._in_flight.append((output, tokens))
        if not self.async_scheduling or len(self._in_flight) > 1:
            self._land()
        return row_of(output, self.engine.snapshot())

    def _land(self) -> None:
        output, tokens = self._in_flight.popleft()
        live = self.engine.snapshot().requests
        self.engine.update_from_output(
            output, ModelRunnerOutput({rid: t for rid, t in tokens.items() if rid in live})
        )

    def run(self, events: Mapping[int, Sequence[Event]], steps: int) -> list[Row]:
        rows = []
        for step in range(steps):
            for event in events.get(step, ()):
                self.apply(event)
            rows.append(self.step())
        return rows
