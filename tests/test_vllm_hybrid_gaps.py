"""The gaps G4-G6 (docs/FINDINGS.md): vLLM's own hybrid KV cache rules that the reference
does not model yet, each replayed from its trace on the installed release. vLLM holds
every safety invariant on each; the reference parts from it where the gap is. The day
the reference models a rule, its test fails: flip its entry in STANDS and move the
regime back into the default strategies (vllm_hybrid_attention_configs leaves Mamba out
for G4).

Needs vLLM (either supported release); skipped without it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed")

from schedspec.adapters.reference import reference_engine
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
    "G4": {"0.33.0": True, "0.34.0": True},  # Mamba: the chunk stops at the last cacheable boundary
    # Closed: the reference counts a window at its admission cap in the gate (G5) and
    # caches only the window blocks an aligned hit can reach (G6).
    "G5": {"0.33.0": False, "0.34.0": False},  # windows: the admission cap
    "G6": {"0.33.0": False, "0.34.0": False},  # windows: blocks no hit reaches are not cached
}
TRACES = {
    "G4": "gap-mamba-checkpoint-stop.json",
    "G5": "gap-window-admission-cap.json",
    "G6": "gap-window-unreachable-blocks-uncached.json",
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


def test_g4_vllm_stops_a_mamba_prefill_chunk_at_the_last_cacheable_boundary() -> None:
    """A 3-token prompt, Mamba in align mode with 1-token blocks, a budget of 4: vLLM
    schedules 2 tokens (a hit can reach token 2 at most, and its state must be written
    there), the reference all 3; vllm-v1's GREEDY-BUDGET judges vLLM by the reference."""
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
