"""The vllm-v1 profile as a relation: a step's decisions as unknowns, held only by the
catalogue's predicates over the pre-state and those decisions.

step.py is one engine (the reference's rules); this module is every engine the
profile accepts. A decision per slot is what schedule() decides for the request:
tokens scheduled (0 = not scheduled), preempted, admitted, and the length of its
block table afterwards. Each clause states one predicate of schedspec/spec/invariants
(vllm/policy.py for vllm-v1; safety/schedule.py and safety/state.py for safety) in
counts, following the Python where counts can say it. The prefix-cache hit of each
request is the environment's (a shared input): cache content is outside the counts
model.

Each predicate is stated for one slot in a context (`Around`: the budget left when the
loops reach it, the blocks taken ahead of it, the step's end), so that the proofs for
every N (determined.py) and the query over N slots read the same clauses; the query
over N slots builds each slot's context from prefix sums (`contexts`).

The strengthenings (`STRENGTHENINGS`) are the clauses the catalogue lacked until the
DETERMINED query found two different decisions that both passed it; each is a
predicate of schedspec/spec/invariants now (docs/FORMAL.md, "DETERMINED").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import z3

from schedspec.spec.formal.encoding import (
    BoolTerm,
    ConfigTerms,
    IntTerm,
    ModelState,
    Slot,
    zmax,
    zmin,
)
from schedspec.spec.formal.rules import (
    apply_cap,
    blocks_to_allocate,
    long_prefill_cap,
    padded_tokens,
    running_num_new,
    running_slots_needed,
    sure_to_reach_max_tokens,
)
from schedspec.spec.formal.step import StepResult, count
from schedspec.spec.formal.variants import FAITHFUL

# Each strengthening's clause name, and the catalogue id that states it in Python.
STRENGTHENINGS: dict[str, str] = {
    "preempt-needed": "PREEMPT-NEEDED",
    "alloc-exact": "ALLOC-EXACT",
    "admission-fits": "ADMISSION-FIT",
    "padding-waits": "GREEDY-BUDGET",
}


@dataclass(frozen=True)
class Decision:
    """What one engine's schedule() decided for one slot."""

    scheduled: IntTerm  # num_scheduled_tokens (0 = not in the step)
    preempted: BoolTerm
    admitted: BoolTerm
    blocks: IntTerm  # the table's length after schedule()

    def terms(self) -> list[object]:
        return [self.scheduled, self.preempted, self.admitted, self.blocks]


def symbolic_decision(name: str) -> Decision:
    return Decision(
        z3.Int(f"{name}.scheduled"),
        z3.Bool(f"{name}.preempted"),
        z3.Bool(f"{name}.admitted"),
        z3.Int(f"{name}.blocks"),
    )


def symbolic_decisions(n: int, name: str) -> tuple[Decision, ...]:
    return tuple(symbolic_decision(f"{name}[{i}]") for i in range(n))


def decisions_of(r: StepResult) -> tuple[Decision, ...]:
    """The decisions of the model's step (the reference's rules)."""
    return tuple(
        Decision(r.scheduled[i], r.preempted[i], r.admitted[i], r.mid.slots[i].blocks)
        for i in range(len(r.pre.slots))
    )


def same_decision(x: Decision, y: Decision) -> BoolTerm:
    """What DETERMINED compares: tokens, preempted, admitted."""
    return z3.And(x.scheduled == y.scheduled, x.preempted == y.preempted, x.admitted == y.admitted)


def same_decisions(a: Sequence[Decision], b: Sequence[Decision]) -> BoolTerm:
    return z3.And(True, *(same_decision(x, y) for x, y in zip(a, b, strict=True)))


def _sum(terms: Sequence[IntTerm]) -> IntTerm:
    return z3.Sum(list(terms)) if terms else z3.IntVal(0)


@dataclass(frozen=True)
class Served:
    """What the padding rule reads of the step: running requests scheduled, and whether
    one of them was a prefill chunk in its previous step."""

    running: BoolTerm
    chunk: BoolTerm


@dataclass(frozen=True)
class End:
    """The step as it ends (what ADMISSION-STOP and WATERMARK read)."""

    left: IntTerm  # budget left
    free: IntTerm  # free blocks
    running: IntTerm  # requests running
    any_preempted: BoolTerm
    any_admitted: BoolTerm


@dataclass(frozen=True)
class Around:
    """One slot's view of the rest of the step, for one engine's decisions."""

    cap: IntTerm  # the long-prefill cap of the step
    left: IntTerm  # budget left when the loops reach it
    used_ahead: IntTerm  # tokens of the running requests ahead of it
    served: Served
    free_at_start: IntTerm  # free blocks when schedule() starts
    taken_ahead: IntTerm  # blocks the running requests ahead of it took
    victim_ahead: BoolTerm  # a running request ahead of it was preempted
    victims_behind: IntTerm  # blocks the victims behind it held
    free_then: IntTerm  # free blocks when it is admitted
    running_then: IntTerm  # requests running when it is admitted
    skipped_ahead: BoolTerm  # an admissible request ahead of it was left waiting
    end: End


def is_head(s: Slot, d: Decision, at: Around) -> BoolTerm:
    """The first admissible request left waiting (what ADMISSION-STOP judges)."""
    return z3.And(admissible(s), z3.Not(d.admitted), z3.Not(at.skipped_ahead))


def padded_admission(
    cfg: ConfigTerms, s: Slot, hit: IntTerm, left: IntTerm, cap: IntTerm, served: Served
) -> IntTerm:
    """policy_invariants.padded_admission: 1 + K when it pads, 0 when not, -1 when the
    padded count does not fit the budget left (the admission then waits)."""
    padding = padded_tokens(cfg, s.tokens - hit, hit)
    applies = z3.And(
        cfg.pad_spec_decode,
        z3.Not(served.chunk),
        z3.Or(served.running, hit > 0),
        padding > 0,
    )
    return z3.If(
        z3.Not(applies),
        0,
        z3.If(padding > left, -1, z3.If(z3.And(cap > 0, cap < padding), 0, padding)),
    )


def running_demand(s: Slot, computed: IntTerm) -> IntTerm:
    """policy_invariants._running_demand: known tokens, in-flight outputs and drafts."""
    return s.tokens + s.drafts + s.placeholders - computed


def admissible(s: Slot) -> BoolTerm:
    """policy_invariants._admissible: waiting, and not waiting for stale output."""
    return z3.And(s.live, z3.Not(s.running), s.stale == 0)


def runs_after(s: Slot, d: Decision) -> BoolTerm:
    return z3.Or(z3.And(s.running, z3.Not(d.preempted)), d.admitted)


def computed_before(s: Slot, d: Decision, hit: IntTerm) -> IntTerm:
    """What SchedulerOutput reports (MONOTONE): the hit for an admission."""
    return z3.If(d.admitted, hit, s.computed)


def admission_blocks(cfg: ConfigTerms, s: Slot, hit: IntTerm, num_new: IntTerm) -> IntTerm:
    """The blocks an admission must find free: its whole known sequence or this step's
    slots, whichever is more (allocate_slots with full_sequence_must_fit), every hit
    block charged as evictable (the counts model's cache)."""
    whole = zmin(s.tokens, cfg.max_model_len)
    step_slots = zmin(hit + num_new + cfg.lookahead, cfg.max_model_len)
    return blocks_to_allocate(cfg, 0, zmax(whole, step_slots), FAITHFUL)


@dataclass(frozen=True)
class RunningAsk:
    """What a running request asks of the step when the loop reaches it (the rules of
    _schedule_running): whether it wants tokens, and the blocks they take."""

    asks: BoolTerm
    need: IntTerm


def running_ask(cfg: ConfigTerms, s: Slot, at: Around) -> RunningAsk:
    num_new = running_num_new(cfg, at.cap, s, at.left)
    asks = z3.And(at.left > 0, z3.Not(sure_to_reach_max_tokens(s)), num_new > 0)
    need = blocks_to_allocate(cfg, s.blocks, running_slots_needed(cfg, s, num_new), FAITHFUL)
    return RunningAsk(asks, need)


def slot_clauses(
    cfg: ConfigTerms, s: Slot, d: Decision, hit: IntTerm, at: Around
) -> dict[str, BoolTerm]:
    """The per-slot part of every clause, by name."""
    n = d.scheduled
    before = computed_before(s, d, hit)
    padded = padded_admission(cfg, s, hit, at.left, at.cap, at.served)

    # GREEDY-BUDGET: in scheduling order, min(capped demand, budget left, room).
    base = z3.If(padded > 0, padded, apply_cap(s.tokens - hit, at.cap))
    admission = z3.If(cfg.chunked, zmin(base, at.left), base)
    demand = apply_cap(running_demand(s, before), at.cap)
    running = zmin(zmin(demand, at.left), cfg.max_model_len - 1 - before)

    # RUNNING-SERVED's excuses.
    idle = z3.Or(
        sure_to_reach_max_tokens(s),
        running_demand(s, s.computed) <= 0,
        cfg.max_model_len - 1 - s.computed <= 0,
    )

    # ADMISSION-STOP for the head, from the step's end.
    end = at.end
    head_padded = padded_admission(cfg, s, hit, end.left, at.cap, at.served)
    head_demand = z3.If(head_padded > 0, head_padded, apply_cap(s.tokens - hit, at.cap))
    head_spare = z3.If(end.running > 0, cfg.watermark_blocks, 0)
    head_blocks = admission_blocks(cfg, s, hit, zmin(head_demand, end.left))
    refused_for_a_reason = z3.Or(
        end.any_preempted,
        end.left <= 0,
        end.running >= cfg.max_num_seqs,
        head_padded < 0,
        z3.And(z3.Not(cfg.chunked), head_demand > end.left),
        head_blocks + head_spare > end.free,
    )

    # ALLOC-EXACT: the table allocate_slots leaves.
    held = z3.If(d.admitted, 0, s.blocks)
    step_slots = zmin(before + n + cfg.lookahead, cfg.max_model_len)
    grown = held + blocks_to_allocate(cfg, held, step_slots, FAITHFUL)

    # PREEMPT-NEEDED: what the first victim in running order (fcfs takes it last) would
    # have asked for when the loop reached it.
    ask = running_ask(cfg, s, at)
    # ADMISSION-FIT: the watermark, once something runs.
    spare = z3.If(at.running_then > 0, cfg.watermark_blocks, 0)
    return {
        # ---- safety
        "BUDGET": z3.And(
            n >= 0,
            z3.Implies(n > 0, runs_after(s, d)),
            # An admission puts the request in the step (scheduled_new_reqs).
            z3.Implies(d.admitted, n > 0),
        ),
        "CONSERVATION": z3.And(d.blocks >= 0, z3.Implies(z3.Not(s.live), d.blocks == 0)),
        # A waiting request holds no blocks.
        "QUEUES": z3.Implies(z3.And(s.live, z3.Not(runs_after(s, d))), d.blocks == 0),
        "KV-COVER": z3.Implies(
            n > 0,
            d.blocks * cfg.block_size >= zmin(before + n + cfg.lookahead, cfg.max_model_len),
        ),
        "NO-OVERSHOOT": z3.Implies(
            n > 0,
            z3.And(
                before + n
                <= z3.If(
                    d.admitted,
                    s.tokens + z3.If(cfg.pad_spec_decode, cfg.num_spec, 0),
                    s.tokens + s.drafts + s.placeholders,
                ),
                before + n <= cfg.max_model_len - 1,
            ),
        ),
        "PREEMPT-RESET": z3.Implies(d.preempted, z3.And(s.running, n == 0, d.blocks == 0)),
        "MAX-TOKENS": z3.Implies(z3.And(n > 0, s.running), z3.Not(sure_to_reach_max_tokens(s))),
        # ---- vllm-v1
        # Admissions are the first admissible requests of the queue.
        "SCHEDULE-ORDER": z3.Implies(d.admitted, z3.And(admissible(s), z3.Not(at.skipped_ahead))),
        "GREEDY-BUDGET": z3.Implies(n > 0, n == z3.If(d.admitted, admission, running)),
        "RUNNING-SERVED": z3.Implies(
            s.running, z3.Or(n > 0, d.preempted, at.used_ahead >= cfg.budget, idle)
        ),
        "ADMISSION-STOP": z3.Implies(is_head(s, d, at), refused_for_a_reason),
        # ---- strengthenings
        "preempt-needed": z3.Implies(
            z3.And(d.preempted, z3.Not(at.victim_ahead)),
            at.taken_ahead + z3.If(ask.asks, ask.need, 0) > at.free_at_start + at.victims_behind,
        ),
        "alloc-exact": z3.And(
            z3.Implies(n > 0, d.blocks == grown),
            z3.Implies(z3.And(n == 0, z3.Not(d.preempted)), d.blocks == s.blocks),
        ),
        "admission-fits": z3.Implies(
            d.admitted, admission_blocks(cfg, s, hit, n) + spare <= at.free_then
        ),
        "padding-waits": z3.Implies(d.admitted, padded >= 0),
    }


def contexts(
    cfg: ConfigTerms, pre: ModelState, ds: Sequence[Decision]
) -> tuple[tuple[Around, ...], End]:
    """Each slot's context in a step over these slots, from prefix sums. Slots are in
    list order (ORDER): running ones in running order, then waiting ones in queue
    order, which is also scheduling order."""
    slots = pre.slots
    n = len(slots)
    cap = long_prefill_cap(cfg, count([s.live for s in slots]))
    scheduled = [d.scheduled for d in ds]
    end = End(
        left=cfg.budget - _sum(scheduled),
        free=pre.free + _sum([s.blocks - d.blocks for s, d in zip(slots, ds, strict=True)]),
        running=count([runs_after(s, d) for s, d in zip(slots, ds, strict=True)]),
        any_preempted=z3.Or(False, *(d.preempted for d in ds)),
        any_admitted=z3.Or(False, *(d.admitted for d in ds)),
    )
    served = Served(
        z3.Or(False, *(z3.And(s.running, d.scheduled > 0) for s, d in zip(slots, ds, strict=True))),
        z3.Or(
            False,
            *(z3.And(s.running, d.scheduled > 0, s.chunk) for s, d in zip(slots, ds, strict=True)),
        ),
    )
    runs_on = [z3.And(s.running, z3.Not(d.preempted)) for s, d in zip(slots, ds, strict=True)]
    victims = [z3.And(s.running, d.preempted) for s, d in zip(slots, ds, strict=True)]
    around = []
    for i in range(n):
        ahead = range(i)
        around.append(
            Around(
                cap=cap,
                left=cfg.budget - _sum(scheduled[:i]),
                used_ahead=_sum([z3.If(slots[k].running, scheduled[k], 0) for k in ahead]),
                served=served,
                free_at_start=pre.free,
                taken_ahead=_sum(
                    [z3.If(slots[k].running, ds[k].blocks - slots[k].blocks, 0) for k in ahead]
                ),
                victim_ahead=z3.Or(False, *(victims[k] for k in ahead)),
                victims_behind=_sum(
                    [z3.If(victims[j], slots[j].blocks, 0) for j in range(i + 1, n)]
                ),
                free_then=end.free
                + _sum([z3.If(ds[k].admitted, ds[k].blocks, 0) for k in range(i, n)]),
                running_then=count(runs_on + [ds[k].admitted for k in ahead]),
                skipped_ahead=z3.Or(
                    False, *(z3.And(admissible(slots[k]), z3.Not(ds[k].admitted)) for k in ahead)
                ),
                end=end,
            )
        )
    return tuple(around), end


def step_clauses(
    cfg: ConfigTerms, pre: ModelState, ds: Sequence[Decision], end: End
) -> dict[str, BoolTerm]:
    """The clauses that relate slots or read the whole step, by name."""
    slots = pre.slots
    n = len(slots)
    return {
        "BUDGET": end.left >= 0,
        "SEQS": end.running <= cfg.max_num_seqs,
        "CONSERVATION": end.free >= 0,
        "NO-ADMIT-AFTER-PREEMPT": z3.Implies(end.any_preempted, z3.Not(end.any_admitted)),
        # fcfs: the victims are the end of the running list.
        "VICTIM": z3.And(
            True,
            *(
                z3.Implies(z3.And(ds[i].preempted, slots[j].running), ds[j].preempted)
                for i in range(n)
                for j in range(i + 1, n)
            ),
        ),
        "WATERMARK": z3.Implies(
            z3.And(end.any_admitted, end.running >= 2), end.free >= cfg.watermark_blocks
        ),
    }


def profile_clauses(
    cfg: ConfigTerms, pre: ModelState, hits: Sequence[IntTerm], ds: Sequence[Decision]
) -> dict[str, BoolTerm]:
    """Every clause over a step of these slots, by name (hits as the cache offers them,
    before the prefix_caching switch)."""
    hit = [z3.If(cfg.prefix_caching, h, 0) for h in hits]
    around, end = contexts(cfg, pre, ds)
    per_slot = [
        slot_clauses(cfg, s, d, h, at)
        for s, d, h, at in zip(pre.slots, ds, hit, around, strict=True)
    ]
    clauses = step_clauses(cfg, pre, ds, end)
    for name in per_slot[0] if per_slot else ():
        mine = z3.And(True, *(p[name] for p in per_slot))
        clauses[name] = z3.And(clauses[name], mine) if name in clauses else mine
    return clauses
