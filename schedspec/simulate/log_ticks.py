"""Tick labels a reader can read a value off, on a base-10 log axis of any span.

matplotlib's default log locator labels only powers of ten, so data inside one
decade (a TPOT of 4.3 to 4.9 ms) gets no label at all and data over one or two
decades gets one. ReadableLogLocator picks the sparsest of three ladders that
puts at least MIN_LABELS ticks in view: powers of ten, then 1-2-5 per decade,
then plain evenly stepped values (4.4, 4.6, 4.8) for spans under a decade.
The ladders are built here rather than by LogLocator, whose own linear fallback
applies only when at most one tick is in view.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from matplotlib.axis import Axis
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

MIN_LABELS = 3  # fewer labelled values than this and a reader cannot interpolate
LOG_LADDERS = ((1.0,), (1.0, 2.0, 5.0))  # multipliers of each power of ten
MAX_DECADE_LABELS = 8  # over more decades than this, label every k-th power of ten
# The fallback for narrow spans: about four nice values, at steps of 1, 2, 2.5 or 5
# times a power of ten; min_n_ticks counts those inside the view, and makes the
# step finer until MIN_LABELS fit.
EVEN_STEPS = MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10], min_n_ticks=MIN_LABELS)
LABEL_TOLERANCE = 1e-6  # relative: a tick this close to a shorter decimal prints as it


def _in_view(ticks: Iterable[float], low: float, high: float) -> list[float]:
    return [float(t) for t in ticks if low <= t <= high]


def log_ladder(low: float, high: float, subs: tuple[float, ...]) -> list[float]:
    """Each multiplier in subs of each power of ten, within [low, high] (0 < low);
    powers of ten alone are thinned to every k-th one, k the smallest that leaves
    at most MAX_DECADE_LABELS (multiples of k, so panels of one figure agree)."""
    first, last = math.floor(math.log10(low)), math.floor(math.log10(high))
    stride = math.ceil((last - first + 1) / MAX_DECADE_LABELS) if subs == (1.0,) else 1
    exponents = [e for e in range(first, last + 1) if e % stride == 0]
    return _in_view((m * 10.0**e for e in exponents for m in subs), low, high)


class ReadableLogLocator(LogLocator):
    """Major ticks of a base-10 log axis with at least MIN_LABELS inside the view
    (a log axis holds positive values only; see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(base=10.0)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        low, high = sorted((vmin, vmax))
        if low <= 0:  # no view yet: matplotlib's own handling of a bare log axis
            return super().tick_values(vmin, vmax)
        for subs in LOG_LADDERS:
            ticks = log_ladder(low, high, subs)
            if len(ticks) >= MIN_LABELS:
                return ticks
        return _in_view(EVEN_STEPS.tick_values(low, high), low, high)


def tick_label(value: float) -> str:
    """A tick as the shortest plain decimal within LABEL_TOLERANCE of it:
    4.3999999999999995 -> '4.4', 10000.0 -> '10000', 0.25 -> '0.25'."""
    for decimals in range(16):
        if math.isclose(round(value, decimals), value, rel_tol=LABEL_TOLERANCE):
            return f"{value:.{decimals}f}"
    return f"{value:g}"  # below 1e-15: no plain decimal is short


def use_readable_log_ticks(axis: Axis) -> None:
    """Label axis (already log-scaled) with ReadableLogLocator's ticks; minor
    ticks keep their marks and lose their labels."""
    axis.set_major_locator(ReadableLogLocator())
    axis.set_major_formatter(FuncFormatter(lambda value, _: tick_label(value)))
    axis.set_minor_formatter(NullFormatter())
