"""Where a prefill chunk may end when a Mamba group keeps block-aligned states (vLLM 0.33.0
and 0.34.0 Scheduler._mamba_block_aligned_split: the block-aligned cut, the stop at the
last boundary a hit can reach and the stop at the shared-prefix junction; without the
backend's internal prefill checkpoints and partial-hash tails: docs/HYBRID.md, "Not
modelled")."""

from __future__ import annotations

from dataclasses import dataclass

from schedspec.spec import Request, SchedulerConfig
from schedspec.spec.kv_groups import MambaGroup


def mamba_block_aligned_split(
    num_computed_tokens: int,
    num_new_tokens: int,
    prefill_end: int,
    num_tokens: int,
    block_size: int,
    max_prefill_tokens: int,
    drop_eagle_block: bool = False,
    junction: int = 0,
) -> int:
    """The new tokens to schedule: a chunk that stops short of the prefill's end is cut
    down to a block boundary, since a state is written only where a chunk ends and a
    block must hold the state after a whole number of blocks.

    prefill_end: max(prompt tokens, tokens - 1), so a resumed request replaying its
    outputs is cut too. Past it (decode) nothing is cut. The chunk that reaches it is
    not cut to a boundary: decode carries its state on to the next boundary.

    A cut that leaves no progress is taken only when a whole block fits a step's
    budget (max_prefill_tokens: the token budget, or the long-prefill cap when set):
    the request then waits for a step with more budget. A block wider than any step
    advances by a part of a block instead, or it would never advance (vLLM #40707,
    #45414: the scheduler stalled).

    Three stops then end a chunk early wherever it would run past them: the next block
    boundary, for a chunk that starts mid-block (after a part-block advance: the
    long-prefill cap may have held a chunk to less than a block in a step with other
    prefills, and not in the next), so that the state is realigned; and the checkpoint
    (`checkpoint_position` of the request's num_tokens, backed off a block under EAGLE's
    block drop), the last boundary a prefix hit can reach, so that the state a later
    request with the same prompt hits is written (a state is written only at a chunk's
    end); and the request's shared-prefix junction (`junction`: Request.
    shared_prefix_boundary, the longest hit one group alone had at its admission where
    the reconciled hit was shorter), floored to a whole number of blocks from the
    chunk's start, so that the state at a prefix other requests share is written for the
    next one (vLLM's block-floored junction: without partial-hash hits, which the spec
    does not model, vLLM never stops at the junction itself). The first two bite where
    the boundary cut does not: on the chunk that reaches the prefill's end, or a
    part-block one; the junction also mid-prefill. The first two hold with or without
    prefix caching, as in vLLM; a junction needs a prefix hit.
    """
    if num_computed_tokens >= prefill_end:
        return num_new_tokens
    end = num_computed_tokens + num_new_tokens
    if end < prefill_end:
        aligned_end = end // block_size * block_size
        if aligned_end > num_computed_tokens or block_size <= max_prefill_tokens:
            end = aligned_end
    start = num_computed_tokens
    next_boundary = (start // block_size + 1) * block_size if start % block_size else end
    checkpoint = checkpoint_position(num_tokens, block_size, drop_eagle_block)
    junction_stop = start + (junction - start) // block_size * block_size
    if not start < junction < end:
        junction_stop = end
    stops = [s for s in (next_boundary, checkpoint, junction_stop) if start < s < end]
    return min(stops, default=end) - start


def checkpoint_position(num_tokens: int, block_size: int, drop_eagle_block: bool) -> int:
    """The last block boundary a prefix hit on a request of num_tokens can reach (vLLM
    get_mamba_prefill_checkpoint_position): a hit leaves the last token to compute, for
    its logits. With EAGLE's block drop (drop_eagle_block) a hit loses its last block
    instead, so the checkpoint is one block before the last boundary at or before
    num_tokens."""
    if drop_eagle_block:
        return max(0, num_tokens // block_size * block_size - block_size)
    return max(0, (num_tokens - 1) // block_size * block_size)


@dataclass(frozen=True)
class MambaSplit:
    """The scheduler's cut: at the Mamba group's own block size (vLLM #55600 and #54076 cut
    at another group's), with the step's largest prefill as the budget."""

    block_size: int
    max_prefill_tokens: int
    # vLLM's EAGLE block drop (Scheduler.use_eagle_block_drop): an EAGLE-style drafter
    # (lookahead slots) without prefix caching. With prefix caching vLLM hashes each block
    # with the token after it instead (num_hash_lookahead_tokens, 1: docs/FINDINGS.md G1),
    # which proves the boundary and leaves the plain checkpoint.
    drop_eagle_block: bool = False

    @staticmethod
    def of(config: SchedulerConfig) -> MambaSplit | None:
        """The cut a config needs: None without a Mamba group in align mode. With several,
        the first one's block size (vLLM 0.34.0 takes the first Mamba group's too)."""
        group = next(
            (
                g
                for g in config.kv_cache_groups
                if isinstance(g, MambaGroup) and g.mamba_cache_mode == "align"
            ),
            None,
        )
        if group is None:
            return None
        budget = config.max_num_batched_tokens
        threshold = config.long_prefill_token_threshold
        return MambaSplit(
            group.block_size,
            min(budget, threshold) if threshold > 0 else budget,
            config.lookahead_tokens > 0 and not config.enable_prefix_caching,
        )

    def cut(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        """The request's new tokens this step, starting from num_computed_tokens."""
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        return mamba_block_aligned_split(
            num_computed_tokens,
            num_new_tokens,
            prefill_end,
            request.num_tokens,
            self.block_size,
            self.max_prefill_tokens,
            self.drop_eagle_block,
            request.shared_prefix_boundary,
        )
