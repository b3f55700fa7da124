"""The built-in mixed workload that `schedspec run` drives through a scheduler.

It is shaped to exercise every path of one scheduling step on the CLI's
defaults: long prompts that need chunking, short ones, decode-heavy requests
whose growth forces preemption, requests sharing a system prompt so the prefix
cache hits, and arrivals spread over later steps.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from schedspec.spec import Request

# The lengths below are written for this max_model_len; a smaller one scales
# the whole mix down so it keeps its character (long vs short) and stays valid.
NOMINAL_MODEL_LEN = 1024
SHARED_PREFIX_LEN = 192  # a "system prompt": 12 full blocks at block_size 16
VOCAB_SIZE = 32_000


@dataclass(frozen=True)
class _Shape:
    request_id: str
    arrival_step: int
    prompt_len: int  # own tokens, after the shared prefix when shares_prefix
    max_tokens: int
    shares_prefix: bool = False
    priority: int = 0  # lower is served first under --policy priority
    stop_after: int | None = None  # emit EOS as this output token, if reached


# Decode-heavy requests get a lower priority (a larger number), as a batch
# job would; short interactive ones the highest.
_MIX: tuple[_Shape, ...] = (
    _Shape("A", 1, 700, 16, priority=1),
    _Shape("B", 1, 24, 128, priority=2),
    _Shape("C", 1, 40, 48, shares_prefix=True),
    _Shape("D", 2, 40, 32),
    _Shape("E", 2, 32, 120, priority=2, stop_after=64),
    _Shape("F", 3, 560, 24, priority=1),
    _Shape("G", 4, 64, 40, shares_prefix=True),
    _Shape("H", 5, 16, 64),
    _Shape("I", 6, 48, 112, priority=2),
    _Shape("J", 8, 28, 16),
    _Shape("K", 10, 20, 40, shares_prefix=True),
    _Shape("L", 12, 820, 16, priority=1),
    _Shape("M", 14, 60, 48, stop_after=10),
    _Shape("N", 20, 100, 32, shares_prefix=True),
)


@dataclass(frozen=True)
class WorkloadRequest:
    """A request and the iteration (1-based) before which it arrives."""

    request_id: str
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    eos_token_id: int | None
    priority: int

    def to_request(self) -> Request:
        return Request(
            self.request_id,
            self.prompt_token_ids,
            max_tokens=self.max_tokens,
            eos_token_id=self.eos_token_id,
            priority=self.priority,
        )


def build_workload(
    max_model_len: int, seed: int, token_at: Callable[[str, int], int]
) -> list[WorkloadRequest]:
    """The mix, scaled to max_model_len and jittered by seed, in arrival order.

    token_at is the fake model's sampler: a request that should stop early
    takes as its EOS the token the model will emit at that position, so the
    run shows FINISHED_STOPPED as well as length-capped requests.
    """
    rng = random.Random(seed)
    scale = min(1.0, max_model_len / NOMINAL_MODEL_LEN)

    def scaled(n: int) -> int:
        return max(1, round(n * scale))

    prefix = [rng.randrange(VOCAB_SIZE) for _ in range(scaled(SHARED_PREFIX_LEN))]
    workload = []
    for shape in _MIX:
        # +-10% so that different seeds give different chunk and block boundaries.
        own = scaled(round(shape.prompt_len * rng.uniform(0.9, 1.1)))
        head = prefix if shape.shares_prefix else []
        # Every prompt must leave room for one output token (validate_new_request).
        prompt_len = min(len(head) + own, max_model_len - 1)
        head = head[:prompt_len]
        tail = [rng.randrange(VOCAB_SIZE) for _ in range(prompt_len - len(head))]
        eos = None
        if shape.stop_after is not None:
            eos = token_at(shape.request_id, prompt_len + scaled(shape.stop_after) - 1)
        workload.append(
            WorkloadRequest(
                request_id=shape.request_id,
                arrival_step=shape.arrival_step,
                prompt_token_ids=tuple(head + tail),
                max_tokens=scaled(shape.max_tokens),
                eos_token_id=eos,
                priority=shape.priority,
            )
        )
    return workload
