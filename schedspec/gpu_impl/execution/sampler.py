"""Greedy sampling with draft verification against the target model."""

from __future__ import annotations

from collections.abc import Sequence


def verify_greedy(drafts: Sequence[int], greedy: Sequence[int]) -> list[int]:
    """The tokens a request emits: drafts up to the first that differs from the
    target's greedy token at its position, then the target's own token there.

    greedy[i] is the target's pick after the last known token and i drafts,
    so len(greedy) == len(drafts) + 1. Greedy verification keeps the output
    identical to plain greedy decoding, whatever the drafter proposed.
    """
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == greedy[accepted]:
        accepted += 1
    return list(greedy[: accepted + 1])
