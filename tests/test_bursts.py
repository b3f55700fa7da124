"""Bursts: a chunk runs as Hypothesis runs of EXAMPLES_PER_BURST examples, on seeds that
nearby runs do not share, so that each example draws a config of its own."""

from __future__ import annotations

from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.properties.strategies.configs import configs
from schedspec.properties.suite import (
    EXAMPLES_PER_BURST,
    Chunk,
    SuiteSettings,
    burst_seeds,
    even_split,
    run_suite,
)
from schedspec.spec import SchedulerConfig


def test_burst_seeds_worked_example() -> None:
    bursts = burst_seeds(Chunk(0, 7, 25))
    # 25 examples in bursts of at most 10: three, as even as they can be.
    assert [examples for _, examples in bursts] == [9, 8, 8]
    assert bursts[0][0] == 7  # the first on the chunk's own seed
    assert len({seed for seed, _ in bursts}) == 3
    assert burst_seeds(Chunk(0, 7, 25)) == bursts  # the same seeds every time
    assert burst_seeds(Chunk(3, 7, 10)) == [(7, 10)]  # one burst: the plain run of its seed
    assert EXAMPLES_PER_BURST == 10


def test_nearby_chunks_share_no_burst() -> None:
    # Chunk i of a series runs seed + i: the runs of seeds 7 and 8 must still differ.
    seeds_of = [{seed for seed, _ in burst_seeds(Chunk(0, s, 100))} for s in (7, 8)]
    assert len(seeds_of[0]) == len(seeds_of[1]) == 10
    assert not seeds_of[0] & seeds_of[1]


def test_even_split() -> None:
    assert even_split(100, 10) == [10] * 10
    assert even_split(7, 3) == [3, 2, 2]
    assert sum(even_split(1001, 101)) == 1001


def test_a_run_draws_a_config_for_nearly_every_example() -> None:
    """One Hypothesis run of 100 examples drew 27 distinct configs (seed 3, measured):
    it mutates what it found, and a mutation keeps the config. In bursts, 85."""
    drawn: list[SchedulerConfig] = []

    def record(config: SchedulerConfig) -> SchedulerConfig:
        drawn.append(config)
        return config

    strategy: st.SearchStrategy[SchedulerConfig] = configs().map(record)
    settings = SuiteSettings(examples=40, seed=3, shrink=False)
    result = run_suite(reference_engine, "vllm-v1", settings, strategy)
    assert result.passed
    assert len(drawn) == result.examples == 40
    # The first two examples of each burst are Hypothesis' smallest (the simplest
    # continuation of a novel first choice), which may repeat a config.
    assert len(set(drawn)) >= 30
