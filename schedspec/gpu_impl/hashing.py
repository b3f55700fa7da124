"""Content ids of full KV blocks, computed on the device.

Prefix-cache decisions depend only on whether two blocks hold the same
token prefix, so any injective naming of prefixes makes the reference's
decisions. The reference names them by chained BLAKE2b; here the id of the
block ending at position p is a 64-bit mix of (sum of per-token mixes of
tokens 0..p-1, p), which extends by a sum as tokens arrive, in parallel
over every request. Distinct prefixes share an id with probability about
2**-62 per pair; the B = 1 adapter keeps the BLAKE2b hash beside each id
and raises if two differ under one id, so a collision cannot go unnoticed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.flat_index import pick, selected

_C1 = 0xBF58476D1CE4E5B9 - 2**64  # splitmix64's multipliers, as signed int64
_C2 = 0x94D049BB133111EB - 2**64
_POSITION_SALT = 0x2545F4914F6CDD1D
_LENGTH_SALT = 0x1B873593
_NON_NEGATIVE = 2**63 - 1


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift on int64 (torch's >> is arithmetic)."""
    shifted = x >> bits
    shifted &= (1 << (64 - bits)) - 1
    return shifted


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic). The first xor makes
    a fresh tensor; the rest work in place on it (fewer large temporaries per call)."""
    x = x ^ _shift_right(x, 30)
    x *= _C1
    x ^= _shift_right(x, 27)
    x *= _C2
    x ^= _shift_right(x, 31)
    return x


@functools.lru_cache(maxsize=16)
def _position_mixes(length: int, device: torch.device) -> torch.Tensor:
    """mix64 of each position (salted), computed once per length and device."""
    return mix64(torch.arange(length, dtype=torch.int64, device=device) + _POSITION_SALT)


@functools.lru_cache(maxsize=16)
def _block_ends(length: int, block_size: int, device: torch.device) -> torch.Tensor:
    """Whether position p is the last of a block, for p < length (a lookup beats an int64
    remainder per token)."""
    return (torch.arange(length, device=device) + 1) % block_size == 0


def prefix_id(acc: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """The content id (>= 0) of the prefix of `length` tokens whose mixes sum to acc."""
    return mix64(acc ^ mix64(length + _LENGTH_SALT)) & _NON_NEGATIVE


@dataclass
class CompletedBlocks:
    """The blocks that appended tokens completed, in (row, position) order: the row of
    the input each belongs to, its block index in the request and its content id."""

    row: torch.Tensor
    index: torch.Tensor
    ids: torch.Tensor


def extend_hashes(
    acc: torch.Tensor,
    start: torch.Tensor,
    tokens: torch.Tensor,
    count: torch.Tensor,
    block_size: int,
    max_positions: int,
) -> tuple[torch.Tensor, CompletedBlocks]:
    """Append tokens[r, :count[r]] at positions start[r].. to prefixes summed in acc
    (positions stay below max_positions); returns the new acc and the blocks completed.

    Only the counted tokens are mixed: they are packed (one nonzero) and summed by one
    running sum over all rows, each row's sums rebased by the total of the rows before
    it (wrapping int64 sums, so any order of additions gives the same value). Prompts
    fill about half of their padded [arrivals, max_model_len] batch.
    """
    width = tokens.shape[1]
    # Each counted token's row and offset, built from the counts (no mask over the
    # padded [rows, width] batch, no division): row r repeated count[r] times.
    count = count.clamp(min=0, max=width)
    row = torch.repeat_interleave(torch.arange(count.shape[0], device=count.device), count)
    first = torch.cumsum(count, dim=0) - count
    offset = torch.arange(row.shape[0], device=count.device) - first.index_select(0, row)
    packed = row * width + offset
    positions = (start.index_select(0, row) + offset).clamp(max=max_positions - 1)
    position_mixes = _position_mixes(max_positions, tokens.device)
    mixes = mix64(pick(tokens, packed) + position_mixes.index_select(0, positions))
    row_total = torch.zeros_like(acc).index_add_(0, row, mixes)
    rebase = acc - (torch.cumsum(row_total, dim=0) - row_total)
    sums = torch.cumsum(mixes, dim=0) + rebase.index_select(0, row)
    ends = selected(
        _block_ends(max_positions, block_size, tokens.device).index_select(0, positions)
    )
    done = positions.index_select(0, ends) + 1
    completed = CompletedBlocks(
        row.index_select(0, ends),
        torch.div(done, block_size, rounding_mode="floor") - 1,
        prefix_id(sums.index_select(0, ends), done),
    )
    return acc + row_total, completed
