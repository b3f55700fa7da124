"""The abstract state every engine is seen through (the refinement mapping's target).

Adapters map their engine's concrete state to these frozen records; every
invariant is a predicate over them, so one suite serves every engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from schedspec.spec.block_hash import BlockHash
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.connector import ConnectorState, RemoteKV
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
    # The pipeline (docs/SPEC.md, "Async scheduling"); all 0 on an idle request.
    num_in_flight_tokens: int = 0  # scheduled, output not applied yet
    num_output_placeholders: int = 0  # output positions of in-flight sampling steps
    num_stale_output_tokens: int = 0  # in-flight tokens of steps before a preemption
    drop_stale_output: bool = False  # stale output dropped, not delivered
    # Aborted by finish_requests, finishing when the next step that runs it lands
    # (an engine that defers aborts of running requests: SGLang).
    abort_pending: bool = False
    # The last step scheduled for it stopped short of its known tokens and
    # in-flight outputs, so it samples nothing (and drafts for it are dropped).
    is_prefill_chunk: bool = False
    # What the KV connector holds for it elsewhere (None: nothing, or no connector).
    remote_kv: RemoteKV | None = None
    # A hybrid config's block tables (docs/SPEC.md, "Hybrid KV cache groups"): one per
    # entry of config.kv_cache_groups, in config order, each in token-block order at
    # that group's own block size, NULL_BLOCK_ID where the group holds the null block.
    # Empty for the single group. block_ids then lists every non-null block the
    # request holds, group 0's table first, so the pool-level checks count holders
    # the same way for either.
    group_block_ids: tuple[tuple[int, ...], ...] = ()
    # A hybrid config's shared-prefix junction (docs/SPEC.md, "Hybrid KV cache groups",
    # Mamba): the longest hit one group alone had at the request's last prefix-cache
    # lookup, where the reconciled hit was shorter, else 0 (vLLM's
    # Request.shared_prefix_boundary). It stays while the request runs and through a
    # preemption, until the next lookup. 0 for the single group and for engines without
    # hybrid groups.
    shared_prefix_boundary: int = 0

    # A cached value, not a field: the checks read it about forty times a step, and
    # `of` fills it in as it builds the record (the fields it follows are frozen).
    @cached_property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_confirmed_computed_tokens(self) -> int:
        """Computed tokens whose step's output has been applied."""
        return self.num_computed_tokens - self.num_in_flight_tokens

    @property
    def sure_to_reach_max_tokens(self) -> bool:
        """Is it sure to reach max_tokens once its in-flight sampling step lands, even if
        every draft of that step is rejected? That step's tokens are in
        num_computed_tokens and its 1 + drafts positions are placeholders, so
        computed + 1 - (placeholders - 1) tokens are sure."""
        placeholders = self.num_output_placeholders
        sure_tokens = self.num_computed_tokens + 2 - placeholders
        return placeholders > 0 and sure_tokens >= len(self.prompt_token_ids) + self.max_tokens

    @property
    def awaits_stale_output(self) -> bool:
        """A preempted request whose pre-preemption output is still in flight (and will
        be delivered): resuming it now would compute again a position that output fills."""
        return self.num_stale_output_tokens > 0 and not self.drop_stale_output

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @staticmethod
    def of(
        request: Request,
        block_ids: tuple[int, ...],
        group_block_ids: tuple[tuple[int, ...], ...] = (),
    ) -> RequestState:
        """A snapshot of a spec Request (mutable lists copied into tuples).

        Snapshots are taken twice a checked step for every live request, and a
        frozen dataclass's __init__ sets each of its 22 fields through
        object.__setattr__. Filling the new instance's __dict__ in one update
        builds the very same object (same fields, equality, hash, replace())
        at a fraction of the cost.
        """
        state = object.__new__(RequestState)
        prompt = request.prompt_token_ids
        outputs = tuple(request.output_token_ids)
        vars(state).update(
            request_id=request.request_id,
            priority=request.priority,
            arrival=request.arrival,
            prompt_token_ids=prompt,
            output_token_ids=outputs,
            spec_token_ids=tuple(request.spec_token_ids),
            num_computed_tokens=request.num_computed_tokens,
            status=request.status,
            block_ids=block_ids,
            num_preemptions=request.num_preemptions,
            max_tokens=request.max_tokens,
            eos_token_id=request.eos_token_id,
            stop_token_ids=request.stop_token_ids,
            num_in_flight_tokens=request.num_in_flight_tokens,
            num_output_placeholders=request.num_output_placeholders,
            num_stale_output_tokens=request.num_stale_output_tokens,
            drop_stale_output=request.drop_stale_output,
            abort_pending=request.abort_pending,
            is_prefill_chunk=request.is_prefill_chunk,
            remote_kv=request.remote_kv,
            group_block_ids=group_block_ids,
            shared_prefix_boundary=request.shared_prefix_boundary,
            num_tokens=len(prompt) + len(outputs),
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

    def hashes_carried(self, blocks: Sequence[int]) -> list[BlockHash | None] | None:
        """The hash each of `blocks` carries, in their order, or None if an id is out of
        range: the cache checks' common cases compare these lists in C loops."""
        hashes = self.block_hashes
        if blocks and (min(blocks) < 0 or max(blocks) >= len(hashes)):
            return None
        return list(map(hashes.__getitem__, blocks))


# The kind of batch an SGLang step ran: prompts only (extend), one token for each
# running request (decode), both (mixed: enable_mixed_chunk), or nothing (idle).
BatchKind = Literal["extend", "decode", "mixed", "idle"]


@dataclass(frozen=True)
class SGLangState:
    """What SGLang's policy keeps beyond the requests and the pool (docs/SPEC.md,
    "Two families"); the `sglang` profile's invariants read it.

    In the abstract KV state a token slot (a page, when page_size > 1) is a block;
    the radix tree's slots are cached blocks, with the chain hash of the prefix up to
    and including them; a slot locked by live requests is held by each of them; an
    evictable slot (in the tree, unlocked) is a free block that keeps its hash; and
    free_block_ids lists the allocator's free slots in the order it hands them out,
    then the evictable ones in the order the radix cache evicts them. A request
    between the chunks of its prefill (SGLang's chunked_req) is RUNNING; a
    retracted one is PREEMPTED, in waiting, with its outputs kept.
    """

    # The fraction of each running request's remaining max_new_tokens that
    # admission reserves for it; decays each decode step, jumps after a retraction.
    new_token_ratio: float
    # The admission latch: set when an admission failed for lack of KV; no request
    # is admitted again until one leaves the running batch.
    batch_is_full: bool
    # The request between chunks of its prefill (at most one), or None.
    chunked_request_id: str | None
    # The kind of the batch the last step ran (None before the first step).
    last_batch_kind: BatchKind | None
    # Whether free_block_ids' evictable tail is in the cache's real eviction order.
    # An engine whose cache hides that order (SGLang's Rust radix tree: docs/FINDINGS.md
    # G2) lists the tail in some other order and says so here; SG-EVICT-ORDER then
    # holds it only to evicting blocks that were evictable.
    eviction_order_observed: bool = True
    # SGLang's count of the prefill passes that found requests waiting with the radix
    # cache on: the pass that finds it at a multiple of 32 refreshes the waiting
    # requests' prefix recency (spec.sglang_refresh), which SG-EVICT-ORDER then judges.
    # None where the engine does not expose it.
    prefill_passes: int | None = None


@dataclass(frozen=True)
class State:
    config: SchedulerConfig
    requests: Mapping[str, RequestState]  # every unfinished request
    waiting: tuple[str, ...]  # queue order, head first
    running: tuple[str, ...]  # running order
    kv: KVState
    # The SGLang family's own policy state; None for an engine of another family.
    sglang: SGLangState | None = None
    # The KV connector's part (loads, blocks held for it); None without a connector.
    connector: ConnectorState | None = None

    def queue_of(self, request_id: str) -> str:
        """Where a request sits, in the words a violation's `actual` uses."""
        places = [
            q
            for q, ids in (("running", self.running), ("waiting", self.waiting))
            if request_id in ids
        ]
        if places:
            return " and ".join(places)
        return "in no queue" if request_id in self.requests else "not live"

    def held_tables(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every block table that holds blocks: the live requests', then the finished
        requests' whose blocks wait for the connector (CONSERVATION counts both)."""
        tables = [(rid, r.block_ids) for rid, r in self.requests.items()]
        if self.connector is not None:
            tables += [(rid, held.block_ids) for rid, held in self.connector.held.items()]
        return tables
