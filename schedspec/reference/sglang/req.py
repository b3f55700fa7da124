"""One request as SGLang's scheduler sees it: the spec Request plus SGLang's own fields.

The spec Request carries what the abstract state shows (tokens, status, the
computed count, the pipeline counters); these fields are the ones SGLang
0.5.23's Req keeps for its decisions, under its names: the cached prefix
(prefix_len, last_node), the chunk end (extend_end), the radix-tree lock and
how much of the request's row the tree owns (cache_protected_len), the KV
written and allocated (kv_committed_len, kv_allocated_len), its row of the
request-to-token pool, and the flags retraction, chunking and aborts set.
"""

from __future__ import annotations

from schedspec.reference.sglang.radix_tree import RadixNode
from schedspec.spec import Request


class SGLangReq:
    def __init__(self, request: Request, max_new_tokens: int) -> None:
        self.request = request
        # SGLang's clipped max_new_tokens (may be 0: one token is still sampled).
        self.max_new_tokens = max_new_tokens
        self.prefix_len = 0  # tokens with KV before the current extend
        self.extend_end = 0  # the current extend computes tokens [prefix_len, extend_end)
        self.last_node: RadixNode | None = None  # where the prefix match ended
        self.lock: RadixNode | None = None  # the radix path this request locks
        self.cache_protected_len = 0  # leading row tokens the tree owns
        self.cache_inserted_len = 0
        self.kv_committed_len = 0  # tokens whose KV is written or being written
        self.kv_allocated_len = 0  # tokens the row has slots for
        self.row: list[int] | None = None  # pages of its request-to-token row; None: no row
        self.is_retracted = False
        # Chunks scheduled whose result has not been processed, not counting the last.
        self.inflight_middle_chunks = 0
        self.to_finish = False  # an abort waiting for the request's next forward
        self.finished = False
        self.finished_len: int | None = None  # outputs up to the stop, once finished

    @property
    def rid(self) -> str:
        return self.request.request_id

    @property
    def fill_ids(self) -> list[int]:
        """Prompt then outputs: what the next extend computes from."""
        return self.request.all_token_ids

    @property
    def num_outputs(self) -> int:
        return self.request.num_output_tokens

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len

    @property
    def owned_kv_len(self) -> int:
        """Row tokens with KV the request owns up to its stop (SGLang's owned_kv_len)."""
        if self.finished_len is None:
            return self.kv_committed_len
        return min(self.kv_committed_len, self.request.num_prompt_tokens + self.finished_len)

    def reset_for_retract(self) -> None:
        """Retraction drops every trace of the KV; the tokens stay (SGLang's reset_for_retract)."""
        self.prefix_len = 0
        self.last_node = None
        self.lock = None
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.extend_end = 0
        self.is_retracted = True
        self.inflight_middle_chunks = 0
        self.kv_committed_len = 0
        self.kv_allocated_len = 0

    def __repr__(self) -> str:
        return (
            f"SGLangReq({self.rid!r}, prefix {self.prefix_len}, extend_end {self.extend_end}, "
            f"committed {self.kv_committed_len})"
        )
