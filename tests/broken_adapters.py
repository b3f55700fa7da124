"""Adapters that break their own protocol, one promise each, for the conformance check
(`schedspec conform`): the reference, with one method hand-broken."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable

from schedspec.adapters.reference import ReferenceEngine
from schedspec.spec import (
    KVState,
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerOutput,
    State,
)
from schedspec.spec.invariants import Profile


class _Safety(ReferenceEngine):
    profiles: frozenset[Profile] = frozenset({"safety"})


class SnapshotNotState(_Safety):
    def snapshot(self) -> State:
        return vars(super().snapshot())  # type: ignore[return-value]


class ReservedBlockShown(_Safety):
    """Shows a block the engine keeps for itself (vLLM's null block) as one of the pool's."""

    def snapshot(self) -> State:
        state = super().snapshot()
        kv = state.kv
        shown = KVState(
            kv.num_blocks + 1,
            (*kv.free_block_ids, kv.num_blocks),
            (*kv.ref_counts, 0),
            (*kv.block_hashes, None),
            kv.prefix_cache,
        )
        return dataclasses.replace(state, kv=shown)


class AcceptsEverything(_Safety):
    def add_request(self, request: Request) -> None:
        # The engine's own door is missing: it says yes to what it cannot serve.
        with contextlib.suppress(ValueError):
            super().add_request(request)


class RefusesWithTypeError(_Safety):
    def add_request(self, request: Request) -> None:
        try:
            super().add_request(request)
        except ValueError as err:
            raise TypeError(str(err)) from None


class RekeyedRequests(_Safety):
    """Keys requests by the engine's own ids, not the spec's."""

    def snapshot(self) -> State:
        state = super().snapshot()
        return dataclasses.replace(
            state,
            requests={
                f"req-{rid}": dataclasses.replace(r, request_id=f"req-{rid}")
                for rid, r in state.requests.items()
            },
            waiting=tuple(f"req-{rid}" for rid in state.waiting),
            running=tuple(f"req-{rid}" for rid in state.running),
        )


class ForgetsMaxTokens(_Safety):
    """Reports the engine's default max_tokens, not the request's."""

    def snapshot(self) -> State:
        state = super().snapshot()
        requests = {rid: dataclasses.replace(r, max_tokens=16) for rid, r in state.requests.items()}
        return dataclasses.replace(state, requests=requests)


class RunningListedAsWaiting(_Safety):
    def snapshot(self) -> State:
        state = super().snapshot()
        return dataclasses.replace(state, waiting=state.waiting + state.running, running=())


class UntranslatedHashes(_Safety):
    """Shows its engine's own block hashes where the spec's belong."""

    def snapshot(self) -> State:
        state = super().snapshot()
        kv = state.kv
        own = tuple(None if h is None else h ^ 1 for h in kv.block_hashes)
        cache = tuple((h ^ 1, blocks) for h, blocks in kv.prefix_cache)
        return dataclasses.replace(
            state, kv=dataclasses.replace(kv, block_hashes=own, prefix_cache=cache)
        )


class SchedulesAStranger(_Safety):
    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        counts = {**output.num_scheduled_tokens, "ghost": 1}
        return dataclasses.replace(output, num_scheduled_tokens=counts)


class SchedulesNothing(_Safety):
    def schedule(self) -> SchedulerOutput:
        return SchedulerOutput((), (), {}, 0, {}, frozenset(), frozenset())


class ReportsStrangers(_Safety):
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        super().update_from_output(scheduler_output, model_runner_output)
        return {"someone": RequestOutput("someone", (), None)}


class AbortRaisesOnUnknownIds(_Safety):
    def finish_requests(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        unknown = [rid for rid in ids if rid not in self.requests]
        if unknown:
            raise KeyError(unknown[0])
        super().finish_requests(ids)
