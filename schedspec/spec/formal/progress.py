"""NO-EMPTY-STEP: with a request unfinished and nothing in flight, a step schedules a token.

It rests on two preconditions. The add_request one: every request fits an
empty cache (num_blocks * block_size >= max_model_len, prompts shorter than
max_model_len); without it, Z3 finds a state the step leaves unchanged with
nothing scheduled: the request waits forever (the hang engines shipped).
And, with spec-decode padding, a padded admission fits the whole budget
(max_num_batched_tokens >= 1 + num_speculative_tokens, which vLLM's start-up
check `max_num_batched_tokens > num_lookahead_tokens` implies and
SchedulerConfig does not check): without it a one-token admission behind a
prefix hit waits for budget that never comes.

With a step in flight a request may rightly wait for its output (MAX-TOKENS,
or every position up to max_model_len already scheduled), so the claim is
about a state with nothing in flight, as the catalogue's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import z3

from schedspec.spec.formal.encoding import (
    BoolTerm,
    ConfigTerms,
    ModelState,
    symbolic_choices,
    symbolic_config,
    symbolic_slot,
    symbolic_state,
)
from schedspec.spec.formal.properties import slot_parts, state_invariant
from schedspec.spec.formal.rules import (
    StepSoFar,
    admission,
    blocks_to_allocate,
    running_num_new,
    running_slots_needed,
    seats_full,
)
from schedspec.spec.formal.solving import Outcome, discharge
from schedspec.spec.formal.step import step
from schedspec.spec.formal.variants import FAITHFUL

PROGRESS_ID = "NO-EMPTY-STEP"


def fits_empty_cache(cfg: ConfigTerms) -> BoolTerm:
    """The add_request precondition (SchedulerConfig checks it)."""
    return cfg.num_blocks * cfg.block_size >= cfg.max_model_len


def padding_fits_budget(cfg: ConfigTerms) -> BoolTerm:
    """A padded admission fits the whole budget (SchedulerConfig does not check it)."""
    return z3.Implies(cfg.pad_spec_decode, cfg.budget >= 1 + cfg.num_spec)


# The preconditions progress rests on, by name; fits-empty-cache is among the config's
# own constraints, padding-fits-budget is added here.
PRECONDITIONS: dict[str, Callable[[ConfigTerms], BoolTerm]] = {
    "fits-empty-cache": fits_empty_cache,
    "padding-fits-budget": padding_fits_budget,
}


def _config_hypotheses(cfg: ConfigTerms, dropped: str | None = None) -> list[BoolTerm]:
    """The config's constraints and the progress preconditions, less the dropped one."""
    wanted = [check(cfg) for name, check in PRECONDITIONS.items() if name != dropped]
    unwanted = [check(cfg) for name, check in PRECONDITIONS.items() if name == dropped]
    config = [c for c in cfg.constraints() if not any(c.eq(u) for u in unwanted)]
    return config + [w for w in wanted if not any(w.eq(c) for c in config)]


def _nothing_in_flight(state: ModelState) -> BoolTerm:
    return z3.And(True, *(s.in_flight == 0 for s in state.slots))


def check_progress(n: int, block_size: int, timeout_s: float) -> Outcome:
    """Monolithic: Inv(s) with a live slot and nothing in flight implies the step
    schedules a token."""
    cfg = replace(symbolic_config(), block_size=z3.IntVal(block_size))
    pre = symbolic_state(n)
    r = step(cfg, pre, [symbolic_choices(f"c[{i}]") for i in range(n)])
    hypotheses = [
        *_config_hypotheses(cfg),
        state_invariant(cfg, pre),
        _nothing_in_flight(pre),
        r.choices_valid,
        z3.Or(*(s.live for s in pre.slots)),
    ]
    goal = z3.Sum(list(r.scheduled)) > 0
    return discharge(f"{PROGRESS_ID} N={n} block_size={block_size}", hypotheses, goal, timeout_s)


def progress_lemmas(timeout_s: float) -> list[Outcome]:
    """For every N, block size symbolic: the first running request always runs (once the
    requests behind it are preempted, the whole cache is its own), and with none running
    the head of the queue is always admitted."""
    cfg = symbolic_config()
    s = symbolic_slot("s")
    cap = z3.Int("cap")
    base = [
        *_config_hypotheses(cfg),
        *slot_parts(cfg, s).values(),
        s.in_flight == 0,
        z3.Or(cap == 0, cap == cfg.threshold),
    ]
    num_new = running_num_new(cfg, cap, s, cfg.budget)
    need = blocks_to_allocate(cfg, s.blocks, running_slots_needed(cfg, s, num_new), FAITHFUL)
    free, held, others = z3.Ints("free held others")
    # Conservation bounds one table by the cache (the other tables hold >= 0 blocks).
    bounded = discharge(
        f"{PROGRESS_ID} glue one-table-fits",
        [free >= 0, free + held == cfg.num_blocks, held == s.blocks + others, others >= 0],
        s.blocks <= cfg.num_blocks,
        timeout_s,
    )
    # With nothing in flight nothing is sure to finish: the first request is not passed over.
    first_running = discharge(
        f"{PROGRESS_ID} lemma first-running",
        [*base, s.running, s.blocks <= cfg.num_blocks],
        z3.And(s.placeholders == 0, num_new > 0, need <= cfg.num_blocks - s.blocks),
        timeout_s,
    )
    # Glue: with every other running request preempted, conservation leaves it the rest.
    alone = discharge(
        f"{PROGRESS_ID} glue victims-free-the-rest",
        [free + held == cfg.num_blocks, held == s.blocks + others, others == 0],
        free == cfg.num_blocks - s.blocks,
        timeout_s,
    )
    hit = z3.If(cfg.prefix_caching, z3.Int("hit"), 0)
    nothing_served = StepSoFar(z3.BoolVal(False), z3.BoolVal(False))
    plan = admission(
        cfg, cap, s, hit, cfg.budget, cfg.num_blocks, z3.IntVal(0), nothing_served, FAITHFUL
    )
    head_admitted = discharge(
        f"{PROGRESS_ID} lemma head-admitted",
        [*base, s.live, z3.Not(s.running), hit >= 0, hit <= s.tokens - 1],
        z3.And(
            z3.Not(seats_full(cfg, z3.IntVal(0), FAITHFUL)),
            z3.Not(plan.skipped),
            z3.Not(plan.blocked_by_budget),
            plan.fits,
            plan.num_new > 0,
        ),
        timeout_s,
    )
    return [bounded, first_running, alone, head_admitted]


def stall_without(precondition: str, block_size: int, timeout_s: float) -> Outcome:
    """Drop one precondition: a state the step maps to itself with nothing scheduled.

    The claim checked is that no such state exists; Z3's counterexample is the stall.
    """
    cfg = replace(symbolic_config(), block_size=z3.IntVal(block_size))
    pre = symbolic_state(1)
    r = step(cfg, pre, [symbolic_choices("c[0]")])
    hypotheses = [
        *_config_hypotheses(cfg, dropped=precondition),
        state_invariant(cfg, pre),
        _nothing_in_flight(pre),
        r.choices_valid,
        pre.slots[0].live,
    ]
    unchanged = z3.And(
        r.post.free == pre.free,
        *(a == b for a, b in zip(r.post.slots[0].terms(), pre.slots[0].terms(), strict=True)),
    )
    stalls = z3.And(z3.Sum(list(r.scheduled)) == 0, unchanged)
    return discharge(f"{PROGRESS_ID} without {precondition}", hypotheses, z3.Not(stalls), timeout_s)
