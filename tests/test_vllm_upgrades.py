"""docs/UPGRADES.md: each difference the cross-release diff found between vLLM 0.33.0 and
0.34.0, replayed from its shrunk trace (docs/upgrades/).

Two halves. Without vLLM: the reference under each release's knob values
(`Release.knobs`) parts on the trace at the step the diff found, each side holding every
invariant of vllm-v1, so the knobs state the difference. With vLLM installed: the
installed release makes the reference's decisions under its own knob values, block ids
included; under the other release's it follows them where its own config can say them,
and elsewhere parts at the same step, holding safety: the difference is the release's,
and the knobs name it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.adapters.vllm.releases import SUPPORTED, Release
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.properties.differential import DiffOptions, DiffResult, diff_trace
from schedspec.spec import SchedulerConfig
from schedspec.traces.trace import Trace

UPGRADES = Path(__file__).resolve().parent.parent / "docs" / "upgrades"
V033, V034 = SUPPORTED


@dataclass(frozen=True)
class Difference:
    """One row of docs/UPGRADES.md: its trace, and where the releases part."""

    id: str
    trace: str
    event: int  # the event after which the releases' outputs first differ
    field: str  # what differs there first


DIFFERENCES = (
    Difference("U1", "vllm-0.34-long-prefill-cap-needs-chunking.json", 2, "num_scheduled_tokens"),
    Difference("U2", "vllm-0.34-cache-aware-admission-reorders.json", 4, "num_scheduled_tokens"),
)


def load(difference: Difference) -> Trace:
    return Trace.load(UPGRADES / difference.trace)


def reference_as(release: Release) -> EngineFactory:
    """The reference with the release's knob values, whatever the trace's config says."""

    def build(config: SchedulerConfig) -> EngineAdapter:
        return reference_engine(release.knobs(config))

    return build


def first_divergence(result: DiffResult) -> tuple[int, str]:
    """The event after which the engines first parted, and the field that differed."""
    assert result.violation is None and result.error is None
    assert result.divergence is not None, "the engines agreed at every step"
    return result.divergence.event_index, result.divergence.field


def test_every_trace_in_the_folder_is_a_listed_difference() -> None:
    listed = {d.trace for d in DIFFERENCES}
    assert {p.name for p in UPGRADES.glob("*.json")} == listed
    document = (UPGRADES.parent / "UPGRADES.md").read_text()
    assert all(f"## {d.id}:" in document and d.trace in document for d in DIFFERENCES)


@pytest.mark.parametrize("difference", DIFFERENCES, ids=lambda d: d.id)
def test_the_releases_knobs_part_the_reference_where_the_releases_part(
    difference: Difference,
) -> None:
    trace = load(difference)
    options = DiffOptions(compare_block_ids=True)
    parted = diff_trace(trace, reference_as(V033), reference_as(V034), "vllm-v1", options)
    assert first_divergence(parted) == (difference.event, difference.field)
    # Under either release's knobs alone, the reference agrees with itself: what parts
    # the two runs is the knobs.
    for release in SUPPORTED:
        same = diff_trace(trace, reference_as(release), reference_as(release), "vllm-v1", options)
        assert same.passed, same.divergence or same.violation or same.error


vllm_installed = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed: run schedspec install vllm to run these",
)


@vllm_installed
@pytest.mark.parametrize("difference", DIFFERENCES, ids=lambda d: d.id)
def test_the_installed_release_follows_its_own_knobs_and_parts_from_the_others(
    difference: Difference,
) -> None:
    from schedspec.adapters.vllm.engine import VllmEngine
    from schedspec.adapters.vllm.releases import current_release

    trace = load(difference)
    own = current_release()
    (other,) = [release for release in SUPPORTED if release != own]
    options = DiffOptions(compare_block_ids=True)
    as_own = replace(trace, config=own.knobs(trace.config))
    agreed = diff_trace(as_own, reference_engine, VllmEngine, "vllm-v1", options)
    assert agreed.passed, agreed.divergence or agreed.violation or agreed.error
    # Under the other release's knob values: where they describe this release too (0.34.0
    # with a window of 0 is 0.34.0 with cache-aware admission off), vLLM follows them and
    # agrees again; where they do not (a rule it cannot turn), the engine claims only
    # safety, holds it, decides as its own release does, and parts where the diff parted.
    as_other = replace(trace, config=other.knobs(trace.config))
    if own.mismatch(as_other.config) is None:
        again = diff_trace(as_other, reference_engine, VllmEngine, "vllm-v1", options)
        assert again.passed, again.divergence or again.violation or again.error
        return
    assert VllmEngine(as_other.config).profiles == {"safety"}
    parted = diff_trace(as_other, reference_engine, VllmEngine, "safety", options)
    assert first_divergence(parted) == (difference.event, difference.field)
