"""The family profiles determine the step (issue 36, item 1), checked by probing: on every
state the reference reaches, each neighbouring decision breaks a decision invariant of
the profile. Two engines that both pass the profile on the same state therefore make
the same decision, as far as these neighbours reach.

Where Z3 cannot model the step (the sglang profile's radix tree and float ratio; async
vllm-v1's outputs in flight), this property stands in for `schedspec prove --only
DETERMINED` (docs/FORMAL.md, "Determined by probing"). The neighbours of a step:
- one admission fewer (its last);
- the last admission's extend one token shorter, or one longer;
- one running request left out of the step.
The decision invariants are the family profile's schedule-time ones and the safety
ones that judge the output against the pre state alone (BUDGET, NO-OVERSHOOT,
NO-EMPTY-STEP): the neighbour keeps the real post state, so an invariant that compares
post with the output would fire for that mismatch, not for the decision.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st

from schedspec.properties.strategies.configs import configs, sglang_configs
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import (
    CATALOGUE,
    CHECKS,
    FAMILY_PROFILES,
    ScheduleTransition,
    ids_for,
)
from tests.invariant_builders import Driver, tokens, with_output, with_scheduled

# Safety invariants that read only the pre state and the output.
DECISION_SAFETY = ("BUDGET", "NO-OVERSHOOT", "NO-EMPTY-STEP")


def decision_ids(config: SchedulerConfig) -> list[str]:
    profile = FAMILY_PROFILES[config.family]
    return [
        i
        for i in ids_for("schedule", profile)
        if CATALOGUE[i].profile != "safety" or i in DECISION_SAFETY
    ]


def without(t: ScheduleTransition, request_id: str) -> ScheduleTransition:
    """The step with request_id left out of it (and out of the new and cached lists)."""
    scheduled = {r: n for r, n in t.output.num_scheduled_tokens.items() if r != request_id}
    return with_output(
        with_scheduled(t, scheduled),
        scheduled_new_reqs=[d for d in t.output.scheduled_new_reqs if d.request_id != request_id],
        scheduled_cached_reqs=[
            d for d in t.output.scheduled_cached_reqs if d.request_id != request_id
        ],
    )


def neighbours(t: ScheduleTransition) -> Iterator[tuple[str, ScheduleTransition]]:
    scheduled = t.output.num_scheduled_tokens
    admitted = [r for r in scheduled if r in t.admitted_ids]
    if admitted:
        last = admitted[-1]
        yield f"admit {admitted[:-1]} without {last!r}", without(t, last)
        for delta in (-1, 1):
            if scheduled[last] + delta > 0:
                longer = {**scheduled, last: scheduled[last] + delta}
                yield f"{last!r}'s extend {delta:+d}", with_scheduled(t, longer)
    running = [r for r in scheduled if r not in t.admitted_ids]
    if running:
        yield f"leave {running[0]!r} out", without(t, running[0])


def drive(config: SchedulerConfig, seed: int, num_steps: int) -> Iterator[ScheduleTransition]:
    """The reference under a seeded workload: arrivals with shared prefixes, outputs
    landing one step late about half the time under async scheduling."""
    rng = random.Random(seed)
    driver = Driver(**dataclasses.asdict(config))
    shared = tokens(7, config.max_model_len)
    in_flight: list[ScheduleTransition] = []
    arrivals = 0
    for _ in range(num_steps):
        while rng.random() < 0.4 and arrivals < 12:
            length = rng.randint(1, max(1, config.max_model_len // 2))
            common = rng.choice((0, 0, length // 2, length))
            own = tokens(1000 * (arrivals + 2), length - common)
            prompt = [*shared[:common], *own]
            driver.add(f"r{arrivals}", prompt=prompt, max_tokens=rng.randint(1, 16))
            arrivals += 1
        t = driver.schedule()
        yield t
        in_flight.append(t)
        if not config.async_scheduling or len(in_flight) == 2 or rng.random() < 0.5:
            driver.update(in_flight.pop(0))
    while in_flight:
        driver.update(in_flight.pop(0))


def assert_determined(config: SchedulerConfig, seed: int) -> None:
    ids = decision_ids(config)
    for t in drive(config, seed, num_steps=30):
        assert not [i for i in ids if CHECKS[i](t)], "the reference breaks its own profile"
        for name, neighbour in neighbours(t):
            fired = [i for i in ids if CHECKS[i](neighbour)]
            assert fired, f"the profile also allows: {name} (config {config}, seed {seed})"


@given(
    config=sglang_configs(max_model_len_cap=48),
    seed=st.integers(0, 2**16),
)
def test_the_sglang_profile_determines_the_step(config: SchedulerConfig, seed: int) -> None:
    assert_determined(config, seed)


@given(
    config=configs(max_model_len_cap=48, async_scheduling=True).map(
        lambda c: dataclasses.replace(
            c, num_speculative_tokens=0, num_lookahead_tokens=None, pad_spec_decode=False
        )
    ),
    seed=st.integers(0, 2**16),
)
def test_async_vllm_v1_profile_determines_the_step(config: SchedulerConfig, seed: int) -> None:
    assert_determined(config, seed)


def test_a_neighbour_the_profile_allows_is_reported() -> None:
    """The probe has teeth: with SG-ADMISSION-STOP taken out, an admission fewer passes."""
    config = SchedulerConfig(
        family="sglang",
        block_size=1,
        num_blocks=64,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=48,
    )
    driver = Driver(**dataclasses.asdict(config))
    driver.add("a", 6, max_tokens=2)
    driver.add("b", 6, max_tokens=2)
    t = driver.schedule()
    assert list(t.output.num_scheduled_tokens) == ["a", "b"]
    fewer = without(t, "b")
    fired = [i for i in decision_ids(config) if CHECKS[i](fewer)]
    assert fired == ["SG-ADMISSION-STOP"]
