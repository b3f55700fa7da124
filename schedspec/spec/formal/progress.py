"""NO-EMPTY-STEP: with a request unfinished, a step schedules at least one token.

It rests on the add_request precondition: every request fits an empty cache
(num_blocks * block_size >= max_model_len, prompts shorter than
max_model_len). Without it, Z3 finds a state the step leaves unchanged with
nothing scheduled: the request waits forever (the hang engines shipped).
"""

from __future__ import annotations

from dataclasses import replace

import z3

from schedspec.spec.formal.encoding import (
    BoolTerm,
    ConfigTerms,
    symbolic_choices,
    symbolic_config,
    symbolic_slot,
    symbolic_state,
)
from schedspec.spec.formal.properties import slot_parts, state_invariant
from schedspec.spec.formal.rules import (
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


def _fits_empty_cache(cfg: ConfigTerms) -> BoolTerm:
    return cfg.num_blocks * cfg.block_size >= cfg.max_model_len


def check_progress(n: int, block_size: int, timeout_s: float) -> Outcome:
    """Monolithic: Inv(s) with a live slot implies the step schedules a token."""
    cfg = replace(symbolic_config(), block_size=z3.IntVal(block_size))
    pre = symbolic_state(n)
    r = step(cfg, pre, [symbolic_choices(f"c[{i}]") for i in range(n)])
    hypotheses = [
        *cfg.constraints(),
        state_invariant(cfg, pre),
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
    base = [*cfg.constraints(), *slot_parts(cfg, s).values(), z3.Or(cap == 0, cap == cfg.threshold)]
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
    first_running = discharge(
        f"{PROGRESS_ID} lemma first-running",
        [*base, s.running, s.blocks <= cfg.num_blocks],
        z3.And(num_new > 0, need <= cfg.num_blocks - s.blocks),
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
    plan = admission(cfg, cap, s, hit, cfg.budget, cfg.num_blocks, z3.IntVal(0), FAITHFUL)
    head_admitted = discharge(
        f"{PROGRESS_ID} lemma head-admitted",
        [*base, s.live, z3.Not(s.running), hit >= 0, hit <= s.tokens - 1],
        z3.And(
            z3.Not(seats_full(cfg, z3.IntVal(0), FAITHFUL)),
            z3.Not(plan.blocked_by_budget),
            plan.fits,
            plan.num_new > 0,
        ),
        timeout_s,
    )
    return [bounded, first_running, alone, head_admitted]


def stall_without_precondition(block_size: int, timeout_s: float) -> Outcome:
    """Drop 'fits an empty cache': a state the step maps to itself with nothing scheduled.

    The claim checked is that no such state exists; Z3's counterexample is the stall.
    """
    cfg = replace(symbolic_config(), block_size=z3.IntVal(block_size))
    pre = symbolic_state(1)
    r = step(cfg, pre, [symbolic_choices("c[0]")])
    precondition = _fits_empty_cache(cfg)
    hypotheses = [
        *(c for c in cfg.constraints() if not c.eq(precondition)),
        state_invariant(cfg, pre),
        r.choices_valid,
        pre.slots[0].live,
    ]
    unchanged = z3.And(
        r.post.free == pre.free,
        *(a == b for a, b in zip(r.post.slots[0].terms(), pre.slots[0].terms(), strict=True)),
    )
    stalls = z3.And(z3.Sum(list(r.scheduled)) == 0, unchanged)
    return discharge(
        f"{PROGRESS_ID} without the precondition", hypotheses, z3.Not(stalls), timeout_s
    )
