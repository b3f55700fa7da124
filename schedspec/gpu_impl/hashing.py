"""Content ids of full KV blocks, computed on the device.

Prefix-cache decisions depend only on whether two blocks hold the same
token prefix, so any injective naming of prefixes makes the reference's
decisions. The reference names them by chained BLAKE2b; here the id of the
block ending at position p is a 64-bit mix of (sum of per-token mixes of
tokens 0..p-1, p), which extends by a sum as tokens arrive, in parallel
over every request. Distinct prefixes share an id with probability about
2**-62 per pair; the B = 1 adapter keeps the BLAKE2b hash beside each id
and raises if two differ under one id, so a collision cannot go unnoticed.

A token's mix (`_token_mixes`) only has to behave like an independent
64-bit random value per (token, position) for the sums to stay apart, so
it is shorter than mix64: the token plus a random key per position, then
multiply, fold the high half down, multiply, fold again (a final multiply
without a fold after it would be linear, so useless under a sum). The
first add and multiply are one op (the keys are stored multiplied) and the
first fold, by 32 bits, xors the high int32 half into the low one: 6 ops
over the padded batch instead of 9. Its 32-bit windows collide as often
as mix64's, at the rate chance predicts, on a million sequences each of
random prompts, sparse substitutions, tokens differing by powers of two
and permutations.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.batch_state import floor_div
from schedspec.gpu_impl.flat_index import selected

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


def _token_mixes(tokens: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Each token's mix, a fresh tensor, from its position's key times _C1 (`keys`,
    broadcast against tokens): (token + key) * _C1, fold 32, * _C2, fold 29 (see the
    module docstring: a shorter finaliser than mix64's, enough under a sum)."""
    x = torch.add(keys, tokens, alpha=_C1)
    _fold_high_half(x)
    x *= _C2
    x ^= _shift_right(x, 29)
    return x


def _fold_high_half(x: torch.Tensor) -> None:
    """x ^= x >>> 32 in place on a contiguous int64 x: the low int32 half of each value
    xors its high half (little-endian, as CPUs and CUDA devices are), one op on half
    the words instead of a shift, a mask and a xor over all of them."""
    halves = x.view(torch.int32)
    halves[..., 0::2] ^= halves[..., 1::2]


@functools.lru_cache(maxsize=16)
def _position_keys_table(length: int, device: torch.device) -> torch.Tensor:
    """Each position's key (mix64 of the salted position) times _C1, computed once per
    length and device."""
    keys = mix64(torch.arange(length, dtype=torch.int64, device=device) + _POSITION_SALT)
    keys *= _C1
    return keys


def prefix_id(acc: torch.Tensor, length_mix: torch.Tensor) -> torch.Tensor:
    """The content id (>= 0) of the prefix whose token mixes sum to acc, of the length
    whose mix (_length_mixes) is length_mix."""
    return mix64(acc ^ length_mix) & _NON_NEGATIVE


@functools.lru_cache(maxsize=16)
def _length_mixes(block_size: int, blocks: int, device: torch.device) -> torch.Tensor:
    """[blocks]: the mix of the length of a prefix that ends block i, (i + 1) *
    block_size tokens, computed once: a prefix id looks its length's mix up instead of
    mixing it again per block."""
    lengths = torch.arange(1, blocks + 1, dtype=torch.int64, device=device) * block_size
    return mix64(lengths + _LENGTH_SALT)


@dataclass
class CompletedBlocks:
    """The blocks that appended tokens completed, in (row, position) order: the row of
    the input each belongs to, its block index in the request and its content id."""

    row: torch.Tensor
    index: torch.Tensor
    ids: torch.Tensor


def extend_hashes(
    acc: torch.Tensor,
    start: torch.Tensor | int,
    tokens: torch.Tensor,
    count: torch.Tensor,
    block_size: int,
    max_positions: int,
) -> tuple[torch.Tensor, CompletedBlocks]:
    """Append tokens[r, :count[r]] at positions start[r].. to prefixes summed in acc
    (positions stay below max_positions; an int start is every row's, as for fresh
    prompts at 0); returns the new acc and the blocks completed.

    The padded [rows, width] batch is mixed whole and summed by one cumsum along the
    rows (wrapping int64 sums); the prefix sums are read where they are needed, at
    each row's last counted token and at its block ends, so padding is mixed but
    never read. That costs less than packing the counted tokens first (a nonzero,
    each token's row and offset, a running sum rebased per row: more passes, even
    though prompts fill only about half of their padded batch). A batch that is one
    row repeated (an expand: stride 0 along the rows) from an int start has the same
    mixes and sums in every row: that row is mixed once and every row reads it. A start
    of 0 (fresh prompts) ignores acc, since a prefix of no tokens sums to 0: the prefix
    sums are the batch's own, and a repeated row's block i has one id in every row.
    """
    if isinstance(start, int):
        # Columns at or past max_positions can only hold padding.
        tokens = tokens[:, : max(max_positions - start, 0)]
    rows, width = tokens.shape
    if width == 0:
        return acc, _no_blocks(acc)
    count = count.clamp(min=0, max=width)
    keys = _position_keys(start, width, max_positions, tokens.device)
    repeated = isinstance(start, int) and rows > 1 and tokens.stride(0) == 0
    sums = torch.cumsum(_token_mixes(tokens[:1] if repeated else tokens, keys), dim=1)
    flat = sums.view(-1)
    row_base = torch.arange(rows, device=tokens.device) * (0 if repeated else width)
    last = torch.where(count > 0, flat.index_select(0, row_base + (count - 1).clamp(min=0)), 0)
    ends = _block_ends(start, count, row_base, width, block_size)
    length_mixes = _length_mixes(block_size, -(-max_positions // block_size), tokens.device)
    if isinstance(start, int) and start == 0 and repeated:
        # The row's ids, one per block that ends within the width (8K ids a tick mixed
        # as 16 at B = 4096), read by block index.
        full = width // block_size
        row_ids = prefix_id(sums[0, block_size - 1 :: block_size], length_mixes[:full])
        return last, CompletedBlocks(ends.row, ends.index, row_ids.index_select(0, ends.index))
    prefix_sums = flat.index_select(0, ends.flat)
    if not isinstance(start, int) or start != 0:
        prefix_sums += acc.index_select(0, ends.row)
        last += acc
    ids = prefix_id(prefix_sums, length_mixes.index_select(0, ends.index))
    return last, CompletedBlocks(ends.row, ends.index, ids)


def _position_keys(
    start: torch.Tensor | int, width: int, max_positions: int, device: torch.device
) -> torch.Tensor:
    """The position keys (times _C1) of each row's columns: [rows, width], or [width]
    when every row starts at the same position (a slice of the table: no gather)."""
    if isinstance(start, int):
        return _position_keys_table(max_positions, device)[start : start + width]
    # Row p of this overlapping view holds the keys of positions p..p+width-1: a row
    # gather instead of building every position and gathering them one by one (28
    # against 63 us for 15K rows of 3). Starts at max_positions and past only precede
    # padding: they read the last row.
    table = _position_keys_table(max_positions + width, device)
    windows = table.unfold(0, width, 1)
    return windows.index_select(0, start.clamp(max=max_positions))


@dataclass
class _BlockEnds:
    """The counted columns that end a block, in (row, column) order: the row, the block
    index in the request and the column's flat position in the [rows, width] batch."""

    row: torch.Tensor
    index: torch.Tensor
    flat: torch.Tensor


def _block_ends(
    start: torch.Tensor | int,
    count: torch.Tensor,
    row_base: torch.Tensor,
    width: int,
    block_size: int,
) -> _BlockEnds:
    """Row r's counted tokens complete ends[r] blocks: the first ends at the column where
    its position reaches a multiple of block_size, the others every block_size columns
    after it. repeat_interleave lists the (row, block) pairs from those counts, no pass
    over the batch (a third of the time of a nonzero over [rows, ceil(width /
    block_size)] candidate columns)."""
    first_block: torch.Tensor | int
    if isinstance(start, int):
        first_block, offset = divmod(start, block_size)
        ends = floor_div(count + offset, block_size)
    else:
        first_block = floor_div(start, block_size)
        ends = floor_div(start + count, block_size) - first_block
    if width <= block_size:
        # At most one end per row: a nonzero over the rows finds them (12 against 52 us
        # for repeat_interleave over the 15K rows of update_from_output's tokens).
        row = selected(ends)
        index = _at_rows(first_block, row)
    else:
        row = torch.repeat_interleave(ends)
        # Pair e is block first_block + e - before of its row, before counting the pairs
        # of the rows before it.
        before = torch.cumsum(ends, 0) - ends
        pair = torch.arange(row.numel(), device=count.device)
        index = pair + _at_rows(first_block - before, row)
    # Block i of row r ends at column i * block_size + block_size - 1 - start.
    column_base = row_base + (block_size - 1) - start
    flat = torch.add(column_base.index_select(0, row), index, alpha=block_size)
    return _BlockEnds(row, index, flat)


def _at_rows(x: torch.Tensor | int, row: torch.Tensor) -> torch.Tensor:
    """x[row] for a per-row x, or x at every row for an int."""
    if isinstance(x, int):
        return torch.full_like(row, x)
    return x.index_select(0, row)


def _no_blocks(acc: torch.Tensor) -> CompletedBlocks:
    empty = acc.new_zeros(0)
    return CompletedBlocks(empty, empty, empty)
