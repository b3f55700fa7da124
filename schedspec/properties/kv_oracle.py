"""The harness's record of which content each block's KV holds (CACHE-COMPUTED's oracle).

No engine reports what its attention kernels wrote, but the harness knows
which tokens each step computed into which blocks. Steps run in the order
they are scheduled, so once a step is scheduled, every later step finds the
KV of the known tokens it computes, even before it lands. That holds when
the step's start is certain: with a sampling step in flight (async
scheduling) the next step starts after however many of its drafts are
accepted, which only that landing tells: so such a step's known tokens are
recorded once the step before it has landed, and again when it lands itself
(a later step may hit a block it completes while it is still in flight: the
KV is written by the time that later step runs). A request that ends on that
landing (a stop among the tokens just sampled) still has its step in flight: the
step runs, and writes the KV of the sampled token it was fed, which an engine may
cache with the ended request (SGLang caches a finished request's committed KV,
the in-flight decode's position included). Drafts become known tokens, and their
blocks' KV content certain, only when their own step lands. A block handed out
afresh is about to be overwritten, so its old content is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from schedspec.spec import (
    BlockHash,
    ModelRunnerOutput,
    RequestState,
    SchedulerOutput,
    State,
)
from schedspec.spec.block_hash import extend_block_hashes
from schedspec.spec.invariants import ChainHashes, ScheduleTransition, expected_kept


class KVContentOracle:
    def __init__(self, hashes: ChainHashes) -> None:
        self.hashes = hashes
        self.block_size = hashes.block_size
        # Block -> the content hash whose KV steps scheduled so far compute into it.
        self.written: dict[int, BlockHash] = {}
        # Schedules so far; each step in flight's number (by its output's id, until it
        # lands); and the number of the schedule that last handed each block out afresh.
        self._schedules = 0
        self._number_of: dict[int, int] = {}
        self._handed_out_at: dict[int, int] = {}

    def on_schedule(self, t: ScheduleTransition) -> frozenset[str]:
        """After a schedule() that broke no invariant: forget the blocks about to be
        overwritten, then remember the full blocks of known tokens the step computes; the
        requests whose record waits for the step in flight before it (on_start_certain)."""
        pre, output, mid, before = t.pre, t.output, t.post, t.computed_before
        bs = self.block_size
        self._schedules += 1
        self._number_of[id(output)] = self._schedules
        for rid in output.num_scheduled_tokens:
            request = mid.requests[rid]
            table = request.block_ids
            old = pre.requests.get(rid)
            if old is not None and old.block_ids and old.block_ids == table[: len(old.block_ids)]:
                fresh = table[len(old.block_ids) :]
            else:
                fresh = table[before.get(rid, 0) // bs :]
            for block in fresh:
                self.written.pop(block, None)
                self._handed_out_at[block] = self._schedules
        deferred = set()
        for rid in output.num_scheduled_tokens:
            old = pre.requests.get(rid)
            if old is not None and old.num_output_placeholders:
                deferred.add(rid)  # where it starts depends on a step in flight
                continue
            request = mid.requests[rid]
            done = min(request.num_computed_tokens, request.num_tokens)
            own = self.hashes.of(request)
            self._remember(own, request.block_ids, before.get(rid, 0) // bs, done // bs)
        return frozenset(deferred)

    def on_sync_loads(self, output: SchedulerOutput, mid: State) -> None:
        """Before a schedule()'s checks: a KV connector's sync load writes the KV of the
        tokens it brings inside the step that admits the request, before attention reads
        them. An admitted request with remote KV: the blocks past those already holding
        its content, up to what the remote side holds, hold it now."""
        if mid.connector is None:
            return
        admitted = [(d.request_id, d.num_computed_tokens) for d in output.scheduled_new_reqs]
        admitted += [
            (d.request_id, d.num_computed_tokens) for d in output.scheduled_cached_reqs if d.resumed
        ]
        for rid, computed in admitted:
            request = mid.requests.get(rid)
            if request is None or request.remote_kv is None:
                continue
            self._remember_loaded(request, computed, request.remote_kv.num_tokens)

    def on_loads_landed(self, pre: State, post: State, landed: frozenset[str]) -> None:
        """After an update whose worker report lists these loads done: each still parked
        holds its content in the blocks its (possibly cut) computed tokens cover."""
        for rid in landed:
            before = pre.requests.get(rid)
            after = post.requests.get(rid)
            if before is None or after is None or before.remote_kv is None:
                continue
            self._remember_loaded(after, after.num_computed_tokens, before.remote_kv.num_tokens)

    def _remember_loaded(self, request: RequestState, computed: int, remote: int) -> None:
        own = self.hashes.of(request)
        table = request.block_ids
        bs = self.block_size
        end = min(computed, remote) // bs
        index = 0
        while index < end and index < len(table) and self.written.get(table[index]) == own[index]:
            index += 1  # a local prefix hit: already there
        self._remember(own, table, index, end)

    def on_start_certain(
        self,
        step: ScheduledStep,
        pre: State,
        state: State,
        model_output: ModelRunnerOutput,
        sampled_at: Mapping[str, int],
    ) -> None:
        """Once the only step in flight before `step` has landed (`pre` and `state`: just
        before and after; `model_output` and `sampled_at`: what it sampled and where, as
        on_land takes them), where `step` starts is certain for the requests on_schedule
        deferred: at their confirmed computed tokens (rejected drafts are rolled back by
        now). Remember the full blocks of the known tokens it computes from there (its
        drafts' KV waits for its own landing), in the blocks the request still holds. A
        request that ended on the landing is fed the last token it sampled, just past
        those: see _remember_ended."""
        bs = self.block_size
        drafts = step.output.scheduled_spec_decode_tokens
        for rid in step.deferred:
            known = step.output.num_scheduled_tokens[rid] - len(drafts.get(rid, ()))
            request = state.requests.get(rid)
            if request is None or request.arrival != step.arrivals[rid]:
                ended = pre.requests.get(rid)
                sampled = model_output.sampled_token_ids.get(rid)
                if ended is not None and ended.arrival == step.arrivals[rid] and sampled:
                    end = sampled_at[rid] + len(sampled)
                    self._remember_ended(ended, tuple(sampled), step.tables[rid], end - known, end)
                continue
            start = request.num_confirmed_computed_tokens
            end = min(start + known, request.num_tokens)
            held = set(request.block_ids)
            table = tuple(b if b in held else -1 for b in step.tables[rid])
            self._remember(self.hashes.of(request), table, start // bs, end // bs)

    def _remember_ended(
        self,
        ended: RequestState,
        sampled: tuple[int, ...],
        table: tuple[int, ...],
        start: int,
        end: int,
    ) -> None:
        """The step in flight of a request that ended on the landing before it computes
        positions start..end-1 into `table`, whatever the request kept: the model runner
        feeds it the tokens sampled there. So the blocks it completes hold the KV of the
        request's tokens followed by everything that landing sampled. (Nobody can have
        been handed those blocks since: only schedule() hands out blocks; the next one
        forgets them if it does.)"""
        bs = self.block_size
        content = ended.prompt_token_ids + ended.output_token_ids + sampled
        # A copy: ChainHashes keeps only the tokens a request keeps.
        own = extend_block_hashes(list(self.hashes.of(ended)), content, bs)
        self._remember(own, table, start // bs, end // bs)

    def on_land(
        self,
        step: ScheduledStep,
        pre: State,
        model_output: ModelRunnerOutput,
        sampled_at: Mapping[str, int],
    ) -> None:
        """When a sampling step's output lands (pre: the state just before; sampled_at:
        where the model runner found each request's next position when it ran the step):
        the step computed its n - d known tokens up to that position, then its d drafts,
        so it wrote valid KV from position - (n - d) up to its kept tokens but the last
        (the newly sampled token has none yet), accepted drafts included, into the table
        it was scheduled with. Stale output counts too: the step ran although its request
        was preempted since; its blocks keep that KV unless handed to another request
        (the step scheduled after it, which overwrites them), whether that request still
        holds them or was aborted since."""
        bs = self.block_size
        max_model_len = pre.config.max_model_len
        held_by = {b: rid for rid, r in pre.requests.items() for b in r.block_ids}
        # A block handed out afresh by a later schedule holds what that later step writes
        # (it runs after this one), also once its new holder is gone (aborted meanwhile).
        number = self._number_of.pop(id(step.output), None)
        drafts = step.output.scheduled_spec_decode_tokens
        for rid, num in step.output.num_scheduled_tokens.items():
            sampled = tuple(model_output.sampled_token_ids.get(rid, ()))
            request = pre.requests.get(rid)
            if not sampled or request is None or request.arrival != step.arrivals.get(rid):
                continue  # a chunk (recorded when scheduled), or finished or aborted since
            start = sampled_at[rid] - (num - len(drafts.get(rid, ())))
            kept = min(expected_kept(request, sampled, max_model_len), len(sampled))
            end = request.num_tokens + kept - 1
            if end // bs > request.num_tokens // bs:
                # Kept tokens complete a block: they name its content.
                request = replace(
                    request, output_token_ids=request.output_token_ids + sampled[:kept]
                )
            own = self.hashes.of(request)
            table = step.tables[rid]
            for index in range(start // bs, min(end // bs, len(table), len(own))):
                block = table[index]
                later = number is not None and self._handed_out_since(block, number)
                if held_by.get(block, rid) == rid and not later:
                    self.written[block] = own[index]

    def _handed_out_since(self, block: int, number: int) -> bool:
        """Did a schedule after the numbered one hand the block out afresh?"""
        return self._handed_out_at.get(block, 0) > number

    def _remember(self, own: list[BlockHash], table: tuple[int, ...], first: int, end: int) -> None:
        """Blocks first..end-1 of `table` (-1: none) hold the KV of the content whose
        chained block hashes are `own`."""
        for index in range(first, min(end, len(table), len(own))):
            if table[index] >= 0:
                self.written[table[index]] = own[index]


@dataclass(frozen=True)
class ScheduledStep:
    """A scheduled step as the oracle needs it when it lands: the output, for each
    request it scheduled the incarnation (arrival index) and block table it had then, and
    the requests whose record waited for the step in flight before it (on_schedule)."""

    output: SchedulerOutput
    arrivals: Mapping[str, int]
    tables: Mapping[str, tuple[int, ...]]
    deferred: frozenset[str] = frozenset()

    @staticmethod
    def of(
        output: SchedulerOutput, mid: State, deferred: frozenset[str] = frozenset()
    ) -> ScheduledStep:
        """From the output, the state schedule() left, and on_schedule's deferred requests."""
        requests = mid.requests
        scheduled = [rid for rid in output.num_scheduled_tokens if rid in requests]
        return ScheduledStep(
            output,
            {rid: requests[rid].arrival for rid in scheduled},
            {rid: requests[rid].block_ids for rid in scheduled},
            deferred & set(scheduled),
        )
