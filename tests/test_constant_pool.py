"""A seed draws the same examples whatever local source is loaded (strategies/constant_pool.py)."""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hypothesis
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from schedspec.adapters.reference import reference_engine
from schedspec.properties.strategies.constant_pool import local_constants_pinned, pinnable
from schedspec.properties.suite import SuiteSettings, run_suite

# Literals a user's module might hold, each inside the range the draws below take.
USERS_LITERALS = (4099, 7001, 12001, 16411, 19997)
USERS_SOURCE = f"LIMITS = {USERS_LITERALS}\n"

pytestmark = pytest.mark.skipif(not pinnable(), reason="this Hypothesis keeps no local pool")


@contextmanager
def users_module(directory: Path, name: str, source: str) -> Iterator[None]:
    """A local module (outside site-packages and the standard library, not a test file)
    with literals of its own, loaded for the duration. Hypothesis' pool only ever grows:
    it is put back as it was after, so that no later test draws the module's literals."""
    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    saved = (
        copy.deepcopy(providers._local_constants),
        set(providers._seen_modules),
        providers._sys_modules_len,
    )
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    # Hypothesis looks for new modules only when sys.modules changes length: forget the
    # length it saw, or a module loaded after another was removed would go unseen.
    providers._sys_modules_len = None
    try:
        spec.loader.exec_module(module)
        yield
    finally:
        del sys.modules[name]
        providers._local_constants, providers._seen_modules, providers._sys_modules_len = saved
        providers.CONSTANTS_CACHE.cache.clear()


def seeded_draws(seed: int) -> list[int]:
    """The integers Hypothesis draws on `seed` over five examples of a list of a hundred
    (its first example is the simplest, all zeros)."""
    drawn: list[int] = []

    @hypothesis.seed(seed)
    @settings(max_examples=5, database=None, phases=[Phase.generate], deadline=None)
    @given(st.lists(st.integers(0, 20_000), min_size=100, max_size=100))
    def draw(values: list[int]) -> None:
        drawn.extend(values)

    draw()
    assert len(set(drawn)) > 100  # random draws, not only the simplest example
    return drawn


def test_pinned_pool_is_empty_and_comes_back() -> None:
    original = providers._get_local_constants
    with local_constants_pinned():
        assert len(providers._get_local_constants()) == 0
        with local_constants_pinned():  # nested: still pinned after the inner one
            pass
        assert len(providers._get_local_constants()) == 0
    assert providers._get_local_constants is original


def test_pool_is_restored_when_the_run_raises() -> None:
    original = providers._get_local_constants
    with pytest.raises(RuntimeError), local_constants_pinned():
        raise RuntimeError("the run failed")
    assert providers._get_local_constants is original


def test_a_hypothesis_without_the_pool_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another Hypothesis that keeps no permitted-constants cache: nothing is pinned."""
    monkeypatch.delattr(providers, "CONSTANTS_CACHE")
    original = providers._get_local_constants
    assert not pinnable()
    with local_constants_pinned():
        assert providers._get_local_constants is original


def test_pinned_draws_ignore_a_users_literals(tmp_path: Path) -> None:
    """The same seed draws the same integers under the pin before and after a module
    with literals in the draws' range is loaded; unpinned, its literals turn up among
    the draws (one draw in forty takes a local constant: the pin has work to do)."""
    with local_constants_pinned():
        before = seeded_draws(7)
    with users_module(tmp_path, "engine_tuning", USERS_SOURCE):
        assert set(USERS_LITERALS) <= providers._get_local_constants().integers
        with local_constants_pinned():
            pinned = seeded_draws(7)
        unpinned = seeded_draws(7)
    assert pinned == before
    assert not set(USERS_LITERALS) & set(pinned)
    assert set(USERS_LITERALS) & set(unpinned)
    assert not set(USERS_LITERALS) & set(providers._get_local_constants().integers)


def test_suite_examples_ignore_a_users_literals(tmp_path: Path) -> None:
    """run_suite pins the pool: the same seed checks the very same steps before and
    after a module with literals in its draws' ranges is loaded."""
    chosen = SuiteSettings(examples=10, rules_per_example=20, seed=11, shrink=False)
    before = run_suite(reference_engine, "vllm-v1", chosen)
    literals = "STEPS = (777, 1500, 3333, 9001)\nPICKS = (40001, 50003, 65521)\n"
    with users_module(tmp_path, "engine_limits", literals):
        assert 9001 in providers._get_local_constants().integers
        after = run_suite(reference_engine, "vllm-v1", chosen)
    assert before.passed and after.passed
    assert (after.stats.steps, after.stats.events) == (before.stats.steps, before.stats.events)
    assert after.stats.corners == before.stats.corners


def test_swarm_configs_are_drawn_with_the_pool_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swarm mode draws its configs in swarm_chunks.run_configs: each config is drawn
    (and its swarm run) while the pool is empty."""
    swarm_chunks = pytest.importorskip("schedspec.campaign.swarm_chunks")
    from schedspec.properties.strategies.configs import configs

    pools: list[int] = []

    def recorded(run: object, *_: object) -> object:
        pools.append(len(providers._get_local_constants()))
        return swarm_chunks.SwarmResult(run, 1, 1, 0.0)

    monkeypatch.setattr(swarm_chunks, "run_swarm", recorded)
    settings_ = swarm_chunks.SwarmSettings(1, 1, "cpu", "vllm-v1", 0.0)
    results = swarm_chunks.run_configs(configs(), 3, 5, settings_)
    assert len(results) == 3
    assert pools == [0, 0, 0]
    assert len(providers._get_local_constants()) > 0  # schedspec's own, outside the pin
