"""The dense baseline: one request at a time, keys and values in one contiguous cache.

No blocks, no slot mapping, no batching: position p's KV sits at row p. This
is the run every scheduled, paged, batched execution must reproduce token
for token. The drafter reuses DenseSequence for its own model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from schedspec.gpu_impl.execution.stop_rules import StopRule
from schedspec.gpu_impl.execution.tiny_model import TinyModel, causal_attention


class DenseSequence:
    """One request's contiguous KV cache: rows 0..length-1 hold its first tokens."""

    def __init__(self, model: TinyModel, capacity: int) -> None:
        cfg = model.config
        shape = (capacity, cfg.num_heads, cfg.head_dim)
        self.model = model
        self.keys = [
            torch.zeros(shape, dtype=model.dtype, device=model.device)
            for _ in range(cfg.num_layers)
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.length = 0

    def feed(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Append tokens; the logits [len(token_ids), vocab] they produce."""
        start, end = self.length, self.length + len(token_ids)
        positions = torch.arange(start, end, device=self.model.device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.keys[layer][start:end] = k
            self.values[layer][start:end] = v
            keys, values = self.keys[layer][:end], self.values[layer][:end]
            return causal_attention(q[None], keys[None], values[None], positions[None])[0]

        tokens = torch.tensor(list(token_ids), dtype=torch.long, device=self.model.device)
        hidden = self.model.forward(tokens, positions, attend)
        self.length = end
        return self.model.logits(hidden)

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (their rows are rewritten when fed again)."""
        self.length = min(self.length, length)


def dense_generate(model: TinyModel, prompt_token_ids: Sequence[int], stop: StopRule) -> list[int]:
    """Greedy generation of one request alone, stopped by the spec's rules."""
    sequence = DenseSequence(model, stop.max_model_len)
    logits = sequence.feed(prompt_token_ids)[-1]
    outputs: list[int] = []
    while True:
        outputs.append(int(torch.argmax(logits)))
        if stop.is_done(len(prompt_token_ids), outputs):
            return outputs
        logits = sequence.feed(outputs[-1:])[-1]
