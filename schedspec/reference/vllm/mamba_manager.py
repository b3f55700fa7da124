"""A Mamba (recurrent-state) group's block tables: vLLM 0.34.0's MambaManager, without the
fine-grained partial hits, prefill checkpoints and copy-on-write tails it also has
(docs/HYBRID.md, "Not modelled", lists them).

A Mamba layer keeps one state per request, not one slot per token: block i of the table
stands for the state after (i + 1) * block_size tokens. Mode "none" keeps one running
state, overwritten in place, and caches nothing. Mode "align" (the only one with prefix
caching) cuts chunk ends to block boundaries (mamba_split.py), so each boundary's state
lands in a block of its own; the state of the previous step's block is copied forward
into each new one, and the older block is freed once the tokens past it are processed.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedspec.reference.sizing import cdiv
from schedspec.reference.vllm.block_pool import BlockPool
from schedspec.reference.vllm.free_block_queue import KVCacheBlock
from schedspec.reference.vllm.single_type_kv_cache_manager import SingleTypeKVCacheManager
from schedspec.spec import BlockHash
from schedspec.spec.kv_groups import MambaGroup


class MambaManager(SingleTypeKVCacheManager):
    def __init__(
        self,
        spec: MambaGroup,
        block_pool: BlockPool,
        null_block: KVCacheBlock,
        enable_caching: bool,
        alignment_tokens: int,
    ) -> None:
        super().__init__(spec, block_pool, null_block, enable_caching, alignment_tokens)
        # Per request: the table index of the copy source (the state block before the
        # newest), how many leading entries are retired, and whether the request has had
        # new blocks (its scratch states exist).
        self.last_state_block_idx: dict[str, int] = {}
        self._num_retired_blocks: dict[str, int] = {}
        self._allocated_block_reqs: set[str] = set()
        # (source, destination) state copies the worker owes, oldest first.
        self.state_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        # The hashes of the states this group cached since the current step began: their
        # step has not run, so no state is in them yet (vLLM's cached_blocks_this_step).
        self.cached_this_step: set[BlockHash] = set()

    @property
    def group(self) -> MambaGroup:
        assert isinstance(self.spec, MambaGroup)
        return self.spec

    @property
    def aligned(self) -> bool:
        return self.group.mamba_cache_mode == "align"

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Only the state after the last computed token is read again.
        return num_computed_tokens - 1

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """The rightmost cached state ending on an alignment boundary: one state stands
        for its whole prefix, so the blocks before it are nulls."""
        for i in range(max_length // self.block_size - 1, -1, -1):
            if (i + 1) * self.block_size % self.alignment_tokens:
                continue
            block = self.block_pool.get_cached_block(block_hashes[i])
            if block is not None:
                return [self.null_block] * i + [block]
        return []

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_tokens_main_model: int,
    ) -> int:
        """Mode "none": the attention rule over the tokens and the draft scratch states.
        Mode "align": the table reaches the state block of the last scheduled token
        (lookahead slots are drafts' and no drafter has Mamba layers), but at most one
        new block a step, plus the scratch states on the first allocation: the
        blocks in between are nulls.

        A hit whose state another request cached in this same step cannot be used yet
        (that step writes the state): the count is more than the pool, so the
        allocation fails and the admission waits for a later step, as vLLM 0.33.0 and
        0.34.0 refuse it (MambaManager.get_num_blocks_to_allocate)."""
        if new_computed_blocks and new_computed_blocks[-1].block_hash in self.cached_this_step:
            return self.block_pool.num_blocks + 1
        spec_blocks = self.group.num_speculative_blocks
        if not self.aligned:
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens + self.block_size * spec_blocks,
                new_computed_blocks,
                total_computed_tokens,
                num_tokens_main_model,
            )
        num_required = cdiv(num_tokens_main_model, self.block_size) + spec_blocks
        num_held = len(self.req_to_blocks.get(request_id, ()))
        num_new = num_required - len(new_computed_blocks) - num_held
        cap = 1 + (0 if request_id in self._allocated_block_reqs else spec_blocks)
        # Clamped at 0: vLLM 0.34.0 returns the negative count of an over-allocated table,
        # which never sits beside another group's need (docs/HYBRID.md, "Checked against
        # vLLM").
        num_new = min(max(num_new, 0), cap)
        return num_new + self._get_num_evictable_blocks(new_computed_blocks)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[KVCacheBlock]:
        """Mode "align": nulls up to the new running-state block, the draft scratch
        states moved behind it, and a state copy from the previous state block."""
        spec_blocks = self.group.num_speculative_blocks
        if not self.aligned:
            return super().allocate_new_blocks(
                request_id, num_tokens + self.block_size * spec_blocks, num_tokens_main_model
            )
        table = self.req_to_blocks[request_id]
        num_required = cdiv(num_tokens_main_model, self.block_size) + spec_blocks
        allocated_before = request_id in self._allocated_block_reqs
        self._allocated_block_reqs.add(request_id)
        if num_required <= len(table):
            return []
        num_prev = len(table)
        if allocated_before:
            self.last_state_block_idx[request_id] = num_prev - 1 - spec_blocks
        elif num_prev > 0:
            self.last_state_block_idx[request_id] = num_prev - 1  # a hit's state
        state_idx = num_required - spec_blocks - 1  # where the running state goes
        table.extend([self.null_block] * (state_idx - num_prev))
        if allocated_before:
            # Scratch states are the request's own and unhashed: moved, not copied.
            for i in range(num_prev - spec_blocks, min(num_prev, state_idx)):
                table.append(table[i])
                table[i] = self.null_block
        new_blocks = self.block_pool.get_new_blocks(num_required - len(table))
        table.extend(new_blocks)
        source = self.last_state_block_idx.get(request_id)
        if source is not None and table[source] is not self.null_block:
            self.state_copies.append((table[source], table[state_idx]))
        return new_blocks

    def cache_blocks(
        self, request_id: str, block_hashes: Sequence[BlockHash], num_tokens: int
    ) -> None:
        """Register the full state blocks, and note the ones this call cached."""
        num_cached = self.num_cached_block.get(request_id, 0)
        super().cache_blocks(request_id, block_hashes, num_tokens)
        table = self.req_to_blocks.get(request_id, [])
        for block in table[num_cached : self.num_cached_block.get(request_id, 0)]:
            if block.block_hash is not None and block is not self.null_block:
                self.cached_this_step.add(block.block_hash)

    def new_step_starts(self) -> None:
        """A schedule() begins: the states cached before it are written by now."""
        self.cached_this_step.clear()

    def take_state_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """The (source, destination) state copies owed since the last call, for the
        worker to run before the step's forward pass."""
        copies, self.state_copies = self.state_copies, []
        return copies

    # vLLM's MambaManager.remove_skipped_blocks also frees the copy source
    # (last_state_block_idx) once the tokens past it are processed. Here that block always
    # lies in the retired prefix by then, so the retirement below frees it; vLLM's
    # separate rule matters for its prefill checkpoints, not modelled (docs/HYBRID.md,
    # "Design decisions").
    def _remove_blocks_in_range(self, request_id: str, first: int, last: int) -> None:
        if not self.aligned:
            super()._remove_blocks_in_range(request_id, first, last)
            return
        # An aligned prefill leaves nulls between states: skip them, not stop at them,
        # and start past what an earlier call retired.
        table = self.req_to_blocks[request_id]
        first = max(first, self._num_retired_blocks.get(request_id, 0))
        freed = [
            table[i] for i in range(last - 1, first - 1, -1) if table[i] is not self.null_block
        ]
        for i in range(first, last):
            table[i] = self.null_block
        self.block_pool.free_blocks(freed)
        self._num_retired_blocks[request_id] = max(last, first)

    def free(self, request_id: str) -> None:
        self._allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self._num_retired_blocks.pop(request_id, None)
        super().free(request_id)
