"""The paged model runner: SchedulerOutput in, ModelRunnerOutput out.

One step: learn the step from the SchedulerOutput (request_states.py), build
the flattened batch (input_batch.py), run one forward pass whose attention
writes and reads the paged cache (paged_attention.py), then sample greedily
and verify drafts (sampler.py). The slot mapping and the context slots come
from two methods, write_slots and context_slots: the one injection point a
test subclass overrides to build a runner mutant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedspec.gpu_impl.execution.errors import ExecutionError
from schedspec.gpu_impl.execution.input_batch import InputBatch, build_input_batch, table_slots
from schedspec.gpu_impl.execution.paged_attention import (
    PagedKVCache,
    context_slots,
    paged_attention,
)
from schedspec.gpu_impl.execution.request_states import RequestStates, RunnerRequestState
from schedspec.gpu_impl.execution.sampler import verify_greedy
from schedspec.gpu_impl.execution.tiny_model import TinyModel
from schedspec.spec import ModelRunnerOutput, SchedulerConfig, SchedulerOutput
from schedspec.spec.config import require_single_kv_group


@dataclass(frozen=True)
class ExecutedStep:
    """What the last step did to the cache, for the slot-safety checks."""

    batch: InputBatch
    contexts: tuple[torch.Tensor, ...]  # per scheduled request: the slots its attention read


class PagedModelRunner:
    def __init__(self, model: TinyModel, config: SchedulerConfig) -> None:
        require_single_kv_group(
            config,
            "the paged model runner",
            "one paged cache at one block size: a hybrid model's groups need a cache each "
            "(docs/GPU_IMPL.md, 'No hybrid KV cache groups')",
        )
        self.model = model
        self.block_size = config.block_size
        self.cache = PagedKVCache(
            model.config, config.num_blocks, config.block_size, model.dtype, model.device
        )
        self.states = RequestStates()
        self.last_step: ExecutedStep | None = None

    def write_slots(
        self, state: RunnerRequestState, positions: range, block_size: int
    ) -> list[int]:
        return table_slots(state, positions, block_size)

    def context_slots(self, batch: InputBatch, index: int) -> torch.Tensor:
        entry = batch.requests[index]
        seq_len = entry.num_computed_before + entry.num_tokens
        return context_slots(batch.block_table[index], seq_len, self.block_size)

    def token_ids(self, request_id: str) -> list[int]:
        """The request's known tokens: prompt and every token sampled so far."""
        return self.states.get(request_id).token_ids

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self.states.apply(scheduler_output)
        self.last_step = None
        if not scheduler_output.num_scheduled_tokens:
            return ModelRunnerOutput()
        batch = build_input_batch(
            scheduler_output, self.states, self.block_size, self.model.device, self.write_slots
        )
        if batch.slot_mapping.numel() and int(batch.slot_mapping.max()) >= self.cache.num_slots:
            raise ExecutionError(
                "block_ids",
                f"slot {int(batch.slot_mapping.max())} is past the cache's "
                f"{self.cache.num_slots} slots",
            )
        contexts = tuple(self.context_slots(batch, i) for i in range(len(batch.requests)))
        hidden = self.model.forward(
            batch.token_ids,
            batch.positions,
            lambda layer, q, k, v: paged_attention(self.cache, layer, q, k, v, batch, contexts),
        )
        self.last_step = ExecutedStep(batch, contexts)
        return ModelRunnerOutput(sampled_token_ids=self._sample(batch, hidden))

    def _sample(self, batch: InputBatch, hidden: torch.Tensor) -> dict[str, list[int]]:
        """Greedy tokens at every sampled row, one argmax call for the whole batch."""
        rows = [row for entry in batch.requests for row in entry.logits_rows]
        if not rows:
            return {}
        index = torch.tensor(rows, dtype=torch.long, device=hidden.device)
        greedy: list[int] = torch.argmax(self.model.logits(hidden[index]), dim=-1).tolist()
        sampled: dict[str, list[int]] = {}
        taken = 0
        for entry in batch.requests:
            width = len(entry.logits_rows)
            if width:
                tokens = verify_greedy(entry.drafts, greedy[taken : taken + width])
                taken += width
                sampled[entry.request_id] = tokens
                self.states.get(entry.request_id).token_ids.extend(tokens)
        return sampled
