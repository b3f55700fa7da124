"""SGLang's waiting-prefix refresh: when a prefill pass refreshes the recency of the
waiting requests' cached prefixes, shared by the reference's SGLang family and the
`sglang` profile's SG-EVICT-ORDER.

SGLang 0.5.23 (SGLANG_ENABLE_WAITING_PREFIX_REFRESH, on by default) counts the prefill
passes that find requests waiting with the radix cache on; the pass that finds the
count at a multiple of 32 matches the first 128 waiting requests' prefixes again,
the last of them first and the head last, so that the LRU evicts the prefixes of the
requests that will run last first.
"""

from __future__ import annotations

WAITING_PREFIX_REFRESH_INTERVAL = 32
WAITING_QUEUE_PREFIX_MATCH_MAX = 128


def pass_refreshes(passes_before: int) -> bool:
    """Does the prefill pass that finds this many passes counted before it refresh?"""
    return passes_before % WAITING_PREFIX_REFRESH_INTERVAL == 0
