"""Slot safety: named predicates over one executed step, checked on every step.

Each predicate compares what the runner did (its batch, its writes, the
slots its attention read) with the engine's own view of the step (the
SchedulerOutput and the snapshot taken right after schedule()), never with
the runner's bookkeeping. Each returns a message naming the first breach,
or None when it holds.

- BATCH-LAYOUT: each request's slice of the batch holds its own tokens at
  positions computed_before .. computed_before + scheduled - 1.
- SLOT-UNIQUE: no two tokens of a step write the same slot.
- WRITE-NO-CLOBBER: every write lands in a block of the writer's own table,
  and in a block another live request holds (a prefix-cache block) only as
  the KV that request expects there: shared content is filled, never changed.
- READ-OWN-TABLE: a request's attention reads exactly the slots its own block
  table gives for positions 0 .. seq_len - 1.
- READ-FRESH: every slot read holds the KV of the reader's own prefix
  (kv_provenance.py), so nothing stale or foreign is read.
- CACHED-KV-FRESH: a prefix-cache hit's blocks hold, within float
  tolerance, the KV a fresh dense computation of those tokens produces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.execution.dense_runner import DenseSequence
from schedspec.gpu_impl.execution.kv_provenance import KvProvenance
from schedspec.gpu_impl.execution.model_runner import ExecutedStep, PagedModelRunner
from schedspec.gpu_impl.execution.paged_attention import context_slots
from schedspec.spec import SchedulerOutput, State


@dataclass(frozen=True)
class StepView:
    """One executed step: the engine's account beside the runner's work."""

    scheduler_output: SchedulerOutput
    state: State  # the engine's snapshot right after schedule()
    step: ExecutedStep
    # Per live request: known tokens, then the drafts scheduled this step.
    sequences: Mapping[str, tuple[int, ...]]
    tags: Mapping[str, list[int]]  # the prefix tag of each position of `sequences`

    def table(self, request_id: str) -> torch.Tensor:
        device = self.step.batch.block_table.device
        ids = self.state.requests[request_id].block_ids
        return torch.tensor(ids, dtype=torch.long, device=device)

    def seq_len(self, request_id: str) -> int:
        """Tokens with KV once the step is done (num_computed_tokens after schedule())."""
        return self.state.requests[request_id].num_computed_tokens


@dataclass
class CheckContext:
    runner: PagedModelRunner
    provenance: KvProvenance
    tolerance: float


Predicate = Callable[[StepView, CheckContext], str | None]


def batch_layout(view: StepView, ctx: CheckContext) -> str | None:
    batch = view.step.batch
    for entry in batch.requests:
        rid = entry.request_id
        scheduled = view.scheduler_output.num_scheduled_tokens[rid]
        start = view.seq_len(rid) - scheduled
        rows = slice(entry.start, entry.start + entry.num_tokens)
        want_tokens = list(view.sequences[rid][start : start + scheduled])
        if batch.token_ids[rows].tolist() != want_tokens:
            last = start + scheduled - 1
            return f"request {rid!r}: batch tokens differ from its tokens at {start}..{last}"
        if batch.positions[rows].tolist() != list(range(start, start + scheduled)):
            return f"request {rid!r}: positions are not {start}..{start + scheduled - 1}"
    return None


def slot_unique(view: StepView, ctx: CheckContext) -> str | None:
    slots = view.step.batch.slot_mapping
    written = slots[slots >= 0]
    values, counts = torch.unique(written, return_counts=True)
    if bool((counts > 1).any()):
        slot = int(values[counts > 1][0])
        return f"slot {slot} is written by {int(counts[counts > 1][0])} tokens in one step"
    return None


def write_no_clobber(view: StepView, ctx: CheckContext) -> str | None:
    """Writes go to the writer's own blocks, and a block another live request also
    holds may only be filled with the KV that request expects there.

    Not plain exclusivity: like vLLM, a scheduler registers a block in the
    prefix cache when it schedules the block's computation, so a request
    admitted later in the same step can hit a block its first owner is
    writing right now. That is safe because every layer writes the whole
    batch's KV before any request reads (paged_attention.py).
    """
    block_size = ctx.runner.block_size
    holders: dict[int, list[tuple[str, int]]] = {}  # block -> (request, index in its table)
    for rid, request in view.state.requests.items():
        for index, block in enumerate(request.block_ids):
            holders.setdefault(block, []).append((rid, index))
    batch = view.step.batch
    for entry in batch.requests:
        rid = entry.request_id
        rows = slice(entry.start, entry.start + entry.num_tokens)
        for slot, position in zip(
            batch.slot_mapping[rows].tolist(), batch.positions[rows].tolist(), strict=True
        ):
            if slot < 0:
                continue
            block, offset = divmod(slot, block_size)
            owners = holders.get(block, [])
            if all(holder != rid for holder, _ in owners):
                return f"request {rid!r} writes block {block}, not in its table"
            for holder, index in owners:
                theirs = index * block_size + offset
                tags = view.tags[holder]
                if holder != rid and (
                    theirs != position
                    or theirs >= len(tags)
                    or tags[theirs] != view.tags[rid][position]
                ):
                    return (
                        f"request {rid!r} writes position {position} into block {block}, "
                        f"which {holder!r} holds with other content"
                    )
    return None


def read_own_table(view: StepView, ctx: CheckContext) -> str | None:
    for entry, read in zip(view.step.batch.requests, view.step.contexts, strict=True):
        rid = entry.request_id
        want = context_slots(view.table(rid), view.seq_len(rid), ctx.runner.block_size)
        if read.shape != want.shape or not bool(torch.equal(read, want)):
            last = view.seq_len(rid) - 1
            return f"request {rid!r} reads slots other than its block table's for 0..{last}"
    return None


def read_fresh(view: StepView, ctx: CheckContext) -> str | None:
    """Tag this step's writes, then check every read's tag (writes precede reads)."""
    batch = view.step.batch
    written: list[int] = []
    for entry in batch.requests:
        positions = batch.positions[entry.start : entry.start + entry.num_tokens].tolist()
        written.extend(view.tags[entry.request_id][p] for p in positions)
    ctx.provenance.record_writes(batch.slot_mapping.cpu(), torch.tensor(written, dtype=torch.long))
    for entry, read in zip(batch.requests, view.step.contexts, strict=True):
        rid = entry.request_id
        found = ctx.provenance.tags_at(read.cpu())
        want = torch.tensor(view.tags[rid][: len(found)], dtype=torch.long)
        stale = (found != want).nonzero()
        if len(stale):
            position = int(stale[0])
            return f"request {rid!r} reads position {position} from a slot holding other KV"
    return None


def cached_kv_fresh(view: StepView, ctx: CheckContext) -> str | None:
    out = view.scheduler_output
    hits = [(n.request_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
    hits += [(c.request_id, c.num_computed_tokens) for c in out.scheduled_cached_reqs if c.resumed]
    runner = ctx.runner
    for rid, num_hit in hits:
        if num_hit == 0:
            continue
        fresh = DenseSequence(runner.model, num_hit)
        fresh.feed(view.sequences[rid][:num_hit])
        slots = context_slots(view.table(rid), num_hit, runner.block_size)
        for layer in range(runner.model.config.num_layers):
            keys, values = runner.cache.gather(layer, slots)
            if not (
                torch.allclose(keys, fresh.keys[layer], atol=ctx.tolerance, rtol=0)
                and torch.allclose(values, fresh.values[layer], atol=ctx.tolerance, rtol=0)
            ):
                return (
                    f"request {rid!r}: cached KV of its first {num_hit} tokens (layer {layer}) "
                    "differs from a fresh computation"
                )
    return None


PREDICATES: tuple[tuple[str, Predicate], ...] = (
    ("BATCH-LAYOUT", batch_layout),
    ("SLOT-UNIQUE", slot_unique),
    ("WRITE-NO-CLOBBER", write_no_clobber),
    ("READ-OWN-TABLE", read_own_table),
    # Before READ-FRESH: a bad hit is reported as what it is, not as a stale read.
    ("CACHED-KV-FRESH", cached_kv_fresh),
    ("READ-FRESH", read_fresh),
)
