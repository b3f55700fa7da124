"""SGLang's batches: the running batch and the batch each step runs.

One ScheduleBatch class serves both in SGLang 0.5.23. The running batch holds
the requests that decode, in order, and the admission latch (batch_is_full);
a prefill step forms a new batch (extend, or mixed when running requests
decode inside it) that joins the running batch at the start of the next step.
When the running batch is empty, the joining batch becomes the running batch,
latch and all (a fresh batch's latch is open).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from schedspec.reference.sglang.req import SGLangReq

Mode = Literal["extend", "decode", "mixed"]


class Batch:
    def __init__(self, reqs: Iterable[SGLangReq], mode: Mode, batch_is_full: bool = False) -> None:
        self.reqs = list(reqs)
        self.mode: Mode = mode
        self.batch_is_full = batch_is_full
        # An extend batch: the request it leaves chunked (still mid-prefill), if any.
        self.chunked_req: SGLangReq | None = None
        # A mixed batch: the running requests that decode one token in it.
        self.decoding_reqs: list[SGLangReq] = []
        # An extend batch of requests that sample nothing more (max_new_tokens 0): as a
        # running batch it does not decode. A merge keeps it only if both batches are.
        self.is_prefill_only = mode == "extend" and all(r.max_new_tokens == 0 for r in self.reqs)

    @property
    def is_extend(self) -> bool:
        """Extend and mixed batches both carry prefills (ForwardMode.is_extend)."""
        return self.mode != "decode"

    def is_empty(self) -> bool:
        return not self.reqs

    def filter(self, exclude: Iterable[SGLangReq] = ()) -> bool:
        """filter_batch: drop finished requests and those excluded, keeping the order.
        Returns whether the batch shrank (which opens the admission latch)."""
        dropped = set(map(id, exclude))
        before = len(self.reqs)
        self.reqs = [r for r in self.reqs if not r.finished and id(r) not in dropped]
        return len(self.reqs) < before

    def merge(self, other: Batch) -> None:
        """merge_batch: the other batch's requests join at the end."""
        self.reqs = self.reqs + other.reqs
        self.is_prefill_only = self.is_prefill_only and other.is_prefill_only
