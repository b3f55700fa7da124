"""The abstract state every engine is seen through (the refinement mapping's target).

Adapters map their engine's concrete state to these frozen records; every
invariant is a predicate over them, so one suite serves every engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schedspec.spec.block_hash import BlockHash
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.request import Request, RequestStatus


@dataclass(frozen=True)
class RequestState:
    request_id: str
    priority: int
    arrival: int  # position in add_request order
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    spec_token_ids: tuple[int, ...]  # drafts waiting to be verified
    num_computed_tokens: int
    status: RequestStatus
    block_ids: tuple[int, ...]  # the block table
    num_preemptions: int
    max_tokens: int
    eos_token_id: int | None
    stop_token_ids: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @staticmethod
    def of(request: Request, block_ids: tuple[int, ...]) -> RequestState:
        """A snapshot of a spec Request (mutable lists copied into tuples).

        Snapshots are taken twice a checked step for every live request, and a
        frozen dataclass's __init__ sets each of its 13 fields through
        object.__setattr__. Filling the new instance's __dict__ in one update
        builds the very same object (same fields, equality, hash, replace())
        at a fraction of the cost.
        """
        state = object.__new__(RequestState)
        vars(state).update(
            request_id=request.request_id,
            priority=request.priority,
            arrival=request.arrival,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=tuple(request.output_token_ids),
            spec_token_ids=tuple(request.spec_token_ids),
            num_computed_tokens=request.num_computed_tokens,
            status=request.status,
            block_ids=block_ids,
            num_preemptions=request.num_preemptions,
            max_tokens=request.max_tokens,
            eos_token_id=request.eos_token_id,
            stop_token_ids=request.stop_token_ids,
        )
        return state


@dataclass(frozen=True)
class KVState:
    num_blocks: int
    free_block_ids: tuple[int, ...]  # the free queue, front (reused first) to back
    ref_counts: tuple[int, ...]  # indexed by block id
    block_hashes: tuple[BlockHash | None, ...]  # indexed by block id; None = not cached
    # Prefix-cache map in insertion order: hash -> block ids holding that
    # content (a recomputed last block can duplicate a cached one); lookups
    # take the first.
    prefix_cache: tuple[tuple[BlockHash, tuple[int, ...]], ...]


@dataclass(frozen=True)
class State:
    config: SchedulerConfig
    requests: Mapping[str, RequestState]  # every unfinished request
    waiting: tuple[str, ...]  # queue order, head first
    running: tuple[str, ...]  # running order
    kv: KVState
