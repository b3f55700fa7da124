"""SGLang's admission arithmetic: the new-token ratio and the prefill adder.

SGLang 0.5.23 admits a waiting request only if its whole future fits: its
uncached prompt plus its max_new_tokens plus a page, inside the free and
evictable slots less what this pass already reserved and less each running
request's remaining max_new_tokens scaled by new_token_ratio (the fraction of
its budget a request is expected to really decode). The ratio starts at
0.7 * schedule_conservativeness, decays linearly to 0.14x that over 600 decode
steps, and jumps after a retraction to what the survivors would need for 20
more steps. (schedule_policy.PrefillAdder, mem_cache/prefill_budget.py,
scheduler_components/new_token_ratio_tracker.py.)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from schedspec.reference.sglang.kv import SGLangKV
from schedspec.reference.sglang.req import SGLangReq
from schedspec.spec.sglang_arithmetic import (
    CLIP_MAX_NEW_TOKENS,
    decayed,
    ratio_after_retract,
    ratio_schedule,
    running_reservation,
)


class NewTokenRatio:
    """SGLang's NewTokenRatioTracker (the arithmetic: spec.sglang_arithmetic)."""

    def __init__(self, schedule_conservativeness: float) -> None:
        self.schedule = ratio_schedule(schedule_conservativeness)
        self.current = self.schedule.init

    def decay_step(self) -> None:
        self.current = decayed(self.current, self.schedule)

    def reset(self) -> None:
        self.current = self.schedule.init

    @staticmethod
    def after_retract(survivors: Sequence[SGLangReq]) -> float:
        return ratio_after_retract(
            sum(r.num_outputs for r in survivors),
            sum(r.max_new_tokens for r in survivors),
            len(survivors),
        )


class AddResult(enum.Enum):
    CONTINUE = "continue"  # try the next waiting request
    NO_TOKEN = "no_token"  # out of KV: the admission latch closes
    OTHER = "other"  # out of budget (tokens or chunk)


class PrefillAdder:
    """One prefill pass's admissions and what they reserved (SGLang's PrefillAdder
    with its PrefillBudget, for a single full-attention pool)."""

    def __init__(
        self,
        kv: SGLangKV,
        running: Sequence[SGLangReq],
        new_token_ratio: float,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
        num_mixed_decode_tokens: int,
    ) -> None:
        self.kv = kv
        self.page_size = kv.page_size
        self.rem_input_tokens = rem_input_tokens - num_mixed_decode_tokens
        self.rem_chunk_tokens = (
            None if rem_chunk_tokens is None else rem_chunk_tokens - num_mixed_decode_tokens
        )
        # Reserved by this pass: every admission's whole future (total) and its
        # immediate slots (current). Running requests' futures count at the ratio.
        self.total_offset: float = num_mixed_decode_tokens
        self.current_offset: float = num_mixed_decode_tokens
        self.total_offset += sum(
            [
                running_reservation(r.max_new_tokens - r.num_outputs, new_token_ratio)
                for r in running
            ]
        )
        self.can_run_list: list[SGLangReq] = []
        self.new_chunked_req: SGLangReq | None = None

    # ------------------------------------------------------------------ the budget

    def ceil_paged(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    @property
    def remaining_total(self) -> float:
        return self.kv.available_and_evictable() - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self.kv.available_and_evictable() - self.current_offset

    def budget_state(self) -> AddResult:
        if not (self.remaining_total > 0 and self.remaining_current > 0):
            return AddResult.NO_TOKEN
        if self.rem_input_tokens <= 0:
            return AddResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddResult.OTHER
        return AddResult.CONTINUE

    def _reserve(self, extend_len: int, max_new_tokens: int) -> None:
        """_update_prefill_budget: an admission's page-ceiled extend (and a page) now,
        its max_new_tokens later; the compute budgets pay the page-ceiled extend."""
        paged = self.ceil_paged(extend_len)
        immediate = paged + self.page_size
        self.total_offset += immediate + max_new_tokens
        self.current_offset += immediate
        self.rem_input_tokens -= paged
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= paged

    # ------------------------------------------------------------------ the chunked request

    def add_chunked_req(self, req: SGLangReq) -> SGLangReq | None:
        """The chunked request's next chunk comes first: as much of the chunk budget as
        the reservations leave, or a whole chunk when they leave nothing (SGLang's
        single pool insists on progress), but never more than the pool can give now
        (docs/SPEC.md, "A chunk the pool cannot hold"): where SGLang's allocation would
        raise, the chunk is cut to what fits, and held back when nothing does.
        Returns the request if it stays chunked after this pass, else None."""
        assert self.rem_chunk_tokens is not None
        chunk = self.rem_chunk_tokens
        room = min(chunk, int(self.remaining_total))
        limit = min(room if room > 0 else chunk, self.kv.extend_room(req))
        if limit <= 0:
            return req  # held back: not in this pass; the running requests decode
        remaining = len(req.fill_ids) - req.prefix_len
        truncated = remaining > limit
        req.extend_end = req.prefix_len + min(remaining, limit)
        self.can_run_list.append(req)
        self._reserve(
            req.extend_len, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        )
        return req if truncated else None

    # ------------------------------------------------------------------ a waiting request

    def add_one_req(self, req: SGLangReq) -> AddResult:
        """Admit req if its whole future fits (its matched prefix locked meanwhile, so
        it is not counted as evictable); chunk it if its prompt is over the chunk
        budget. Returns what the next waiting request should do."""
        tree = self.kv.tree
        max_new = min(max(req.max_new_tokens - req.num_outputs, 0), CLIP_MAX_NEW_TOKENS)
        extend_len = len(req.fill_ids) - req.prefix_len
        total_tokens = extend_len + max_new + self.page_size
        assert req.last_node is not None
        tree.lock(req.last_node)
        try:
            verdict = self._select(req, extend_len, total_tokens)
            if isinstance(verdict, AddResult):
                return verdict
            extend_len, max_new_tokens, is_chunked = verdict
            req.extend_end = req.prefix_len + extend_len
            self.kv.lock(req)
            self.can_run_list.append(req)
            if is_chunked:
                self.new_chunked_req = req
            self._reserve(extend_len, max_new_tokens)
        finally:
            tree.unlock(req.last_node)
        return self.budget_state()

    def _select(
        self, req: SGLangReq, extend_len: int, total_tokens: int
    ) -> AddResult | tuple[int, int, bool]:
        """_select_prefill_admission: (extend, max_new_tokens reserved, chunked?) or why not."""
        if not total_tokens < self.remaining_total:
            return AddResult.NO_TOKEN
        paged = self.ceil_paged(extend_len)
        if self.rem_chunk_tokens is None:
            # Without chunking, the first request may exceed the input budget.
            if self.can_run_list and paged >= self.rem_input_tokens:
                return AddResult.OTHER
            return extend_len, min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS), False
        if paged <= self.rem_chunk_tokens:
            return extend_len, min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS), False
        p = self.page_size
        chunk = self.rem_chunk_tokens // p * p
        end = (req.prefix_len + chunk) // p * p
        if end - req.prefix_len <= 0:
            return AddResult.OTHER
        return end - req.prefix_len, 0, True
