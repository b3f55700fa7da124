"""A generation request as toyserve sees it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SeqState(enum.Enum):
    QUEUED = "queued"  # never run yet
    ACTIVE = "active"  # in the running batch
    PAUSED = "paused"  # preempted: its KV dropped, queued again to recompute it


class Finish(enum.Enum):
    STOP = "stop"  # EOS or a stop token
    LENGTH = "length"  # max_new_tokens or the context length
    CANCELLED = "cancelled"


@dataclass
class Sequence:
    seq_id: str
    prompt: list[int]
    max_new_tokens: int
    stop_tokens: frozenset[int] = frozenset()
    generated: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is computed or scheduled
    state: SeqState = SeqState.QUEUED
    times_paused: int = 0
    finish: Finish | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated
