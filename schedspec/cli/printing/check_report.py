"""The table and totals that end `schedspec check` and `schedspec diff`.

One row per invariant of the profile that applies to the configs drawn (its kind, the
smallest profile that includes it, how often it was checked, whether it failed), then one line of
totals. The counts cover every example run, shrinking's included, so the
totals say how many examples that was and, after a failure, in which example
the search first met it.
"""

from __future__ import annotations

from collections.abc import Iterable

from schedspec.properties.checked_engine import CATALOGUE_KINDS, CheckStats
from schedspec.properties.suite import SuiteResult
from schedspec.spec.invariants import CATALOGUE, PROFILES, InvariantInfo, Profile, in_profile


def invariants_of(profile: Profile) -> list[InvariantInfo]:
    """The profile's invariants: safety first, then policy; within each, in the order
    an engine meets them."""
    return sorted(
        (i for i in CATALOGUE.values() if in_profile(i, profile)),
        key=lambda i: (PROFILES.index(i.profile), CATALOGUE_KINDS.index(i.kind)),
    )


def format_table(stats: CheckStats, profile: Profile, failing: Iterable[str]) -> list[str]:
    """One row per invariant of the profile that applies to the configs the run drew (a
    check of hybrid KV cache groups is no row of a run without them, nor a check of the
    single group's table arithmetic of a run on hybrid configs only): its kind, profile,
    checks made and failures."""
    failed = set(failing)
    seen = stats.hybrid_seen
    infos = [i for i in invariants_of(profile) if any(i.applies_to(h) for h in seen)]
    width = max(len("invariant"), *(len(i.id) for i in infos))
    lines = [f"{'invariant':<{width}}  {'kind':<8}  {'profile':<7}  {'checked':>9}  failures"]
    for info in infos:
        lines.append(
            f"{info.id:<{width}}  {info.kind:<8}  {info.profile:<7}  "
            f"{stats.checks.get(info.id, 0):>9}  {int(info.id in failed):>8}"
        )
    return lines


def format_examples(result: SuiteResult) -> str:
    """`21`, or after a failure `343 (the first failure in example 4, then shrinking)`.

    Hypothesis stops searching after the number of examples asked for that it
    kept (it draws a few more that outgrow its choice budget and drops them),
    and shrinking a failure runs many more: all of them were run and checked.
    """
    text = str(result.examples)
    if result.first_failure_example is not None:
        text += f" (the first failure in example {result.first_failure_example}, then shrinking)"
    return text


def format_totals(result: SuiteResult) -> str:
    stats, seconds = result.stats, result.seconds
    rate = stats.steps / seconds if seconds > 0 else 0.0
    return (
        f"examples: {format_examples(result)}  steps checked: {stats.steps}  "
        f"events: {stats.events}  time: {seconds:.1f} s  steps/s: {rate:.0f}"
    )
