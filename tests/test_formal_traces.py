"""Z3 counterexamples of the broken variants, as traces: each one fails the reference
mutant that makes the same mistake, and passes the real reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.properties.checked_engine import InvariantViolationError, replay
from schedspec.spec.formal.bmc import search
from schedspec.spec.formal.variants import BREAKS, Bug, Variant
from schedspec.traces.formal_traces import reached_config, to_trace
from schedspec.traces.trace import Trace
from tests.mutants.catalogue import MUTANTS
from tests.mutants.mutation import build_mutant_package, engine_factory

TRACES = Path(__file__).parent / "formal_traces"

BY_ID = {m.id: m for m in MUTANTS}


@pytest.fixture(scope="module")
def mutant_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("formal-mutants")


def test_every_proof_has_a_saved_trace_and_every_variant_a_mutant() -> None:
    assert sorted(p.stem for p in TRACES.glob("*.json")) == sorted(BREAKS)
    assert [bug.mutant for bug in Bug if bug.mutant not in BY_ID] == []


def _fails_on_mutant(trace: Trace, mutant_id: str, root: Path) -> set[str]:
    mutant = BY_ID[mutant_id]
    factory = engine_factory(build_mutant_package(mutant, root / mutant_id))
    with pytest.raises(InvariantViolationError) as caught:
        replay(trace, factory, "vllm-v1")
    found = {v.invariant for v in caught.value.violations}
    assert found & mutant.caught_by, f"{mutant_id} broke {found}, expected {mutant.caught_by}"
    return found


@pytest.mark.parametrize("invariant_id", sorted(BREAKS))
def test_saved_trace_fails_its_mutant_and_passes_the_reference(
    invariant_id: str, mutant_root: Path
) -> None:
    trace = Trace.load(TRACES / f"{invariant_id}.json")
    assert invariant_id in trace.note
    replay(trace, reference_engine, "vllm-v1")
    _fails_on_mutant(trace, BREAKS[invariant_id].mutant, mutant_root)


def test_a_fresh_search_gives_a_trace_the_mutant_fails(mutant_root: Path) -> None:
    reached = search("SEQS", Variant(BREAKS["SEQS"]), timeout_s=60)
    assert reached is not None
    trace = to_trace(reached)
    assert trace.config == reached_config(reached)
    assert len(reached.prompt_lengths) == 3 and len(reached.steps) == 2
    replay(trace, reference_engine, "vllm-v1")
    assert "SEQS" in _fails_on_mutant(trace, "max-num-seqs-off-by-one", mutant_root / "fresh")


def test_the_faithful_model_reaches_no_violation() -> None:
    """The search is not vacuous the other way: with the reference's rules, none is found."""
    assert search("SEQS", Variant(), steps=(2,), timeout_s=60) is None
