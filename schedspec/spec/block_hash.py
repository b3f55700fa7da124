"""Chained block hashes: the identity of a full KV block's content.

The hash of block i covers the tokens of blocks 0..i (through the parent
hash), so equal hashes mean equal prefixes. 128-bit BLAKE2b makes a
collision, which would hand a request someone else's KV, negligible;
engines have shipped prefix-cache collisions with weaker hashes.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = int

_ROOT = b"schedspec-root"  # parent marker of block 0; not 16 bytes, so unambiguous


def hash_block_tokens(parent: BlockHash | None, tokens: Sequence[int]) -> BlockHash:
    """The hash of one full block given its parent's hash (None for block 0)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(_ROOT if parent is None else parent.to_bytes(16, "little"))
    digest.update(array("q", tokens).tobytes())
    return int.from_bytes(digest.digest(), "little")


def extend_block_hashes(
    hashes: list[BlockHash], token_ids: Sequence[int], block_size: int
) -> list[BlockHash]:
    """Append to `hashes` the hashes of full blocks of `token_ids` not yet hashed.

    `hashes` must hold the hashes of the first len(hashes) blocks of the same
    token sequence; the list is extended in place and returned.
    """
    num_full = len(token_ids) // block_size
    parent = hashes[-1] if hashes else None
    for i in range(len(hashes), num_full):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes
