"""vLLM V1's prefix-cache registration over hybrid KV cache groups (docs/SPEC.md, "Hybrid
KV cache groups", what a group caches): a sliding-window group registers only the blocks
some aligned hit can reach."""

from __future__ import annotations

from schedspec.spec.invariants.registry import Violation, invariant
from schedspec.spec.kv_groups import NULL_BLOCK_ID, SlidingWindowGroup, window_block_reachable
from schedspec.spec.state import State


@invariant(
    "WINDOW-CACHE-REACHABLE",
    "state",
    "vllm-v1",
    "A sliding-window group's block that no aligned prefix-cache hit can reach (outside "
    "the cdiv(sliding_window - 1, block_size) blocks before every scheduler-block boundary) "
    "is never registered in the prefix cache, so it is freed to the front of the queue.",
    groups="hybrid",
)
def check_window_cache_reachable(state: State) -> list[Violation]:
    config = state.config
    hashes = state.kv.block_hashes
    out: list[Violation] = []
    for gid, group in enumerate(config.kv_cache_groups):
        if not isinstance(group, SlidingWindowGroup):
            continue
        for rid, request in state.requests.items():
            if gid >= len(request.group_block_ids):
                continue  # HYBRID-TABLES reports a missing table
            for index, block in enumerate(request.group_block_ids[gid]):
                if (
                    block != NULL_BLOCK_ID
                    and 0 <= block < len(hashes)
                    and hashes[block] is not None
                    and not window_block_reachable(group, index, config.block_size)
                ):
                    out.append(
                        Violation(
                            "WINDOW-CACHE-REACHABLE",
                            f"group {gid}, index {index}: cached, but no aligned hit reads it",
                            rid,
                            block,
                            expected="uncached",
                            actual="cached",
                        )
                    )
    return out
