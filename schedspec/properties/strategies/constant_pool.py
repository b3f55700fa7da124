"""Seeds that draw the same examples wherever schedspec runs: Hypothesis' pool of local
constants, emptied while the suite draws.

Hypothesis (since 6.131) now and then, about one draw in twenty, returns a constant
instead of drawing: one from its own fixed list, or one of the literals it collected
from the source of every loaded module it takes for the user's code (not the standard
library, not site-packages, not a test file). So what a seed drew depended on things
that have nothing to do with the seed:
- how schedspec was installed: an editable checkout's literals are in that pool, a
  `pip install`'s are not (site-packages);
- which modules happened to be loaded: a pytest run that had imported the vLLM
  adapter, a command that had not; an engine of the user's whose source gained a
  literal;
- the order of tests in one process, and so which worker pytest-xdist gave them to.

Inside `local_constants_pinned()` the pool is empty, so a seed's examples depend on the
seed, the settings and the Hypothesis version alone. Hypothesis' own constants stay
(they are part of its version).

The pool is not Hypothesis' public API (hypothesis.internal.conjecture.providers:
`_get_local_constants`, read once per test case, and `CONSTANTS_CACHE`, which keeps the
constants each set of draw arguments permits). Where a Hypothesis lacks either, the
context changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis.internal.conjecture import providers as _providers

# Hypothesis' internals, typed loosely: none of this is its public API.
providers: Any = _providers
_lock = threading.Lock()
_depth = 0
_saved: Callable[[], Any] | None = None


def pinnable() -> bool:
    """Does this Hypothesis keep a pool of local constants that can be pinned?"""
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    return (
        callable(getattr(providers, "_get_local_constants", None))
        and callable(getattr(providers, "Constants", None))
        and isinstance(getattr(cache, "cache", None), dict)
    )


def _clear_permitted_cache() -> None:
    # Each set of draw arguments' permitted constants is cached with the local pool's
    # part in it: cleared on the way in and out, none of one side's leaks to the other.
    providers.CONSTANTS_CACHE.cache.clear()


@contextmanager
def local_constants_pinned() -> Iterator[None]:
    """Hypothesis draws with an empty pool of local constants for the duration (nested
    uses share one pin; the pool comes back as it was when the outermost one ends)."""
    global _depth, _saved
    if not pinnable():
        yield
        return
    with _lock:
        if _depth == 0:
            empty = providers.Constants()
            _saved = providers._get_local_constants
            providers._get_local_constants = lambda: empty
            _clear_permitted_cache()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                providers._get_local_constants = _saved
                _saved = None
                _clear_permitted_cache()
