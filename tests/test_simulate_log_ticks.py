"""Log axes label enough values to read a number off, whatever span the data has
(the latency CDFs that use them: tests/test_simulate_plots.py)."""

from __future__ import annotations

import pytest

from schedspec.simulate.log_ticks import ReadableLogLocator, log_ladder, tick_label


@pytest.mark.parametrize(
    ("low", "high", "labels"),
    [
        (5.0, 20000.0, ["10", "100", "1000", "10000"]),  # several decades: powers of ten
        (8.0, 250.0, ["10", "20", "50", "100", "200"]),  # under two and a half: 1-2-5
        (4.0, 40.0, ["5", "10", "20"]),  # one decade, off the powers of ten
        (1.5, 9.5, ["2", "4", "6", "8"]),  # 1-2-5 gives only 2 and 5: even steps
        (4.3, 4.9, ["4.4", "4.6", "4.8"]),  # inside a decade, no 1-2-5 value at all
        # Steps of 0.2 leave only 4.8 and 5 in view: finer ones are taken.
        (4.63, 5.06, ["4.7", "4.8", "4.9", "5"]),
        (4.6012, 4.6018, ["4.6012", "4.6014", "4.6016", "4.6018"]),
        (0.001, 0.0014, ["0.001", "0.0011", "0.0012", "0.0013"]),
        # Thirteen decades: every second power of ten (0.001 has an odd exponent).
        (0.001, 1e9, ["0.01", "1", "100", "10000", "1000000", "100000000"]),
    ],
)
def test_locator_labels_at_least_three_values_in_view(
    low: float, high: float, labels: list[str]
) -> None:
    ticks = ReadableLogLocator().tick_values(low, high)
    assert [tick_label(t) for t in ticks] == labels
    assert all(low <= t <= high for t in ticks)


def test_log_ladder_keeps_each_multiplier_of_each_decade_in_view() -> None:
    assert log_ladder(3.0, 600.0, (1.0, 2.0, 5.0)) == [5, 10, 20, 50, 100, 200, 500]
    assert log_ladder(3.0, 600.0, (1.0,)) == [10, 100]


@pytest.mark.parametrize(
    ("value", "label"),
    [(4.3999999999999995, "4.4"), (10000.0, "10000"), (0.25, "0.25"), (2.0, "2"), (1e-20, "1e-20")],
)
def test_tick_label_is_the_shortest_decimal(value: float, label: str) -> None:
    assert tick_label(value) == label
