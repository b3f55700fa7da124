"""Bounded integers taken straight from Hypothesis' choice sequence, for the hot draws.

The state machine draws a few packed integers for every action it takes, and a
checked step costs about as much as two or three such draws. `draw(st.integers(a, b))`
spends as much again on its bookkeeping (validating the strategy, a span of its own
around the one choice) as on the choice, which is one call of the ConjectureData
the composite's `draw` is bound to. `IntegerChoice.take` makes that call with the
constraints integers() itself passes (learnt once, from the strategy), so the same
choices are drawn and the same examples follow (the corner and mutant figures measured
on them hold). What changes is the spans: none around each of these integers. Shrinking
works on the same choice sequence; but once a Hypothesis run has had ten valid
examples it also mutates them span by span, so a run of more than ten (not the suite's
bursts of ten: suite.EXAMPLES_PER_BURST) draws other examples after its tenth.

ConjectureData.draw_integer is not Hypothesis' public API. Where a `draw` is not
bound to one (another Hypothesis, a test's own draw function), or the strategy's
constraints cannot be learnt, `take` draws the integers() strategy itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

RawDraw = Callable[..., int]
# IntegerChoice's constraints before its first take.
_UNLEARNT: Any = object()


class _ConstraintsProbe:
    """Stands in for a ConjectureData while a strategy draws from it, to learn the
    arguments it draws its one integer with."""

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def draw(self, strategy: Any, *_: Any, **__: Any) -> Any:
        return strategy.do_draw(self)

    def draw_integer(self, *args: Any, **kwargs: Any) -> int:
        self.seen.append((args, kwargs))
        return 0


def integer_constraints(
    strategy: st.SearchStrategy[Any],
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The arguments `strategy` passes to ConjectureData.draw_integer, if it draws one
    integer and nothing else; None where that cannot be learnt."""
    probe = _ConstraintsProbe()
    try:
        strategy.do_draw(probe)  # type: ignore[arg-type]
    except Exception:  # another Hypothesis' internals: draw through the strategy
        return None
    return probe.seen[0] if len(probe.seen) == 1 else None


@dataclass(frozen=True)
class IntegerChoice:
    """A choice of an integer from 0 to size - 1, drawn as st.integers(0, size - 1) draws it."""

    size: int
    strategy: st.SearchStrategy[int] = field(init=False, repr=False, compare=False)
    # Learnt on the first take, not when built: the choices are built as schedspec's
    # strategies are imported (by the pytest plugin too, at every pytest start), and
    # Hypothesis warns that evaluating a strategy there slows every session.
    _constraints: Any = field(init=False, repr=False, compare=False, default=_UNLEARNT)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"IntegerChoice size must be >= 1, got {self.size}")
        object.__setattr__(self, "strategy", st.integers(0, self.size - 1))

    @property
    def constraints(self) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The arguments integers() passes to draw_integer; None: they cannot be learnt."""
        if self._constraints is _UNLEARNT:
            object.__setattr__(self, "_constraints", integer_constraints(self.strategy))
        return self._constraints  # type: ignore[no-any-return]

    def take(self, draw: st.DrawFn, raw: RawDraw | None) -> int:
        """The next choice, through `raw` (raw_draw(draw)) where there is one."""
        constraints = self._constraints
        if constraints is _UNLEARNT:
            constraints = self.constraints
        if raw is None or constraints is None:
            return draw(self.strategy)
        args, kwargs = constraints
        return raw(*args, **kwargs)


def raw_draw(draw: st.DrawFn) -> RawDraw | None:
    """The integer draw of the ConjectureData `draw` is bound to, or None."""
    raw = getattr(getattr(draw, "__self__", None), "draw_integer", None)
    return raw if callable(raw) else None
