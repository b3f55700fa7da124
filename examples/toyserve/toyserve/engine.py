"""The scheduler: continuous batching over one token budget per step.

Each step serves the running batch first, in order (a decode, or the next chunk of a
prefill), then admits queued sequences first come, first served. A running sequence
that cannot get a block preempts the newest running one (maybe itself): its KV is
dropped and it waits at the head of the queue to recompute it. Nothing is admitted in a
step that preempted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from toyserve.blocks import BlockManager
from toyserve.sequence import Finish, SeqState, Sequence


@dataclass(frozen=True)
class EngineConfig:
    block_size: int
    num_blocks: int
    token_budget: int  # tokens per step, over all sequences
    max_seqs: int  # sequences in the running batch
    max_len: int  # prompt + generated tokens of one sequence
    chunked_prefill: bool = True
    prefix_caching: bool = False


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.blocks = BlockManager(config.num_blocks, config.block_size, config.prefix_caching)
        self.seqs: dict[str, Sequence] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def submit(self, seq: Sequence) -> None:
        if seq.seq_id in self.seqs:
            raise ValueError(f"sequence {seq.seq_id!r} is already here")
        if not 0 < len(seq.prompt) < self.config.max_len:
            raise ValueError(f"a prompt must have 1 to {self.config.max_len - 1} tokens")
        self.seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def cancel(self, seq_id: str) -> None:
        seq = self.seqs.get(seq_id)
        if seq is not None:
            self._finish(seq, Finish.CANCELLED)

    def step(self) -> dict[str, int]:
        """Decide one step: the tokens each sequence runs, in order."""
        budget = self.config.token_budget
        batch: dict[str, int] = {}
        preempted = False
        for seq in list(self.running):
            if seq.state is not SeqState.ACTIVE or budget == 0:
                continue
            n = min(len(seq.tokens) - seq.num_computed, budget)
            while not self.blocks.grow(seq.seq_id, seq.num_computed + n):
                preempted = True
                victim = self.running[-1]
                self._pause(victim)
                if victim is seq:
                    break
            if seq.state is SeqState.ACTIVE:
                batch[seq.seq_id] = n
                budget -= n
        while (
            self.waiting and not preempted and budget and len(self.running) < self.config.max_seqs
        ):
            seq = self.waiting[0]
            hits = self.blocks.cached_prefix(seq.seq_id, seq.tokens)
            computed = len(hits) * self.config.block_size
            n = len(seq.tokens) - computed
            if n > budget and not self.config.chunked_prefill:
                break  # the whole prompt, or nothing: it waits for a step with room
            n = min(n, budget)
            self.blocks.take_cached(seq.seq_id, hits)
            if not self.blocks.grow(seq.seq_id, computed + n):
                self.blocks.release(seq.seq_id)
                break
            self.waiting.popleft()
            seq.state = SeqState.ACTIVE
            seq.num_computed = computed
            self.running.append(seq)
            batch[seq.seq_id] = n
            budget -= n
        for seq_id, n in batch.items():
            seq = self.seqs[seq_id]
            seq.num_computed += n
            self.blocks.remember(seq_id, seq.tokens, seq.num_computed)
        return batch

    def commit(self, sampled: dict[str, int]) -> list[Sequence]:
        """Apply the model's sampled token per sequence of the last step (a sequence whose
        step was a prefill chunk samples nothing); return those that finished."""
        finished = []
        for seq_id, token in sampled.items():
            seq = self.seqs.get(seq_id)
            if seq is None:
                continue
            seq.generated.append(token)
            if token in seq.stop_tokens:
                self._finish(seq, Finish.STOP)
            elif len(seq.generated) >= seq.max_new_tokens or len(seq.tokens) >= self.config.max_len:
                self._finish(seq, Finish.LENGTH)
            if seq.finish is not None:
                finished.append(seq)
        return finished

    def _pause(self, seq: Sequence) -> None:
        self.blocks.release(seq.seq_id)
        self.running.remove(seq)
        seq.state = SeqState.PAUSED
        seq.num_computed = 0
        seq.times_paused += 1
        self.waiting.appendleft(seq)

    def _finish(self, seq: Sequence, reason: Finish) -> None:
        seq.finish = reason
        self.blocks.release(seq.seq_id)
        del self.seqs[seq.seq_id]
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
