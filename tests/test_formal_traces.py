"""Z3 counterexamples of the broken variants, as traces: each one fails the reference
mutant that makes the same mistake, and passes the real reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedspec.properties.checked_engine import InvariantViolationError, replay
from schedspec.properties.formal_traces import reached_config, to_trace
from schedspec.properties.reference_adapter import reference_engine
from schedspec.properties.trace import Trace
from schedspec.spec.formal.bmc import search
from schedspec.spec.formal.variants import BREAKS, Bug, Variant
from tests.mutants.catalogue import MUTANTS
from tests.mutants.mutation import Mutant, build_mutant_package, engine_factory, mutant

TRACES = Path(__file__).parent / "formal_traces"

# The async scheduling mistakes the formal variants make, as reference mutants, until
# tests/mutants/catalogue.py takes them (then they go from here: the test below refuses
# an id defined twice).
ASYNC_MUTANTS: tuple[Mutant, ...] = (
    mutant(
        Bug.MAX_TOKENS_NOT_SKIPPED.mutant,
        "scheduler.py",
        "            if sure_to_reach_max_tokens(\n"
        "                computed,\n"
        "                request.num_output_placeholders,\n"
        "                request.num_prompt_tokens,\n"
        "                request.max_tokens,\n"
        "            ):\n"
        "                req_index += 1  # async: the step in flight is its last\n"
        "                continue\n",
        "",
        "Async: a request whose step in flight is sure to reach max_tokens is scheduled "
        "again (vLLM PR #27922).",
        {"MAX-TOKENS"},
    ),
    mutant(
        Bug.PLACEHOLDERS_WITHOUT_DRAFTS.mutant,
        "scheduler.py",
        "            request.num_output_placeholders += 1 + num_drafts\n",
        "            request.num_output_placeholders += 1\n",
        "Async: a sampling step adds one output placeholder, not 1 + its drafts.",
        {"SCHEDULE-PIPELINE", "PIPELINE"},
    ),
    mutant(
        Bug.PREEMPT_KEEPS_PLACEHOLDERS.mutant,
        "scheduler.py",
        "        request.num_output_placeholders = 0\n        request.num_preemptions += 1\n",
        "        request.num_preemptions += 1\n",
        "Async: _preempt leaves the output placeholders of the step in flight in place.",
        {"PIPELINE", "PREEMPT-RESET"},
    ),
    mutant(
        Bug.STALE_OUTPUT_ROLLS_BACK.mutant,
        "scheduler.py",
        "        if not stale and num_drafts:\n",
        "        if num_drafts:\n",
        "Async: the stale output of a preempted request rolls num_computed_tokens back over "
        "its rejected drafts, below the reset 0 (vLLM #41190).",
        {"ROLLBACK", "QUEUES"},
    ),
)
BY_ID = {m.id: m for m in (*MUTANTS, *ASYNC_MUTANTS)}


@pytest.fixture(scope="module")
def mutant_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("formal-mutants")


def test_every_proof_has_a_saved_trace_and_a_mutant() -> None:
    assert sorted(p.stem for p in TRACES.glob("*.json")) == sorted(BREAKS)
    assert all(bug.mutant in BY_ID for bug in BREAKS.values())


def test_async_mutants_are_defined_once() -> None:
    catalogue = {m.id for m in MUTANTS}
    assert [m.id for m in ASYNC_MUTANTS if m.id in catalogue] == []


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
