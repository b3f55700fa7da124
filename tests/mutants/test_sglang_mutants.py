"""The SGLang family's seeded bugs (sglang_catalogue.py) under the `sglang` CI profile:
each must be caught, by an invariant it names, on a counterexample the real reference
replays cleanly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.mutants.mutation import REFERENCE_DIR, Mutant, mutated_source
from tests.mutants.sglang_catalogue import SGLANG_MUTANTS
from tests.mutants.test_mutants import _param, assert_caught


def test_at_least_eight_sglang_mutants() -> None:
    assert len(SGLANG_MUTANTS) >= 8
    assert all(m.family == "sglang" for m in SGLANG_MUTANTS)


@pytest.mark.parametrize("mutant", SGLANG_MUTANTS, ids=[m.id for m in SGLANG_MUTANTS])
def test_snippets_match_the_sglang_family_exactly_once(mutant: Mutant) -> None:
    assert mutated_source(mutant) != (REFERENCE_DIR / mutant.file).read_text()


@pytest.fixture(scope="session")
def sglang_mutant_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sglang-mutants")


@pytest.mark.parametrize("mutant", [_param(m) for m in SGLANG_MUTANTS])
def test_sglang_mutant_is_caught(
    mutant: Mutant, sglang_mutant_root: Path, record_property: Callable[[str, object], None]
) -> None:
    assert_caught(mutant, sglang_mutant_root, record_property)
