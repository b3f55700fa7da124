"""The paged KV cache and attention that reads it only through block tables.

One tensor [num_blocks, block_size, heads, head_dim] per layer for keys and
one for values. A step first writes every scheduled token's K/V at its slot
(slot_mapping), then each request attends, causally, over the slots its own
block table names for positions 0..seq_len-1.
"""

from __future__ import annotations

import torch

from schedspec.gpu_impl.execution.input_batch import InputBatch
from schedspec.gpu_impl.execution.tiny_model import TinyModelConfig, causal_attention


class PagedKVCache:
    def __init__(
        self,
        model: TinyModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_blocks, block_size, model.num_heads, model.head_dim)
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        self.keys = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(model.num_layers)
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]

    def _flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [num_slots, heads, head_dim]: slot = block_id * block_size + offset."""
        k, v = self.keys[layer], self.values[layer]
        return k.view(self.num_slots, *k.shape[2:]), v.view(self.num_slots, *v.shape[2:])

    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store each token's K/V at its slot; slot -1 means no write (vLLM's padding slot)."""
        keys, values = self._flat(layer)
        keep = slot_mapping >= 0
        keys[slot_mapping[keep]] = k[keep]
        values[slot_mapping[keep]] = v[keep]

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._flat(layer)
        return keys[slots], values[slots]


def context_slots(block_table_row: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """The slots of positions 0..seq_len-1 of one request, through its block table."""
    positions = torch.arange(seq_len, device=block_table_row.device)
    return block_table_row[positions // block_size] * block_size + positions % block_size


def paged_attention(
    cache: PagedKVCache,
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: InputBatch,
    contexts: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """Write this step's K/V, then attend: prefills one request at a time, decodes
    in one batched call (as vLLM splits them), each over its own context slots."""
    cache.write(layer, batch.slot_mapping, k, v)
    out = torch.empty_like(q)
    decodes = []
    for index, entry in enumerate(batch.requests):
        if entry.is_decode:
            decodes.append(index)
            continue
        rows = slice(entry.start, entry.start + entry.num_tokens)
        keys, values = cache.gather(layer, contexts[index])
        out[rows] = causal_attention(
            q[rows][None], keys[None], values[None], batch.positions[rows][None]
        )[0]
    if decodes:
        _decode_attention(cache, layer, q, batch, contexts, decodes, out)
    return out


def _decode_attention(
    cache: PagedKVCache,
    layer: int,
    q: torch.Tensor,
    batch: InputBatch,
    contexts: tuple[torch.Tensor, ...],
    decodes: list[int],
    out: torch.Tensor,
) -> None:
    """Decodes (1 + drafts queries each) padded to one [R, Q] query block and one
    [R, C] context block; padded keys sit past each context and are masked."""
    entries = [batch.requests[i] for i in decodes]
    width = max(e.num_tokens for e in entries)
    rows = torch.tensor(
        [[e.start + min(j, e.num_tokens - 1) for j in range(width)] for e in entries],
        device=q.device,
    )
    slots = torch.nn.utils.rnn.pad_sequence([contexts[i] for i in decodes], batch_first=True)
    keys, values = cache.gather(layer, slots)
    result = causal_attention(q[rows], keys, values, batch.positions[rows])
    for r, entry in enumerate(entries):
        out[entry.start : entry.start + entry.num_tokens] = result[r, : entry.num_tokens]
