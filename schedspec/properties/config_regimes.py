"""Config regimes: the default configs narrowed, now and then, to where vLLM's bugs live.

The default config strategy draws every knob on its own, so a config that is in a
bug's corner on several knobs at once (the priority policy AND several seats AND a
tight cache AND small chunks) comes up in a few examples of a run, some runs none:
benchmarks/bench_mutants.py measured seeded bugs there surviving `schedspec check`
on most seeds. Each regime below takes a drawn config and moves the few knobs its
corner needs (the rest of the draw is kept), so that every CI-profile run spends
some of its examples in each corner. A regime names the corner it is for
(corners.py) and the vLLM bug behind it; REGIME_WEIGHTS says how often.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from schedspec.spec import SchedulerConfig

MOST_SEATS = 8  # the most max_num_seqs the default configs draw


def _tight_cache(config: SchedulerConfig) -> int:
    """Exactly one max_model_len request of blocks: any two requests that grow contend."""
    return -(-config.max_model_len // config.block_size)


def _padded_budget(config: SchedulerConfig, budget: int) -> int:
    """A padded admission (1 + K tokens) must fit the budget."""
    if config.pad_spec_decode:
        return max(budget, 1 + config.num_speculative_tokens)
    return budget


def priority_contention(config: SchedulerConfig) -> SchedulerConfig:
    """Priority policy, eight seats, blocks of two to four tokens, a cache of two
    max_model_len requests, and a long-prefill cap of a sixteenth of max_model_len under
    a budget of half.

    The cap keeps requests in their prefill (needing blocks) for many steps, so a more
    urgent one that arrived later runs behind less urgent ones in the running list, with
    others after it; when the blocks run out, the victim sits before the request being
    served (the loop index #49097 got wrong; a victim already scheduled in the step,
    #23347), and the budget, eight caps wide, still serves the requests after it. Blocks
    of one token would make the first request in the list the first to run out, and
    preempt itself; of two to four, what a victim was scheduled in the step still
    completes blocks, registered in the prefix cache (on) for KV it will never compute
    (priority-victim-stays-cached, every config narrowed so: caught on 7 of seeds
    1-10). Measured on victim-index-not-adjusted, every config narrowed
    so, seeds 1-10: caught on 9 (one cache of max_model_len and three seats: 4; two
    caches and five seats: 7; no cap: 3).
    """
    block_size = min(max(config.block_size, 2), 4)
    seats = max(config.max_num_seqs, MOST_SEATS)
    budget = max(seats, config.max_model_len // 2)
    return dataclasses.replace(
        config,
        policy="priority",
        enable_prefix_caching=True,
        block_size=block_size,
        max_num_seqs=seats,
        num_blocks=2 * -(-config.max_model_len // block_size),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=max(1, config.max_model_len // 16),
        max_num_batched_tokens=_padded_budget(config, budget),
    )


def tight_cache(config: SchedulerConfig) -> SchedulerConfig:
    """The tight cache with at least two seats: decodes preempt each other constantly,
    so victims are picked among several (fcfs: the newest), go back to the front of
    the queue, resume with their outputs (#18115), and under async scheduling are
    preempted with a step still in flight whose output then lands stale (#41190)."""
    seats = max(config.max_num_seqs, 2)
    return dataclasses.replace(
        config,
        max_num_seqs=seats,
        num_blocks=_tight_cache(config),
        max_num_batched_tokens=max(config.max_num_batched_tokens, seats),
    )


def head_of_line(config: SchedulerConfig) -> SchedulerConfig:
    """Chunked prefill off, at least two seats, the smallest budget allowed
    (max_model_len) and no long-prefill cap: a long prompt waiting behind a decode does
    not fit the budget left, and nothing behind it may be admitted in its place.
    Measured on chunking-off-queue-not-blocked, every config narrowed so, seeds 1-10:
    caught on 10 (with the cap as drawn, the regime caught nothing the plain draws
    did not)."""
    seats = max(config.max_num_seqs, 2)
    budget = max(config.max_model_len, seats)
    return dataclasses.replace(
        config,
        max_num_seqs=seats,
        enable_chunked_prefill=False,
        # No long-prefill cap: a capped prompt would fit the budget left, and never block.
        long_prefill_token_threshold=0,
        max_num_batched_tokens=_padded_budget(config, budget),
    )


def padded_under_a_cap(config: SchedulerConfig) -> SchedulerConfig:
    """Spec-decode padding on, at least two seats, and a long-prefill cap of 1 to K
    tokens: the cap is below a padded admission's 1 + K (docs/FINDINGS.md F3, where vLLM
    pads and then fails its own assertion), and cuts every longer prompt into chunks,
    so one-token admissions meet running prefills (which must not be padded beside).
    With chunked prefill on, the budget is the smallest padding allows (1 + K, or the
    seats): a padded admission beside a decode no longer fits it, and must wait.
    configs() turns padding back off for an engine that fixed it off: the cap stays."""
    num_spec = max(config.num_speculative_tokens, 1)
    cap = config.long_prefill_token_threshold
    if not 0 < cap <= num_spec:
        cap = num_spec
    seats = max(config.max_num_seqs, 2)
    smallest = max(seats, 1 + num_spec)
    budget = smallest if config.enable_chunked_prefill else config.max_num_batched_tokens
    return dataclasses.replace(
        config,
        max_num_seqs=seats,
        num_speculative_tokens=num_spec,
        # The drafter's lookahead as drawn, or K's (None) where none was drawn.
        num_lookahead_tokens=config.num_lookahead_tokens if config.num_speculative_tokens else None,
        pad_spec_decode=True,
        long_prefill_token_threshold=min(cap, config.max_model_len),
        max_num_batched_tokens=max(budget, smallest),
    )


@dataclass(frozen=True)
class Regime:
    name: str
    corner: str  # the named corner (corners.py) it is for
    narrow: Callable[[SchedulerConfig], SchedulerConfig]
    weight: int


REGIMES: tuple[Regime, ...] = (
    Regime("priority-contention", "priority-victim-ahead", priority_contention, 4),
    Regime("tight-cache", "preemption", tight_cache, 2),
    Regime("head-of-line", "budget-exact-fit", head_of_line, 2),
    Regime("padded-under-a-cap", "padded-admission", padded_under_a_cap, 1),
)
# Draws left as drawn, against the regimes' weights: 3 of 12 configs. The regimes keep
# every knob they do not move as drawn, so they reach the other corners too
# (benchmarks/bench_corners.py).
PLAIN_WEIGHT = 3
