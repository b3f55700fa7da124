"""Reading and writing per-slot state at (instance, slot) pairs without advanced indexing.

On the CPU, torch's advanced indexing (`x[rows, cols]`, `x[mask]`) takes a
general path that costs three to five times what index_select and
scatter_add cost on the same elements, and a boolean mask adds a nonzero
pass first. A [B, C, ...] tensor viewed as [B * C, ...] turns a pair into
one row number; masked writes add `new - old` where the mask holds and 0
elsewhere, so padding entries (clamped to a real slot) may repeat or even
share a slot with a real entry without clobbering it. Callers guarantee
that the real pairs are distinct (a request is scheduled, freed or admitted
once per call). Where the mask is sparse (a few real entries among
[I, R, W] padded ones), `selected` compacts the positions once and the
writes go through `write_rows` on the compacted indices: a scatter_, which
on the CPU takes half to a third of index_copy_'s or index_fill_'s time at
the thousands of rows a step writes.
"""

from __future__ import annotations

import torch


def flat_rows(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The row numbers of (rows, cols) in x viewed as [B * C, ...] (broadcast shape):
    one fused multiply-add (an op's own cost is most of it on small index tensors)."""
    return torch.add(cols, rows, alpha=x.shape[1])


def take_at(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """x[rows, cols] for a contiguous x of shape [B, C, *rest]: shape [*rows.shape, *rest]."""
    rest = x.shape[2:]
    index = flat_rows(x, rows, cols).reshape(-1)
    return x.view(-1, *rest).index_select(0, index).view(*rows.shape, *rest)


def put_at(
    x: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    values: torch.Tensor | int,
    mask: torch.Tensor,
) -> None:
    """x[rows, cols] = values where mask holds, in place, for an integer x of shape [B, C]."""
    put_flat(x.view(-1), flat_rows(x, rows, cols), values, mask)


def selected(mask: torch.Tensor) -> torch.Tensor:
    """The flat positions where mask holds: one nonzero pass that every sparse write
    after it reuses (a dense masked write over [I, R, W] mostly moves padding)."""
    return torch.nonzero(mask.reshape(-1), as_tuple=True)[0]  # 1-D, no squeeze op


def pick(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x's entries at flat positions (from `selected` over a mask of x's shape, or
    `flat_rows` of a [B, C] x), shaped like positions. Most positions are 1-D: they
    skip the reshape and view, whose own cost (about 3 us) exceeds a small gather's."""
    if positions.ndim == 1:
        return x.reshape(-1).index_select(0, positions)
    return x.reshape(-1).index_select(0, positions.reshape(-1)).view_as(positions)


def spread(values: torch.Tensor, positions: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """pick's inverse: a tensor of `shape` holding values at the flat positions (distinct)
    and zeros elsewhere."""
    out = torch.zeros(shape, dtype=values.dtype, device=values.device)
    out.view(-1).scatter_add_(0, positions, values)
    return out


def put_flat(
    flat: torch.Tensor,
    index: torch.Tensor,
    values: torch.Tensor | int,
    mask: torch.Tensor,
    old: torch.Tensor | int | None = None,
) -> None:
    """flat[index] = values where mask holds, in place, for an integer 1-D view (index,
    and values where a tensor, broadcast to mask's shape). A caller that knows what the
    masked entries hold passes it as `old` (likewise), sparing the read. Few calls: on
    [I, R] of a few thousand entries each call's own cost is a good part of the time."""
    index = index.reshape(-1)
    if old is None:
        old = flat.index_select(0, index).view(mask.shape)
    delta = torch.where(mask, values - old, 0)
    flat.scatter_add_(0, index, delta.view(-1))


def write_rows(x: torch.Tensor, rows: torch.Tensor, values: torch.Tensor | int | bool) -> None:
    """x.view(-1)[rows] = values for distinct flat rows (1-D) of a contiguous x: a
    scatter_ (see the module docstring). A scalar is spread into a tensor first (a
    scatter_ of a scalar costs more than the two ops), a tensor of another dtype is
    converted."""
    if isinstance(values, torch.Tensor):
        if values.dtype != x.dtype:
            values = values.to(x.dtype)
    else:
        values = torch.full_like(rows, values, dtype=x.dtype)
    (x if x.ndim == 1 else x.view(-1)).scatter_(0, rows, values)
