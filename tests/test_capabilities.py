"""Declared capabilities (engines/capabilities.py): configs drawn within them, corners they
rule out shown as not applicable, a capability without its method refused at load, and
the default for an adapter that declares none."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.adapters.gpu import GpuEngine
from schedspec.adapters.reference import ReferenceEngine, SGLangReferenceEngine
from schedspec.adapters.sglang.engine import SGLangEngine
from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.cli.main import main
from schedspec.engines.capabilities import (
    ALL_CAPABILITIES,
    SGLANG_FAMILY_CAPABILITIES,
    VLLM_FAMILY_CAPABILITIES,
    Capability,
    CapabilityError,
    claimed_capabilities,
    needed_capabilities,
    within,
)
from schedspec.properties.corners import format_corners
from schedspec.properties.minimize import plainer_configs
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.spec import SchedulerConfig
from schedspec.spec.kv_groups import FullAttentionGroup, SlidingWindowGroup
from schedspec.traces.trace import Trace
from tests.capability_engines import (
    ChunkedOnlyEngine,
    DraftsRefused,
    DraftsWithoutMethod,
    PaddingWithoutDrafts,
    StringCapabilities,
    UndeclaredWithoutMethod,
    chunked_only,
)
from tests.sched_helpers import make_config

# Drafts with padding, async, priority, prefix caching, a watermark, a long-prefill cap
# and chunked prefill with a budget below max_model_len.
EVERYTHING = SchedulerConfig(
    block_size=4,
    num_blocks=16,
    max_num_batched_tokens=20,
    max_num_seqs=4,
    max_model_len=32,
    num_speculative_tokens=2,
    pad_spec_decode=True,
    async_scheduling=True,
    policy="priority",
    enable_prefix_caching=True,
    watermark=0.1,
    long_prefill_token_threshold=8,
)


def test_a_config_needs_the_capabilities_of_the_knobs_it_turns_on() -> None:
    assert needed_capabilities(EVERYTHING) == {
        Capability.DRAFTS,
        Capability.SPEC_DECODE_PADDING,
        Capability.ASYNC_SCHEDULING,
        Capability.PRIORITY,
        Capability.PREFIX_CACHING,
        Capability.CHUNKED_PREFILL,
        Capability.WATERMARK,
        Capability.LONG_PREFILL_CAP,
    }
    plain = SchedulerConfig(
        block_size=4,
        num_blocks=8,
        max_num_batched_tokens=32,
        max_num_seqs=2,
        max_model_len=32,
        enable_chunked_prefill=False,
    )
    assert needed_capabilities(plain) == frozenset()


def test_within_turns_off_what_the_engine_lacks_and_keeps_the_config_valid() -> None:
    # Chunked prefill off needs a budget of max_model_len: 20 becomes 32.
    narrowed = within(frozenset({Capability.PREFIX_CACHING}), EVERYTHING)
    assert narrowed == dataclasses.replace(
        EVERYTHING,
        num_speculative_tokens=0,
        num_lookahead_tokens=0,
        pad_spec_decode=False,
        async_scheduling=False,
        policy="fcfs",
        enable_chunked_prefill=False,
        max_num_batched_tokens=32,
        watermark=0.0,
        long_prefill_token_threshold=0,
    )
    assert needed_capabilities(narrowed) == {Capability.PREFIX_CACHING}


def test_within_keeps_a_config_the_engine_can_run_as_it_is() -> None:
    assert within(ALL_CAPABILITIES, EVERYTHING) is EVERYTHING


def test_an_engine_is_only_ever_built_with_configs_within_its_capabilities() -> None:
    # ChunkedOnlyEngine raises on a config that needs more: the run would fail.
    ChunkedOnlyEngine.built.clear()
    settings = dataclasses.replace(SuiteSettings.quick(), examples=40, seed=3)
    result = run_suite(chunked_only, "safety", settings)
    assert result.passed, result.error
    drawn = ChunkedOnlyEngine.built
    assert drawn and all(needed_capabilities(c) <= {Capability.CHUNKED_PREFILL} for c in drawn)
    assert any(c.enable_chunked_prefill for c in drawn)  # what it has is still drawn


def test_the_corners_it_cannot_reach_are_not_applicable_not_never() -> None:
    counts = {"preemption": 3, "prefix-hit": 1}
    lines = format_corners(counts, "vllm-v1", frozenset({Capability.PREFIX_CACHING}))
    rows = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines[1:-1]}
    assert rows["drafts-scheduled"].startswith("not applicable  a step that verified drafts")
    assert rows["preempted-with-output-in-flight"].startswith("not applicable")
    assert rows["prefix-hit"].startswith("1  ")
    assert rows["two-victims"].startswith("0  ")
    summary = lines[-1]
    never = summary.split("(never: ")[1].split(")")[0]
    assert "two-victims" in never and "drafts-scheduled" not in never
    assert "not applicable" in summary and "drafts-scheduled" in summary.split("not applicable")[1]
    # With every capability nothing is ruled out: the table reads as it always did.
    assert "not applicable" not in "\n".join(format_corners(counts, "vllm-v1"))


def test_declaring_drafts_without_the_method_is_refused_naming_it() -> None:
    for engine in (DraftsWithoutMethod, DraftsRefused):
        with pytest.raises(CapabilityError) as refused:
            claimed_capabilities(engine(EVERYTHING))
        message = str(refused.value)
        assert "update_draft_token_ids" in message and "DRAFTS" in message
        assert "leave DRAFTS out of `capabilities`" in message  # how to fix it


def test_an_adapter_that_declares_nothing_has_every_capability() -> None:
    class Bare:  # the README's adapter declares nothing, as adapters did before
        def update_draft_token_ids(self) -> None: ...

    assert claimed_capabilities(Bare()) == ALL_CAPABILITIES
    # ... so it is held to drafts too, and a missing method is refused, saying why.
    with pytest.raises(CapabilityError, match="declares no capabilities, so it is taken"):
        claimed_capabilities(UndeclaredWithoutMethod(EVERYTHING))


def test_a_malformed_declaration_is_refused() -> None:
    with pytest.raises(CapabilityError, match="expected a frozenset of"):
        claimed_capabilities(StringCapabilities(EVERYTHING))
    with pytest.raises(CapabilityError, match="SPEC_DECODE_PADDING without DRAFTS"):
        claimed_capabilities(PaddingWithoutDrafts(EVERYTHING))


def test_check_refuses_such_an_adapter_when_it_loads_before_any_run() -> None:
    result = CliRunner().invoke(
        main, ["check", "--engine", "tests.capability_engines:DraftsWithoutMethod"]
    )
    assert result.exit_code == 2, result.output
    assert "update_draft_token_ids" in result.output and "DRAFTS" in result.output
    assert "checking" not in result.output  # refused before the run started


def test_the_registered_engines_declare_their_capabilities_explicitly() -> None:
    assert ReferenceEngine.capabilities == VLLM_FAMILY_CAPABILITIES
    assert SGLangReferenceEngine.capabilities == SGLANG_FAMILY_CAPABILITIES
    # Hybrid KV cache groups: the reference and vLLM; gpu_impl and SGLang refuse them.
    assert VllmEngine.capabilities == VLLM_FAMILY_CAPABILITIES
    assert SGLangEngine.capabilities == SGLANG_FAMILY_CAPABILITIES
    assert GpuEngine.capabilities == VLLM_FAMILY_CAPABILITIES - {
        Capability.KV_CONNECTOR,
        Capability.HYBRID_KV,
    }


def test_shrinking_never_turns_on_a_knob_the_engine_lacks() -> None:
    unchunked = within(frozenset(), EVERYTHING)
    assert not unchunked.enable_chunked_prefill
    # enable_chunked_prefill's default is True: set back, it would need CHUNKED_PREFILL.
    everything = [c.enable_chunked_prefill for c in plainer_configs(unchunked)]
    assert True in everything
    assert not any(c.enable_chunked_prefill for c in plainer_configs(unchunked, frozenset()))


def test_within_an_engine_without_hybrid_kv_drops_the_groups() -> None:
    groups = (
        FullAttentionGroup(block_size=4),
        SlidingWindowGroup(block_size=4, sliding_window=5),
    )
    hybrid = make_config(max_model_len=32, num_blocks=16, kv_cache_groups=groups)
    assert Capability.HYBRID_KV in needed_capabilities(hybrid)
    single = within(VLLM_FAMILY_CAPABILITIES - {Capability.HYBRID_KV}, hybrid)
    assert single.kv_cache_groups == () and single.num_blocks == 16
    assert within(VLLM_FAMILY_CAPABILITIES, hybrid) is hybrid


PREFIX_TRACE = make_config(enable_prefix_caching=True, policy="priority")
TRUSTING = "tests.capability_engines:trusts_its_declaration"


def _trace(tmp_path: Path, config: SchedulerConfig) -> str:
    path = tmp_path / "trace.json"
    Trace(config=config, events=()).save(path)
    return str(path)


def test_replay_refuses_a_trace_needing_what_the_engine_does_not_declare(
    tmp_path: Path,
) -> None:
    """The engine builds at the trace's config, but does not declare prefix caching or
    priority: a usage error naming the field, each capability and its knob, before any
    event runs."""
    path = _trace(tmp_path, PREFIX_TRACE)
    result = CliRunner().invoke(main, ["replay", path, "--engine", TRUSTING])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--engine'" in result.output
    assert "needs PREFIX_CACHING (enable_prefix_caching), PRIORITY (policy='priority')" in (
        result.output
    )
    assert "replaying" not in result.output


@pytest.mark.parametrize("side", ["left", "right"])
def test_diff_replay_refuses_either_side_lacking_what_the_trace_needs(
    tmp_path: Path, side: str
) -> None:
    path = _trace(tmp_path, PREFIX_TRACE)
    engines = {"left": "reference", "right": "reference", side: TRUSTING}
    result = CliRunner().invoke(
        main, ["diff-replay", path, "--left", engines["left"], "--right", engines["right"]]
    )
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--{side}'" in result.output
    assert "needs PREFIX_CACHING (enable_prefix_caching)" in result.output
    assert "in lockstep" not in result.output


def test_a_trace_within_the_declaration_replays(tmp_path: Path) -> None:
    path = _trace(tmp_path, make_config())
    for args in (
        ["replay", path, "--engine", TRUSTING],
        ["diff-replay", path, "--left", "reference", "--right", TRUSTING],
    ):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
