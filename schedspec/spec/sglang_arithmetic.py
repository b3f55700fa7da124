"""SGLang 0.5.23's admission arithmetic, shared by the reference's SGLang family and the
`sglang` profile's invariants (one statement of each formula).

new_token_ratio is the fraction of a running request's remaining max_new_tokens that
admission reserves for it: it starts at 0.7 * schedule_conservativeness (at most 1),
decays linearly each decode step to 0.14 of that over 600 steps, and after a
retraction jumps to what the survivors would need for 20 more steps each. Admission
reserves an admitted request's page-ceiled extend plus a page now and its
max_new_tokens (clipped at 4096) later. (SGLang's SGLANG_INIT_NEW_TOKEN_RATIO,
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS,
SGLANG_RETRACT_DECODE_STEPS, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION defaults.)
"""

from __future__ import annotations

from typing import NamedTuple

from schedspec.spec.config import SchedulerConfig

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
# SGLang's max_prefill_tokens default, the input budget when chunked prefill is on.
DEFAULT_MAX_PREFILL_TOKENS = 16384


class PrefillBudgets(NamedTuple):
    """A prefill pass's compute budgets, in SGLang's names, under a config's mapping
    (docs/SPEC.md, "Two families"): chunked prefill makes max_num_batched_tokens the
    chunk budget and leaves the input budget at SGLang's default; without it,
    max_num_batched_tokens is the input budget and there is no chunk budget."""

    max_prefill_tokens: int
    chunked_prefill_size: int | None


def prefill_budgets(config: SchedulerConfig) -> PrefillBudgets:
    if config.enable_chunked_prefill:
        return PrefillBudgets(DEFAULT_MAX_PREFILL_TOKENS, config.max_num_batched_tokens)
    return PrefillBudgets(config.max_num_batched_tokens, None)


class RatioSchedule(NamedTuple):
    init: float
    min: float
    decay: float  # per decode step


def ratio_schedule(schedule_conservativeness: float) -> RatioSchedule:
    init = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
    floor = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
    return RatioSchedule(init, floor, (init - floor) / NEW_TOKEN_RATIO_DECAY_STEPS)


def decayed(ratio: float, schedule: RatioSchedule) -> float:
    """The ratio after one decode step that retracted nothing."""
    return max(ratio - schedule.decay, schedule.min)


def ratio_after_retract(survivor_outputs: int, survivor_budgets: int, num_survivors: int) -> float:
    """What the survivors have decoded plus RETRACT_DECODE_STEPS more each, over their
    max_new_tokens (+1), at most 1."""
    needed = survivor_outputs + RETRACT_DECODE_STEPS * num_survivors
    return min(1.0, needed / (survivor_budgets + 1))


def running_reservation(remaining_new_tokens: int, ratio: float) -> float:
    """What admission reserves for a running request with that many tokens still to go."""
    return min(remaining_new_tokens, CLIP_MAX_NEW_TOKENS) * ratio
