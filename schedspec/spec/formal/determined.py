"""DETERMINED: the vllm-v1 profile leaves schedule() no choice.

For a state satisfying the inductive invariant and the prefix hits the cache
offers, any two decisions that pass every clause of profile.py agree on the
tokens per request, the preempted set and the admitted set. A second query keeps
the claim from being vacuous: the reference's own step (step.py) passes every
clause, so the one decision the profile allows is the reference's.

For every N the claim is split as the other proofs are (docs/FORMAL.md, "How every
N is proved"): two engines that agree on the slots ahead of one slot see the same
context there (budget left, blocks taken, free blocks), and each lemma below is one
case of the induction over the slots, a quantifier-free query over one generic slot
and its two contexts:

- `running`: a running request neither engine preempts gets the same tokens and
  table from both, and takes exactly the blocks it asks for;
- `victims`: the first victim of one engine cannot be a request the other keeps
  (the blocks it frees were needed: PREEMPT-NEEDED against the other's
  conservation), so the victim sets, both a suffix of the running list, agree;
- `admitted`: a request both admit gets the same tokens and table;
- `head`: a request one engine admits cannot be the head the other leaves waiting
  (ADMISSION-STOP against the admission's own clauses);
- `after-head`: past the head it leaves waiting, an engine admits, schedules and
  allocates nothing, so its step ends as it stood at its head (what `head` reads);
- `neither`: a slot neither running nor admissible is left alone by both;
- `allocation`: a decision never returns blocks but a victim's (what `victims`
  sums), and the subset-sum lemma: the victims of one engine, a part of the
  other's, hold no more blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

import z3

from schedspec.spec.formal.encoding import (
    BoolTerm,
    ConfigTerms,
    IntTerm,
    Slot,
    symbolic_choices,
    symbolic_config,
    symbolic_slot,
    symbolic_state,
)
from schedspec.spec.formal.profile import (
    Around,
    Decision,
    End,
    Served,
    admissible,
    decisions_of,
    is_head,
    profile_clauses,
    running_ask,
    same_decision,
    same_decisions,
    slot_clauses,
    symbolic_decision,
    symbolic_decisions,
)
from schedspec.spec.formal.properties import slot_parts, state_invariant
from schedspec.spec.formal.solving import Outcome, discharge
from schedspec.spec.formal.step import step
from schedspec.spec.formal.variants import FAITHFUL, Variant

DETERMINED_ID = "DETERMINED"


def _kept(clauses: dict[str, BoolTerm], dropped: Collection[str]) -> list[BoolTerm]:
    return [c for name, c in clauses.items() if name not in dropped]


def _without(claim: str, dropped: Collection[str]) -> str:
    return claim + (f" without {', '.join(sorted(dropped))}" if dropped else "")


def _valid_hit(s: Slot, hit: IntTerm) -> BoolTerm:
    """A hit never covers the last token (get_computed_blocks)."""
    return z3.And(hit >= 0, z3.Implies(s.live, hit <= s.tokens - 1))


# ------------------------------------------------------------ N slots at once


def two_decisions_agree(
    n: int, block_size: int, timeout_s: float, dropped: Collection[str] = ()
) -> Outcome:
    """Two decisions over N slots that pass the profile (less the dropped clauses) agree."""
    cfg = replace(symbolic_config(), block_size=z3.IntVal(block_size))
    pre = symbolic_state(n)
    hits = [symbolic_choices(f"c[{i}]").hit for i in range(n)]
    first, second = symbolic_decisions(n, "a"), symbolic_decisions(n, "b")
    hypotheses = [
        *cfg.constraints(),
        state_invariant(cfg, pre),
        *(_valid_hit(s, h) for s, h in zip(pre.slots, hits, strict=True)),
        *_kept(profile_clauses(cfg, pre, hits, first), dropped),
        *_kept(profile_clauses(cfg, pre, hits, second), dropped),
    ]
    claim = _without(f"{DETERMINED_ID} N={n} block_size={block_size} two decisions agree", dropped)
    return discharge(claim, hypotheses, same_decisions(first, second), timeout_s)


def reference_passes(
    n: int, block_size: int, timeout_s: float, variant: Variant = FAITHFUL
) -> Outcome:
    """The model's step (the reference's rules, or a broken variant of them) passes
    every clause of the profile."""
    cfg = replace(symbolic_config(), block_size=z3.IntVal(block_size))
    pre = symbolic_state(n)
    choices = [symbolic_choices(f"c[{i}]") for i in range(n)]
    r = step(cfg, pre, choices, variant)
    clauses = profile_clauses(cfg, pre, [c.hit for c in choices], decisions_of(r))
    return discharge(
        f"{DETERMINED_ID} N={n} block_size={block_size} {variant.name} step passes the profile",
        [*cfg.constraints(), state_invariant(cfg, pre), r.choices_valid],
        z3.And(*clauses.values()),
        timeout_s,
    )


def check_determined(
    n: int,
    block_size: int,
    timeout_s: float,
    dropped: Collection[str] = (),
    variant: Variant = FAITHFUL,
) -> list[Outcome]:
    """The cross-check for N slots: the step passes, and two decisions agree."""
    return [
        reference_passes(n, block_size, timeout_s, variant),
        two_decisions_agree(n, block_size, timeout_s, dropped),
    ]


# ------------------------------------------------------------ every N


def generic_around(name: str) -> Around:
    return Around(
        cap=z3.Int(f"{name}.cap"),
        left=z3.Int(f"{name}.left"),
        used_ahead=z3.Int(f"{name}.used_ahead"),
        served=Served(z3.Bool(f"{name}.served_running"), z3.Bool(f"{name}.served_chunk")),
        free_at_start=z3.Int(f"{name}.free_at_start"),
        taken_ahead=z3.Int(f"{name}.taken_ahead"),
        victim_ahead=z3.Bool(f"{name}.victim_ahead"),
        victims_behind=z3.Int(f"{name}.victims_behind"),
        free_then=z3.Int(f"{name}.free_then"),
        running_then=z3.Int(f"{name}.running_then"),
        skipped_ahead=z3.Bool(f"{name}.skipped_ahead"),
        end=End(
            z3.Int(f"{name}.end.left"),
            z3.Int(f"{name}.end.free"),
            z3.Int(f"{name}.end.running"),
            z3.Bool(f"{name}.end.any_preempted"),
            z3.Bool(f"{name}.end.any_admitted"),
        ),
    )


def _sane(cfg: ConfigTerms, at: Around) -> list[BoolTerm]:
    """What every context satisfies: the step's cap, a budget left of at most the budget
    (by BUDGET, >= 0 at the end), running requests ahead used the rest (ORDER: only
    running requests come before a running one), counts >= 0."""
    return [
        z3.Or(at.cap == 0, at.cap == cfg.threshold),
        at.left <= cfg.budget,
        at.used_ahead == cfg.budget - at.left,
        z3.Implies(at.served.chunk, at.served.running),
        at.free_at_start >= 0,
        at.victims_behind >= 0,
        at.running_then >= 0,
        at.free_then >= 0,
    ]


def _shared(x: Around, y: Around) -> list[BoolTerm]:
    """Two engines that agree on every slot ahead see the same context at this one."""
    return [
        x.cap == y.cap,
        x.left == y.left,
        x.used_ahead == y.used_ahead,
        x.served.running == y.served.running,
        x.served.chunk == y.served.chunk,
        x.free_at_start == y.free_at_start,
        x.taken_ahead == y.taken_ahead,
        x.victim_ahead == y.victim_ahead,
        x.running_then == y.running_then,
        x.skipped_ahead == y.skipped_ahead,
    ]


Lemma = Callable[
    [ConfigTerms, Slot, IntTerm, Decision, Decision, Around, Around],
    tuple[list[BoolTerm], BoolTerm],
]


def _running(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, x: Decision, y: Decision, ax: Around, ay: Around
) -> tuple[list[BoolTerm], BoolTerm]:
    ask = running_ask(cfg, s, ax)
    hypotheses = [s.running, z3.Not(x.preempted), z3.Not(y.preempted)]
    goal = z3.And(
        same_decision(x, y),
        x.blocks == y.blocks,
        x.blocks - s.blocks == z3.If(ask.asks, ask.need, 0),
    )
    return hypotheses, goal


def _victims(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, x: Decision, y: Decision, ax: Around, ay: Around
) -> tuple[list[BoolTerm], BoolTerm]:
    """y's first victim is s, x keeps s running: x's victims (all behind s, a part of
    y's) free at most y.victims_behind; the blocks everything else in x took are >= 0."""
    x_victims, x_rest = z3.Ints("x.victims x.taken_behind")
    hypotheses = [
        s.running,
        z3.Not(x.preempted),
        y.preempted,
        z3.Not(ay.victim_ahead),
        x_victims >= 0,
        x_victims <= ay.victims_behind,
        x_rest >= 0,
        # x's conservation at the end of its step.
        ax.free_at_start + x_victims - ax.taken_ahead - (x.blocks - s.blocks) - x_rest >= 0,
    ]
    return hypotheses, z3.BoolVal(False)


def _admitted(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, x: Decision, y: Decision, ax: Around, ay: Around
) -> tuple[list[BoolTerm], BoolTerm]:
    return [x.admitted, y.admitted], z3.And(same_decision(x, y), x.blocks == y.blocks)


def _head(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, x: Decision, y: Decision, ax: Around, ay: Around
) -> tuple[list[BoolTerm], BoolTerm]:
    """x admits s, y leaves it waiting as its head. After its head y schedules nothing
    and changes no table, so y's step ends as x's context at s reads it; x admits, so
    nothing was preempted; x's admission leaves the seats and budget it needs (SEQS,
    BUDGET at x's end)."""
    hypotheses = [
        x.admitted,
        z3.Not(y.admitted),
        is_head(s, y, ay),
        ax.free_then == ay.free_then,
        ay.end.left == ay.left,
        ay.end.free == ay.free_then,
        ay.end.running == ay.running_then,
        z3.Not(ay.end.any_preempted),
        x.scheduled <= ax.left,
        ax.running_then + 1 <= cfg.max_num_seqs,
    ]
    return hypotheses, z3.BoolVal(False)


def _after_head(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, x: Decision, y: Decision, ax: Around, ay: Around
) -> tuple[list[BoolTerm], BoolTerm]:
    """Past its head (only waiting requests are there, ORDER) an engine admits nothing,
    schedules nothing and changes no table: its step ends as it was at its head."""
    hypotheses = [ay.skipped_ahead, z3.Not(s.running)]
    return hypotheses, z3.And(z3.Not(y.admitted), y.scheduled == 0, y.blocks == s.blocks)


def _neither(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, x: Decision, y: Decision, ax: Around, ay: Around
) -> tuple[list[BoolTerm], BoolTerm]:
    """A slot neither running nor admissible (empty, or waiting for stale output) is
    left alone by both."""
    return [z3.Not(s.running), z3.Not(admissible(s))], z3.And(
        same_decision(x, y), x.blocks == y.blocks
    )


def _allocation(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, x: Decision, y: Decision, ax: Around, ay: Around
) -> tuple[list[BoolTerm], BoolTerm]:
    held = z3.If(x.admitted, 0, s.blocks)
    return [z3.Not(x.preempted)], x.blocks - held >= 0


LEMMAS: dict[str, Lemma] = {
    "running": _running,
    "victims": _victims,
    "admitted": _admitted,
    "head": _head,
    "after-head": _after_head,
    "neither": _neither,
    "allocation": _allocation,
}


def slot_lemma(
    name: str, timeout_s: float, dropped: Collection[str] = (), block_size: int | None = None
) -> Outcome:
    """One case of the induction over the slots, for a generic slot and two engines'
    decisions on it that pass its clauses (less the dropped ones)."""
    cfg = symbolic_config()
    if block_size is not None:
        cfg = replace(cfg, block_size=z3.IntVal(block_size))
    s = symbolic_slot("s")
    hit = z3.If(cfg.prefix_caching, z3.Int("hit"), 0)
    x, y = symbolic_decision("x"), symbolic_decision("y")
    ax, ay = generic_around("ax"), generic_around("ay")
    extra, goal = LEMMAS[name](cfg, s, hit, x, y, ax, ay)
    hypotheses = [
        *cfg.constraints(),
        *slot_parts(cfg, s).values(),
        _valid_hit(s, hit),
        *_sane(cfg, ax),
        *_sane(cfg, ay),
        *_shared(ax, ay),
        *_kept(slot_clauses(cfg, s, x, hit, ax), dropped),
        *_kept(slot_clauses(cfg, s, y, hit, ay), dropped),
        *extra,
    ]
    return discharge(
        _without(f"{DETERMINED_ID} lemma {name}", dropped), hypotheses, goal, timeout_s
    )


def subset_sum_lemma(timeout_s: float) -> list[Outcome]:
    """Sums over two masks, one inside the other, of entries >= 0: the smaller mask sums
    to no more. Induction over the prefix length, the sequences as Z3 arrays."""
    a = z3.Array("a", z3.IntSort(), z3.IntSort())
    inner = z3.Array("inner", z3.IntSort(), z3.BoolSort())
    outer = z3.Array("outer", z3.IntSort(), z3.BoolSort())
    p = z3.Array("P", z3.IntSort(), z3.IntSort())  # prefix sums over inner
    q = z3.Array("Q", z3.IntSort(), z3.IntSort())  # prefix sums over outer
    k = z3.Int("k")

    def holds(i: IntTerm) -> BoolTerm:
        return p[i] <= q[i]

    entry = [a[k] >= 0, z3.Implies(inner[k], outer[k])]
    defined = [
        p[k + 1] == p[k] + z3.If(inner[k], a[k], 0),
        q[k + 1] == q[k] + z3.If(outer[k], a[k], 0),
    ]
    return [
        discharge("subset-sum base", [p[0] == 0, q[0] == 0], holds(z3.IntVal(0)), timeout_s),
        discharge("subset-sum step", [k >= 0, holds(k), *entry, *defined], holds(k + 1), timeout_s),
    ]


def determined_for_all_n(timeout_s: float, dropped: Collection[str] = ()) -> list[Outcome]:
    return [
        *(slot_lemma(name, timeout_s, dropped) for name in LEMMAS),
        *subset_sum_lemma(timeout_s),
    ]
