"""raw_choices: the state machine's hot draws, taken straight from the choice sequence,
draw exactly what st.integers() draws from the same choices."""

from __future__ import annotations

from typing import Any, cast

import hypothesis
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from schedspec.properties.strategies import raw_choices
from schedspec.properties.strategies.raw_choices import IntegerChoice, integer_constraints, raw_draw

# Narrow and wide ranges: integers() weights the ends of a range wider than 127.
CHOICES = (IntegerChoice(1), IntegerChoice(60), IntegerChoice(128), IntegerChoice(12288))


def drawn(use_raw: bool, seed: int) -> tuple[list[list[int]], int]:
    """Every example's values of CHOICES under one seed, and how many draws took the raw path."""
    examples: list[list[int]] = []
    raw_draws = 0

    @st.composite
    def values(draw: st.DrawFn) -> list[int]:
        nonlocal raw_draws
        raw = raw_draw(draw) if use_raw else None
        raw_draws += len(CHOICES) if raw is not None else 0
        return [choice.take(draw, raw) for choice in CHOICES]

    @hypothesis.seed(seed)
    @settings(max_examples=10, database=None, phases=[Phase.generate], deadline=None)
    @given(values())
    def record(example: list[int]) -> None:
        examples.append(example)

    record()
    return examples, raw_draws


# Ten examples: a run of the suite is bursts of ten (suite.EXAMPLES_PER_BURST), and
# after its tenth example Hypothesis starts mutating examples by their spans, of which
# the raw path makes fewer, so that later examples may differ.
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_raw_path_draws_what_integers_draws_from_the_same_choices(seed: int) -> None:
    fast, raw_draws = drawn(True, seed)
    slow, none = drawn(False, seed)
    assert raw_draws > 0 and none == 0  # the fast path was taken (this Hypothesis has one)
    assert fast == slow
    # and the draws range over their choices (the wide ones beyond their weighted ends)
    assert all(0 <= v < c.size for example in fast for v, c in zip(example, CHOICES, strict=True))
    assert len({example[3] for example in fast}) > 5


def test_the_constraints_are_learnt_from_integers_itself() -> None:
    narrow, wide = integer_constraints(st.integers(0, 59)), integer_constraints(st.integers(0, 999))
    assert narrow is not None and wide is not None
    assert narrow[1]["min_value"] == 0 and narrow[1]["max_value"] == 59
    assert narrow[1].get("weights") is None
    weights = wide[1]["weights"]
    assert weights is not None and set(weights) == {0, 1, 998, 999}  # the ends, weighted


def test_a_strategy_that_draws_other_than_one_integer_is_not_learnt() -> None:
    assert integer_constraints(st.tuples(st.integers(0, 3), st.integers(0, 3))) is None
    assert integer_constraints(st.booleans()) is None


def test_a_draw_function_bound_to_no_conjecture_data_draws_through_the_strategy() -> None:
    calls: list[object] = []

    def plain_draw(strategy: object) -> int:
        calls.append(strategy)
        return 5

    draw = cast(st.DrawFn, plain_draw)
    assert raw_draw(draw) is None
    choice = IntegerChoice(60)
    assert choice.take(draw, raw_draw(draw)) == 5
    assert calls == [choice.strategy]


def test_a_choice_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        IntegerChoice(0)


def test_constraints_are_learnt_at_the_first_take_not_when_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Built at import (the pytest plugin imports the strategies at every pytest start),
    a choice evaluates no strategy: Hypothesis warns that doing so slows every session."""
    learnt: list[st.SearchStrategy[Any]] = []

    def learn(strategy: st.SearchStrategy[Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        learnt.append(strategy)
        return integer_constraints(strategy)

    monkeypatch.setattr(raw_choices, "integer_constraints", learn)
    choice = IntegerChoice(7)
    assert learnt == []
    assert choice.take(lambda strategy: 3, None) == 3  # type: ignore[arg-type]
    assert choice.take(lambda strategy: 3, None) == 3  # type: ignore[arg-type]
    assert learnt == [choice.strategy]  # once
