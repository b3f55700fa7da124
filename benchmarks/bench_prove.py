"""Proof time per invariant against N: the monolithic query vs the proof for every N.

    python benchmarks/bench_prove.py [--timeout 60] [--only BUDGET ...] [--sizes 1,2,4,8,16,32]

For each invariant: seconds of the one-query-per-N check at each N (it stops
growing N after the first query that times out), the growth rate between
consecutive sizes (t(N2) / t(N1)), and the seconds of the parametric proof,
which covers every N at once. All figures come from this one run.
"""

from __future__ import annotations

import argparse
import time
from itertools import pairwise

from schedspec.spec.formal.prover import (
    ALL_IDS,
    ProveSettings,
    cross_check,
    prove_for_all_n,
)

SIZES = (1, 2, 4, 8, 16, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per query")
    parser.add_argument("--only", action="append", choices=ALL_IDS, help="invariant (repeat)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="N values")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    settings = ProveSettings(max_n=0, timeout_s=args.timeout)
    ids = args.only or list(ALL_IDS)
    head = f"{'invariant':<24} {'all N':>8} " + " ".join(f"{'N=' + str(n):>9}" for n in sizes)
    print(head)
    started = time.perf_counter()
    for invariant_id in ids:
        general = (
            "-"
            if invariant_id == "ORDER"
            else f"{prove_for_all_n(invariant_id, settings).seconds:8.3f}"
        )
        times: list[float | None] = []
        for n in sizes:
            if times and times[-1] is None:
                times.append(None)
                continue
            row = cross_check(invariant_id, n, settings)
            times.append(row.seconds if row.verdict == "proved" else None)
        cells = " ".join(
            f"{t:9.3f}" if t is not None else f"{'>' + str(int(args.timeout)) + 's':>9}"
            for t in times
        )
        print(f"{invariant_id:<24} {general:>8} {cells}", flush=True)
        growth = [f"x{b / a:.1f}" if a and b else "-" for a, b in pairwise(times)]
        print(f"{'  growth N->next':<24} {'':>8} {'':>9} " + " ".join(f"{g:>9}" for g in growth))
    print(f"total {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
