"""SchedulerOutput -> one flattened input batch, as vLLM's model runner builds it.

Every scheduled token of every request sits side by side in one batch:
prefill chunks, decodes and draft tokens, in scheduling order. Beside the
token ids and positions go query_start_loc (where each request's tokens
start), seq_lens (its context length after the step), the slot each token's
KV is written to, and the block tables padded into one tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.execution.errors import ExecutionError
from schedspec.gpu_impl.execution.request_states import RequestStates, RunnerRequestState
from schedspec.spec import SchedulerOutput

# (request, positions, block_size) -> the KV slot of each position; -1 skips the write.
SlotMapper = Callable[[RunnerRequestState, range, int], list[int]]


def table_slots(state: RunnerRequestState, positions: range, block_size: int) -> list[int]:
    """Position p lives at block_ids[p // block_size] * block_size + p % block_size."""
    table = state.block_ids
    if positions and (positions[-1] // block_size) >= len(table):
        raise ExecutionError(
            "block_ids",
            f"request {state.request_id!r}: a table of {len(table)} blocks of {block_size} "
            f"does not cover position {positions[-1]}",
        )
    return [table[p // block_size] * block_size + p % block_size for p in positions]


@dataclass(frozen=True)
class ScheduledRequest:
    request_id: str
    start: int  # index of its first token in the flattened batch
    num_tokens: int  # scheduled this step
    num_computed_before: int
    drafts: tuple[int, ...]  # the last len(drafts) scheduled tokens
    samples: bool  # the step reaches the last known token: logits are sampled
    is_decode: bool  # only the last known token and drafts: no prompt or recompute

    @property
    def logits_rows(self) -> range:
        """Batch rows whose logits are sampled: the last known token and each draft."""
        if not self.samples:
            return range(0)
        end = self.start + self.num_tokens
        return range(end - len(self.drafts) - 1, end)


@dataclass(frozen=True)
class InputBatch:
    requests: tuple[ScheduledRequest, ...]
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    query_start_loc: torch.Tensor  # [R + 1]
    seq_lens: torch.Tensor  # [R]: context length after this step
    slot_mapping: torch.Tensor  # [T]: where each token's KV is written
    block_table: torch.Tensor  # [R, max blocks], padded with 0 as vLLM does
    num_prefill_tokens: int
    num_decode_tokens: int


def _schedule_one(
    rid: str, num_tokens: int, drafts: tuple[int, ...], state: RunnerRequestState, start: int
) -> tuple[ScheduledRequest, list[int]]:
    """The request's entry and the token ids of its scheduled positions."""
    computed = state.num_computed_tokens
    sequence = state.token_ids + list(drafts)
    if computed + num_tokens > len(sequence):
        raise ExecutionError(
            "num_scheduled_tokens",
            f"request {rid!r}: {computed} computed + {num_tokens} scheduled exceeds its "
            f"{len(sequence)} known and draft tokens",
        )
    known = len(state.token_ids)
    entry = ScheduledRequest(
        request_id=rid,
        start=start,
        num_tokens=num_tokens,
        num_computed_before=computed,
        drafts=drafts,
        samples=computed + num_tokens - len(drafts) >= known,
        is_decode=computed == known - 1 and num_tokens == 1 + len(drafts),
    )
    return entry, sequence[computed : computed + num_tokens]


def build_input_batch(
    out: SchedulerOutput,
    states: RequestStates,
    block_size: int,
    device: torch.device,
    write_slots: SlotMapper = table_slots,
) -> InputBatch:
    entries: list[ScheduledRequest] = []
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    tables: list[list[int]] = []
    for rid, num_tokens in out.num_scheduled_tokens.items():
        state = states.get(rid)
        drafts = tuple(out.scheduled_spec_decode_tokens.get(rid, ()))
        entry, tokens = _schedule_one(rid, num_tokens, drafts, state, len(token_ids))
        span = range(entry.num_computed_before, entry.num_computed_before + num_tokens)
        entries.append(entry)
        token_ids.extend(tokens)
        positions.extend(span)
        slots.extend(write_slots(state, span, block_size))
        tables.append(state.block_ids)
    width = max((len(t) for t in tables), default=0)
    starts = [e.start for e in entries] + [len(token_ids)]
    num_decode = sum(e.num_tokens for e in entries if e.is_decode)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return InputBatch(
        requests=tuple(entries),
        token_ids=tensor(token_ids),
        positions=tensor(positions),
        query_start_loc=tensor(starts),
        seq_lens=tensor([e.num_computed_before + e.num_tokens for e in entries]),
        slot_mapping=tensor(slots),
        block_table=tensor([b for t in tables for b in t + [0] * (width - len(t))]).reshape(
            -1, width
        ),
        num_prefill_tokens=len(token_ids) - num_decode,
        num_decode_tokens=num_decode,
    )
