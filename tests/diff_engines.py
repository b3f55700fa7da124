"""Engines that keep every safety invariant yet decide differently from the reference,
for the lockstep diff to catch (`tests.diff_engines:victim`), as a user's engine would.

Both claim only the safety profile: under vllm-v1 their own checks would
already flag them (VICTIM, GREEDY-BUDGET), and the point here is that the
diff finds what safety alone allows.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence

from schedspec.adapters.reference import ReferenceEngine
from schedspec.reference.vllm.step_plan import StepPlan
from schedspec.spec import (
    KVState,
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from schedspec.spec.invariants import Profile

SAFETY: frozenset[Profile] = frozenset({"safety"})


class OldestVictimEngine(ReferenceEngine):
    """Under fcfs, preempts the oldest running request (running[0]) instead of the newest,
    unless that is the request asking for blocks and another one could go instead.

    The exception keeps it safe: a request that preempts itself ends the
    reference's fcfs loop, so evicting running[0] for running[0] would leave
    the step empty (NO-EMPTY-STEP).
    """

    profiles = SAFETY
    _asking: Request | None = None

    def _preempt_for(self, request: Request, req_index: int, step: StepPlan) -> tuple[Request, int]:
        self._asking = request
        return super()._preempt_for(request, req_index, step)

    def _pick_victim_index(self) -> int:
        if self.config.policy != "fcfs" or len(self.running) == 1:
            return super()._pick_victim_index()
        return 1 if self.running[0] is self._asking else 0


def victim(config: SchedulerConfig) -> OldestVictimEngine:
    return OldestVictimEngine(config)


class ShortPrefillEngine(ReferenceEngine):
    """Admits a request with one prompt token less than it could, when chunked prefill
    allows a shorter first chunk (more than one token to go)."""

    profiles = SAFETY

    def _admission_chunk(self, num_to_compute: int, cap: int) -> int:  # type: ignore[override]
        # The reference's is a staticmethod; this one reads the config.
        chunk = ReferenceEngine._admission_chunk(num_to_compute, cap)
        if self.config.enable_chunked_prefill and chunk > 1:
            return chunk - 1
        return chunk


def short_prefill(config: SchedulerConfig) -> ShortPrefillEngine:
    return ShortPrefillEngine(config)


class SlowEngine(ReferenceEngine):
    """Hangs (sleeps a minute) in its third schedule(): for the step time limit."""

    calls = 0

    def schedule(self) -> SchedulerOutput:
        self.calls += 1
        if self.calls == 3:
            time.sleep(60)
        return super().schedule()


def hanging(config: SchedulerConfig) -> SlowEngine:
    return SlowEngine(config)


class RelabelledEngine:
    """The reference seen through a mirror: block b is reported as num_blocks - 1 - b.

    It makes exactly the reference's decisions with another block numbering,
    so the diff must agree with it unless asked to compare block ids.
    """

    profiles: frozenset[Profile] = frozenset({"safety", "vllm-v1"})

    def __init__(self, config: SchedulerConfig) -> None:
        self.inner = ReferenceEngine(config)
        self.last = config.num_blocks - 1  # the highest block id, mirrored to 0
        self.outputs: dict[int, SchedulerOutput] = {}  # relabelled output id -> the engine's

    def _mirror(self, blocks: Iterable[int]) -> tuple[int, ...]:
        return tuple(self.last - b for b in blocks)

    def add_request(self, request: Request) -> None:
        self.inner.add_request(request)

    def schedule(self) -> SchedulerOutput:
        output = self.inner.schedule()
        mirrored = dataclasses.replace(
            output,
            scheduled_new_reqs=tuple(
                n._replace(block_ids=self._mirror(n.block_ids)) for n in output.scheduled_new_reqs
            ),
            scheduled_cached_reqs=tuple(
                c._replace(new_block_ids=self._mirror(c.new_block_ids))
                for c in output.scheduled_cached_reqs
            ),
        )
        self.outputs = {id(mirrored): output}  # update_from_output gets the engine's own back
        return mirrored

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        own = self.outputs.get(id(scheduler_output), scheduler_output)
        return self.inner.update_from_output(own, model_runner_output)

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        self.inner.update_draft_token_ids(draft_token_ids)

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        self.inner.finish_requests(request_ids)

    def snapshot(self) -> State:
        state = self.inner.snapshot()
        kv = state.kv
        return dataclasses.replace(
            state,
            requests={
                rid: dataclasses.replace(r, block_ids=self._mirror(r.block_ids))
                for rid, r in state.requests.items()
            },
            kv=KVState(
                num_blocks=kv.num_blocks,
                free_block_ids=self._mirror(kv.free_block_ids),
                ref_counts=kv.ref_counts[::-1],
                block_hashes=kv.block_hashes[::-1],
                prefix_cache=tuple((h, self._mirror(ids)) for h, ids in kv.prefix_cache),
            ),
        )


def relabelled(config: SchedulerConfig) -> RelabelledEngine:
    return RelabelledEngine(config)


def unbuildable(config: SchedulerConfig) -> ReferenceEngine:
    """A factory that raises: an engine error before any event."""
    raise RuntimeError("planted failure while building the engine")
