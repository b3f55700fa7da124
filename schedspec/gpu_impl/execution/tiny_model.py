"""A tiny deterministic transformer: seeded random weights, pre-norm blocks.

The model does not know how keys and values are stored. Each layer hands its
queries, keys and values to an `AttentionFn`; the paged runner answers through
block tables, the dense baseline through one contiguous cache per request.
Both therefore run the same arithmetic around attention, which is what makes
their outputs comparable token for token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from schedspec.gpu_impl.execution.errors import ExecutionError

# (layer index, q, k, v), each [tokens, heads, head_dim] -> attention output, same shape.
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TinyModelConfig:
    vocab_size: int = 96
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 4
    max_positions: int = 4096  # rows of the learned position table
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ExecutionError(name, f"must be an int >= 1, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ExecutionError(
                "hidden_size",
                f"must be a multiple of num_heads ({self.num_heads}), got {self.hidden_size}",
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class LayerWeights:
    qkv: torch.Tensor  # [hidden, 3 * hidden]
    out: torch.Tensor  # [hidden, hidden]
    up: torch.Tensor  # [hidden, 4 * hidden]
    down: torch.Tensor  # [4 * hidden, hidden]


@dataclass(frozen=True)
class TinyWeights:
    embed: torch.Tensor  # [vocab, hidden]
    position: torch.Tensor  # [max_positions, hidden]
    layers: tuple[LayerWeights, ...]
    lm_head: torch.Tensor  # [hidden, vocab]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TinyWeights:
        """The same weights with fn applied to every tensor."""
        layers = tuple(
            LayerWeights(fn(w.qkv), fn(w.out), fn(w.up), fn(w.down)) for w in self.layers
        )
        return replace(
            self,
            embed=fn(self.embed),
            position=fn(self.position),
            layers=layers,
            lm_head=fn(self.lm_head),
        )


def random_weights(config: TinyModelConfig) -> TinyWeights:
    """Seeded weights, drawn on the CPU in float64 so every device gets the same model."""
    gen = torch.Generator().manual_seed(config.seed)
    hidden = config.hidden_size

    def draw(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, dtype=torch.float64) / math.sqrt(rows)

    layers = tuple(
        LayerWeights(
            draw(hidden, 3 * hidden),
            draw(hidden, hidden),
            draw(hidden, 4 * hidden),
            draw(4 * hidden, hidden),
        )
        for _ in range(config.num_layers)
    )
    return TinyWeights(
        embed=torch.randn(config.vocab_size, hidden, generator=gen, dtype=torch.float64),
        position=torch.randn(config.max_positions, hidden, generator=gen, dtype=torch.float64),
        layers=layers,
        # Scaled up so greedy picks are decisive: near-ties would make exact
        # token comparisons depend on summation order.
        lm_head=4.0 * draw(hidden, config.vocab_size),
    )


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)


class TinyModel:
    def __init__(
        self,
        config: TinyModelConfig,
        weights: TinyWeights | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        base = weights if weights is not None else random_weights(config)
        self.weights = base.map(lambda t: t.to(self.device, dtype))

    def perturbed(self, scale: float, seed: int) -> TinyModel:
        """The same model with seeded noise of relative size `scale` on every weight:
        a draft model that agrees with this one often, not always."""
        gen = torch.Generator().manual_seed(seed)

        def noisy(t: torch.Tensor) -> torch.Tensor:
            cpu = t.to("cpu", torch.float64)
            noise = torch.randn(cpu.shape, generator=gen, dtype=torch.float64)
            return cpu + scale * cpu.std() * noise

        return TinyModel(self.config, self.weights.map(noisy), self.device, self.dtype)

    def check_inputs(self, token_ids: torch.Tensor, positions: torch.Tensor) -> None:
        """Refuse token ids and positions outside the model's tables."""
        if token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= self.config.vocab_size):
            bad = token_ids[(token_ids < 0) | (token_ids >= self.config.vocab_size)][0]
            raise ExecutionError(
                "token_ids", f"must be in [0, vocab_size={self.config.vocab_size}), got {int(bad)}"
            )
        if positions.numel() and positions.max() >= self.config.max_positions:
            raise ExecutionError(
                "positions",
                f"must be < max_positions ({self.config.max_positions}), "
                f"got {int(positions.max())}",
            )

    def forward(
        self, token_ids: torch.Tensor, positions: torch.Tensor, attend: AttentionFn
    ) -> torch.Tensor:
        """Hidden states [tokens, hidden] of a flattened batch of tokens."""
        self.check_inputs(token_ids, positions)
        cfg = self.config
        w = self.weights
        x = w.embed[token_ids] + w.position[positions]
        for index, layer in enumerate(w.layers):
            qkv = _rms_norm(x) @ layer.qkv
            q, k, v = (t.reshape(-1, cfg.num_heads, cfg.head_dim) for t in qkv.chunk(3, dim=-1))
            x = x + attend(index, q, k, v).reshape(-1, cfg.hidden_size) @ layer.out
            x = x + torch.relu(_rms_norm(x) @ layer.up) @ layer.down
        return _rms_norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weights.lm_head


def causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_positions: torch.Tensor
) -> torch.Tensor:
    """Attention of a group of requests, each over its own keys, causally masked.

    q [R, Q, heads, dim] at q_positions [R, Q]; keys and values [R, C, heads,
    dim] at positions 0..C-1. A query sees the keys at its own position and
    before. Keys past a request's context are padding: the mask hides them,
    since its queries sit before its context's end. The paged and the dense
    paths both call this, so they differ only in where the keys come from.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("rnhd,rchd->rhnc", q, keys) * scale
    key_positions = torch.arange(keys.shape[1], device=q.device)
    future = key_positions[None, None, :] > q_positions[:, :, None]
    scores = scores.masked_fill(future[:, None, :, :], float("-inf"))
    return torch.einsum("rhnc,rchd->rnhd", torch.softmax(scores, dim=-1), values)
