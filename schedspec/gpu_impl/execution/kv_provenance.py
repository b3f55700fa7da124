"""A shadow of the paged cache that records whose KV each slot holds.

The KV of position p depends on exactly the tokens at positions 0..p, so a
slot's content is named by a hash of that prefix (its tag). The shadow tags
each slot when the runner writes it; a read is fresh when the slot's tag is
the reading request's own prefix tag at that position. This catches, with
integer compares and no float tolerance, a read of a slot never written,
written by another prefix, or left stale by a skipped recomputation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

_MODULUS = (1 << 61) - 1  # a Mersenne prime: 61-bit tags fit in int64
_BASE = 1_000_003
NEVER_WRITTEN = -1


def _roll(tag: int, token_ids: Sequence[int]) -> list[int]:
    """The tags that follow `tag` as each token is appended."""
    tags = []
    for token in token_ids:
        tag = (tag * _BASE + token + 1) % _MODULUS
        tags.append(tag)
    return tags


class PrefixTags:
    """Per request, the tag of each position: a rolling hash of tokens 0..p."""

    def __init__(self) -> None:
        self._tags: dict[str, list[int]] = {}

    def of(
        self, request_id: str, token_ids: Sequence[int], drafts: Sequence[int] = ()
    ) -> list[int]:
        """Tags of every position of token_ids followed by drafts.

        Known tokens only grow, so their tags are kept and extended; drafts
        change every step, so theirs are computed afresh and not kept.
        """
        tags = self._tags.setdefault(request_id, [])
        del tags[len(token_ids) :]
        tags.extend(_roll(tags[-1] if tags else 0, token_ids[len(tags) :]))
        return tags + _roll(tags[-1] if tags else 0, drafts)

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._tags.pop(rid, None)


class KvProvenance:
    def __init__(self, num_slots: int) -> None:
        self.slot_tags = torch.full((num_slots,), NEVER_WRITTEN, dtype=torch.long)

    def record_writes(self, slots: torch.Tensor, tags: torch.Tensor) -> None:
        keep = slots >= 0
        self.slot_tags[slots[keep]] = tags[keep]

    def tags_at(self, slots: torch.Tensor) -> torch.Tensor:
        return self.slot_tags[slots]
