"""What `schedspec prove` runs: for each invariant, the proof for every N, then the
monolithic cross-checks for N = 1..max_n, which must agree with it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import cache

from schedspec.spec.formal.determined import (
    DETERMINED_ID,
    check_determined,
    determined_for_all_n,
)
from schedspec.spec.formal.monolithic import check_step
from schedspec.spec.formal.parametric import (
    GLUES,
    SLOT_LEMMA_IDS,
    glue_induction,
    need_lemma,
    prefix_sum_update_lemma,
    slot_lemma,
)
from schedspec.spec.formal.profile import STRENGTHENINGS
from schedspec.spec.formal.progress import PROGRESS_ID, check_progress, progress_lemmas
from schedspec.spec.formal.properties import ORDER_ID, PROVED_IDS
from schedspec.spec.formal.solving import Outcome, Verdict
from schedspec.spec.formal.variants import FAITHFUL, Variant

ALL_IDS: tuple[str, ...] = (*PROVED_IDS, PROGRESS_ID, ORDER_ID, DETERMINED_ID)
ALL_N = "all"

# The claims whose glue sums over the slots rest on the prefix-sum lemma.
SUMMED_IDS = frozenset({"BUDGET", "CONSERVATION", "SEQS"})


@dataclass(frozen=True)
class ProofRow:
    """One line of the table: an invariant, for all N or for one N, and the Z3 verdicts."""

    invariant: str
    n: str  # "all" or a number
    outcomes: tuple[Outcome, ...]

    @property
    def verdict(self) -> Verdict:
        verdicts = {o.verdict for o in self.outcomes}
        if "counterexample" in verdicts:
            return "counterexample"
        return "unknown" if "unknown" in verdicts else "proved"

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.outcomes)

    @property
    def failure(self) -> Outcome | None:
        """The first query that did not prove its claim."""
        return next((o for o in self.outcomes if not o.proved), None)


@dataclass(frozen=True)
class ProveSettings:
    max_n: int = 8  # monolithic cross-checks for N = 1..max_n
    timeout_s: float = 60.0  # per Z3 query
    block_size: int = 2  # of the monolithic queries (the parametric ones keep it symbolic)
    only: tuple[str, ...] = ALL_IDS
    variant: Variant = FAITHFUL
    # DETERMINED only: strengthenings left out of the profile (each a broken variant).
    dropped: tuple[str, ...] = ()
    # DETERMINED's cross-checks: two engines over N slots grow fast (N = 1: 0.2 s,
    # N = 2: 20 s on an idle machine and minutes under load, N = 3: over 10 minutes).
    determined_max_n: int = 1

    def __post_init__(self) -> None:
        if self.max_n < 0:
            raise ValueError(f"max_n: must be >= 0, got {self.max_n}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        if self.determined_max_n < 0:
            raise ValueError(f"determined_max_n: must be >= 0, got {self.determined_max_n}")
        if self.block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {self.block_size}")
        unknown = sorted(set(self.only) - set(ALL_IDS))
        if unknown:
            raise ValueError(f"only: unknown invariant {unknown[0]!r}; one of {', '.join(ALL_IDS)}")
        strange = sorted(set(self.dropped) - set(STRENGTHENINGS))
        if strange:
            raise ValueError(
                f"dropped: unknown strengthening {strange[0]!r}; one of {', '.join(STRENGTHENINGS)}"
            )
        if self.dropped and DETERMINED_ID not in self.only:
            raise ValueError(f"dropped: only {DETERMINED_ID} reads it; add it to only")


@cache
def _prefix_sums(timeout_s: float) -> tuple[Outcome, ...]:
    return tuple(prefix_sum_update_lemma(timeout_s))


def prove_for_all_n(invariant_id: str, settings: ProveSettings) -> ProofRow:
    t, v = settings.timeout_s, settings.variant
    if invariant_id == PROGRESS_ID:
        return ProofRow(invariant_id, ALL_N, tuple(progress_lemmas(t)))
    if invariant_id == DETERMINED_ID:
        return ProofRow(invariant_id, ALL_N, tuple(determined_for_all_n(t, settings.dropped)))
    outcomes: list[Outcome] = []
    if invariant_id in SLOT_LEMMA_IDS:
        outcomes.append(slot_lemma(invariant_id, t, v))
    if invariant_id in GLUES:
        if invariant_id in SUMMED_IDS:
            outcomes.extend(_prefix_sums(t))
        outcomes.append(need_lemma(t, v))
        outcomes.extend(glue_induction(invariant_id, t, v))
    return ProofRow(invariant_id, ALL_N, tuple(outcomes))


def cross_check(invariant_id: str, n: int, settings: ProveSettings) -> ProofRow:
    if invariant_id == DETERMINED_ID:
        outcomes = check_determined(
            n, settings.block_size, settings.timeout_s, settings.dropped, settings.variant
        )
        return ProofRow(invariant_id, str(n), tuple(outcomes))
    if invariant_id == PROGRESS_ID:
        outcome = check_progress(n, settings.block_size, settings.timeout_s)
    else:
        outcome, _ = check_step(
            invariant_id, n, settings.block_size, settings.timeout_s, settings.variant
        )
    return ProofRow(invariant_id, str(n), (outcome,))


def prove(
    settings: ProveSettings,
    on_row: Callable[[ProofRow], None] | None = None,
    jobs: int = 1,
) -> list[ProofRow]:
    """Every selected invariant for all N, then its cross-checks; on_row sees each
    row, in that order. jobs > 1 runs the rows in that many processes."""
    keys = [
        (invariant_id, n) for invariant_id in settings.only for n in _row_ns(invariant_id, settings)
    ]
    rows: list[ProofRow] = []
    for key, row in zip(keys, _rows(keys, settings, jobs), strict=True):
        if (
            row.verdict == "counterexample"
            and row.failure is not None
            and row.failure.model is None
        ):
            # A worker process cannot send a Z3 model back: find it again here.
            row = make_row(*key, settings)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def make_row(invariant_id: str, n: str, settings: ProveSettings) -> ProofRow:
    if n == ALL_N:
        return prove_for_all_n(invariant_id, settings)
    return cross_check(invariant_id, int(n), settings)


def _row_ns(invariant_id: str, settings: ProveSettings) -> list[str]:
    ns = [] if invariant_id == ORDER_ID else [ALL_N]
    max_n = settings.determined_max_n if invariant_id == DETERMINED_ID else settings.max_n
    return ns + [str(n) for n in range(1, max_n + 1)]


def _rows(
    keys: Sequence[tuple[str, str]], settings: ProveSettings, jobs: int
) -> Iterator[ProofRow]:
    if jobs <= 1:
        return (make_row(invariant_id, n, settings) for invariant_id, n in keys)
    return _in_processes(keys, settings, jobs)


def _in_processes(
    keys: Sequence[tuple[str, str]], settings: ProveSettings, jobs: int
) -> Iterator[ProofRow]:
    """The rows from a process pool, in table order. The largest cross-checks
    are submitted first: a long query left to the end would run alone."""
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        by_cost = sorted(keys, key=lambda key: -int(key[1]) if key[1] != ALL_N else 0)
        futures = {key: pool.submit(_portable_row, settings, *key) for key in by_cost}
        for key in keys:
            yield futures[key].result()


def _portable_row(settings: ProveSettings, invariant_id: str, n: str) -> ProofRow:
    """make_row in a worker process, without the Z3 models (they do not pickle)."""
    row = make_row(invariant_id, n, settings)
    return ProofRow(row.invariant, row.n, tuple(replace(o, model=None) for o in row.outcomes))


def disagreements(rows: Sequence[ProofRow]) -> list[str]:
    """Invariants whose cross-checks contradict the proof for all N (a bug in the model)."""
    found = []
    for invariant_id in dict.fromkeys(r.invariant for r in rows):
        mine = [r for r in rows if r.invariant == invariant_id]
        general = [r for r in mine if r.n == ALL_N]
        proved = bool(general) and general[0].verdict == "proved"
        if proved and any(_contradicts(r) for r in mine if r.n != ALL_N):
            found.append(invariant_id)
    return found


def _contradicts(row: ProofRow) -> bool:
    """A cross-check that refutes what the proof for all N claims. DETERMINED's proof
    for all N is about the profile alone (its last query, two decisions agree); its
    other query, that the step passes the profile, fails on a broken step by design."""
    if row.invariant == DETERMINED_ID:
        return row.outcomes[-1].verdict == "counterexample"
    return row.verdict == "counterexample"
