"""The gaps G4-G8 (docs/FINDINGS.md): vLLM's own hybrid KV cache rules that the reference
did not model, each replayed from its trace on the installed release. vLLM holds every
safety invariant on each; the reference parts from it where the gap stands. The day the
reference models a rule, its test fails: flip its entry in STANDS and move the regime
back into the default strategies. All five are closed: the reference models each rule,
and both engines agree on each trace (avoid_known_corners no longer turns prefix caching
off beside an aligned Mamba group, as it did for G7).

Needs vLLM (either supported release); skipped without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed")

from schedspec.adapters.reference import reference_engine
from schedspec.adapters.vllm.config import avoid_known_corners
from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.adapters.vllm.releases import SUPPORTED, current_release
from schedspec.properties.checked_engine import replay
from schedspec.properties.differential import (
    DiffOptions,
    DiffResult,
    diff_trace,
    failing_side,
)
from schedspec.traces.trace import Trace

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings"
STANDS: dict[str, dict[str, bool]] = {
    # Closed: the reference models Mamba's checkpoint stop (G4), counts a window at its
    # admission cap in the gate (G5), caches only the window blocks an aligned hit can
    # reach (G6) and stops Mamba's chunk at the shared-prefix junction (G7).
    "G4": {"0.33.0": False, "0.34.0": False},  # Mamba: the checkpoint stop
    "G5": {"0.33.0": False, "0.34.0": False},  # windows: the admission cap
    "G6": {"0.33.0": False, "0.34.0": False},  # windows: blocks no hit reaches are not cached
    "G7": {"0.33.0": False, "0.34.0": False},  # Mamba: the stop at the shared-prefix junction
    "G8": {"0.33.0": False, "0.34.0": False},  # Mamba: no hit on a state cached in the step
}
TRACES = {
    "G4": "gap-mamba-checkpoint-stop.json",
    "G5": "gap-window-admission-cap.json",
    "G6": "gap-window-unreachable-blocks-uncached.json",
    "G7": "gap-mamba-junction-stop.json",
    "G8": "gap-mamba-hit-cached-this-step.json",
}


def test_every_gap_says_how_it_stands_on_every_supported_release() -> None:
    releases = {release.version for release in SUPPORTED}
    assert all(set(per_release) == releases for per_release in STANDS.values())


@pytest.mark.parametrize("gap", sorted(TRACES))
def test_vllm_holds_every_safety_invariant_on_the_gaps_trace(gap: str) -> None:
    replay(Trace.load(FINDINGS / TRACES[gap]), VllmEngine, "safety")


def _diff(gap: str) -> DiffResult | None:
    """The lockstep diff of the gap's trace, where the gap stands on the installed release
    (None where it does not: the diff then passes)."""
    trace = Trace.load(FINDINGS / TRACES[gap])
    result = diff_trace(
        trace, reference_engine, VllmEngine, "vllm-v1", DiffOptions(compare_block_ids=True)
    )
    if not STANDS[gap][current_release().version]:
        assert result.passed, result.divergence or result.violation or result.error
        return None
    return result


def test_g4_both_engines_stop_a_mamba_prefill_chunk_at_its_checkpoint() -> None:
    """A 3-token prompt, Mamba in align mode with 1-token blocks, a budget of 4: a hit can
    reach token 2 at most, and its state must be written there, so vLLM schedules 2
    tokens. The reference models the stop (mamba_split.checkpoint_position): the lockstep
    diff agrees, block ids included. Where it stood, the reference scheduled all 3 and
    vllm-v1's GREEDY-BUDGET judged vLLM by it."""
    result = _diff("G4")
    if result is None:
        return
    assert result.violation is not None and failing_side(result.violation) == "right"
    assert [v.invariant for v in result.violation.violations] == ["GREEDY-BUDGET"]


def test_g5_vllm_admits_under_a_windows_admission_cap() -> None:
    """Full attention beside a 2-token window, 12 blocks, a 1-block watermark: vLLM counts
    the window at its admission cap and admits r1 beside r0. Closed: the reference counts
    it so too (the diff agrees); where the gap stood, it counted every block of r1's
    sequence in the window and did not admit r1."""
    result = _diff("G5")
    if result is None:
        return
    divergence = result.divergence
    assert divergence is not None and divergence.field == "num_scheduled_tokens"
    assert (dict(divergence.left), dict(divergence.right)) == (  # type: ignore[call-overload]
        {"r0": 1},
        {"r0": 1, "r1": 1},
    )


def test_g6_vllm_leaves_window_blocks_no_hit_reaches_uncached() -> None:
    """A 1-token window needs no block for a hit, so vLLM caches none of its blocks and
    frees them to the front of the queue. Closed: the reference does the same (the diff
    agrees); where the gap stood, it cached the block and freed it last."""
    result = _diff("G6")
    if result is None:
        return
    divergence = result.divergence
    assert divergence is not None and divergence.field == "free_block_ids"
    assert divergence.right == (1, *range(2, 16), 0)
    assert divergence.left == (*range(2, 16), 0, 1)


def test_g7_vllm_stops_a_mamba_prefill_chunk_at_the_shared_prefix_junction() -> None:
    """1-token blocks, full attention, a 2-token window and Mamba in align mode, prefix
    caching. r1 ([1, 2, 3, 4, 0, 0]) ran in chunks of 5 and 1, so Mamba holds states
    after 5 and 6 only. r2 ([1, 2, 3, 4, 5, 0]) shares 4 tokens: full attention alone
    hits 4, Mamba 0, so the hit is 0 and vLLM pins the junction at 4
    (request.shared_prefix_boundary) and stops r2's chunk there. Closed: the reference
    records the junction at the lookup and stops there too (the diff agrees, the
    junction compared as well), and the default configs keep prefix caching beside an
    aligned Mamba group. Where the gap stood, the reference ran on to the checkpoint, 5."""
    trace = Trace.load(FINDINGS / TRACES["G7"])
    assert avoid_known_corners(trace.config) == trace.config
    result = _diff("G7")
    if result is None:
        return
    assert result.violation is not None and failing_side(result.violation) == "right"
    assert [v.invariant for v in result.violation.violations] == ["GREEDY-BUDGET"]
    step = result.violation.violations[0]
    assert (step.request_id, step.expected, step.actual) == ("r2", 5, 4)


def test_g8_a_mamba_hit_waits_for_a_state_cached_in_the_same_step() -> None:
    """1-token blocks, full attention, a 2-token window and Mamba in align mode, prefix
    caching. r0 ([0]) is admitted and its blocks cached at once; r1 ([0, 0]) would hit
    them in every group, but vLLM's Mamba manager refuses a hit on a state it cached in
    this step (cached_blocks_this_step): the step writes it. r1 waits. Closed: the
    reference refuses it too (the diff agrees); where the gap stood, it admitted r1 beside
    r0, and MAMBA-HIT-WRITTEN now judges such an admission."""
    result = _diff("G8")
    if result is None:
        return
    divergence = result.divergence
    assert divergence is not None and divergence.field == "num_scheduled_tokens"
    assert (dict(divergence.left), dict(divergence.right)) == (  # type: ignore[call-overload]
        {"r0": 1, "r1": 1},
        {"r0": 1},
    )
