"""A draft model: the target perturbed, run densely, so that some drafts are rejected.

After each step the drafter proposes num_speculative_tokens greedy guesses
for every request that emitted tokens, from that request's known tokens.
Its own KV sits in one DenseSequence per request; guessed positions are
forgotten after proposing, since the target may reject them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from schedspec.gpu_impl.execution.dense_runner import DenseSequence
from schedspec.gpu_impl.execution.tiny_model import TinyModel


class PerturbedDrafter:
    def __init__(self, draft_model: TinyModel, num_speculative_tokens: int, max_len: int) -> None:
        self.model = draft_model
        self.num_speculative_tokens = num_speculative_tokens
        self.capacity = max_len + num_speculative_tokens
        self.sequences: dict[str, DenseSequence] = {}

    def propose(self, token_ids: Sequence[int], request_id: str) -> list[int]:
        """Greedy guesses for the positions after token_ids (the request's known tokens)."""
        sequence = self.sequences.get(request_id)
        if sequence is None:
            sequence = self.sequences[request_id] = DenseSequence(self.model, self.capacity)
        # Re-feed at least the last known token: its logits give the first guess.
        sequence.truncate(len(token_ids) - 1)
        logits = sequence.feed(token_ids[sequence.length :])[-1]
        drafts = [int(torch.argmax(logits))]
        while len(drafts) < self.num_speculative_tokens:
            drafts.append(int(torch.argmax(sequence.feed(drafts[-1:])[-1])))
        sequence.truncate(len(token_ids))
        return drafts

    def propose_all(self, known: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        if self.num_speculative_tokens == 0:
            return {}
        return {rid: self.propose(tokens, rid) for rid, tokens in known.items()}

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self.sequences.pop(rid, None)
