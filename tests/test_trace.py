"""Trace files: round trip, replay, and clear errors naming the event and field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedspec.adapters.reference import ReferenceEngine, reference_engine
from schedspec.cli.main import main
from schedspec.engines.events import Abort, AddRequest, Drain, ProposeDrafts, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.properties.checked_engine import InvariantViolationError, replay
from schedspec.spec import SchedulerConfig, SchedulerOutput
from schedspec.traces.trace import (
    VERSION,
    ModelParams,
    Trace,
    TraceError,
    trace_from_json,
)
from tests.sched_helpers import as_version, make_config

REPO = Path(__file__).resolve().parent.parent

EVENTS = (
    AddRequest("a", (1, 2, 3, 4, 5), 4, eos_token_id=2, stop_token_ids=(9,), priority=1),
    AddRequest("b", (1, 2, 3, 4, 6, 7), 3),
    Step(),
    ProposeDrafts({"a": 2, "b": 1}),
    Step(StepDecisions(stops={"b": 9}, accepted={"a": 1})),
    Abort(("a", "nobody")),
    Drain(),
)


def _trace() -> Trace:
    config = make_config(num_speculative_tokens=2, enable_prefix_caching=True)
    return Trace(config, EVENTS, ModelParams(seed=3), note="example")


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    _trace().save(path)
    assert Trace.load(path) == _trace()


def test_replay_on_the_reference_checks_every_event() -> None:
    checked = replay(_trace(), reference_engine, "vllm-v1")
    assert checked.stats.events == len(EVENTS)
    assert not checked.state.requests  # drained
    assert checked.stats.checks["NO-LEAK"] == 1


class MiscountingEngine(ReferenceEngine):
    """Reports one token more than it scheduled."""

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        return SchedulerOutput(
            output.scheduled_new_reqs,
            output.scheduled_cached_reqs,
            output.num_scheduled_tokens,
            output.total_num_scheduled_tokens + 1,
            output.scheduled_spec_decode_tokens,
            output.preempted_req_ids,
            output.finished_req_ids,
        )


def test_replay_names_the_first_broken_event() -> None:
    def factory(config: SchedulerConfig) -> MiscountingEngine:
        return MiscountingEngine(config)

    with pytest.raises(InvariantViolationError) as info:
        replay(_trace(), factory, "safety")
    assert info.value.event_index == 2
    assert {v.invariant for v in info.value.violations} == {"BUDGET"}
    assert "after event 2 (Step)" in str(info.value)


def _document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(_trace().to_json()))
    return document


@pytest.mark.parametrize(
    ("corrupt", "field"),
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(version=9), "version"),
        (lambda d: d["config"].update(block_size=0), "config.block_size"),
        (lambda d: d["config"].update(colour="red"), "config.colour"),
        (lambda d: d["config"].pop("block_size"), "config"),
        (lambda d: d["config"].update(num_blocks=10**9), "config.num_blocks"),
        (lambda d: d["model"].update(vocab_size=1), "model.vocab_size"),
        (lambda d: d["model"].update(temperature=1), "model.temperature"),
        (lambda d: d["events"][0].pop("max_tokens"), "events[0].max_tokens"),
        (lambda d: d["events"][1].update(prompt_token_ids=[1, "x"]), "events[1].prompt_token_ids"),
        (lambda d: d["events"][4].update(stops={"b": "eos"}), "events[4].stops"),
        (lambda d: d["events"][5].update(op="explode"), "events[5].op"),
        (lambda d: d["events"].append(3), "events[7]"),
    ],
)
def test_bad_trace_names_the_field(corrupt: Any, field: str) -> None:
    document = _document()
    corrupt(document)
    with pytest.raises(TraceError) as info:
        trace_from_json(document)
    assert info.value.field == field


def test_not_json_is_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(TraceError, match="not JSON"):
        Trace.load(path)


def test_round_trip_in_memory() -> None:
    assert trace_from_json(_trace().to_json()) == _trace()


def test_a_version_1_trace_replays_as_a_synchronous_one() -> None:
    """Every trace written before the pipeline existed still loads and replays: its
    config gets async_scheduling and pad_spec_decode off (and is of vLLM's family)."""
    document = _trace().to_json()
    as_version(document, 1)
    for name in (
        "async_scheduling",
        "pad_spec_decode",
        "family",
        "schedule_conservativeness",
        "enable_mixed_chunk",
        "long_prefill_needs_chunked_prefill",
        "cache_aware_admission_window",
        "cache_aware_admission_threshold",
    ):
        del document["config"][name]
    loaded = trace_from_json(document)
    assert not loaded.config.async_scheduling and not loaded.config.pad_spec_decode
    assert loaded.events == _trace().events
    replay(loaded, reference_engine, "vllm-v1")


def test_the_repositorys_traces_of_every_version_still_load() -> None:
    paths = sorted((REPO / "docs" / "findings").glob("*.json"))
    assert paths
    for path in paths:
        assert json.loads(path.read_text())["version"] in range(1, VERSION + 1)
        Trace.load(path)


# Version 4: vLLM 0.34.0's knobs. Every older trace was recorded under 0.33.0's rules.
RELEASE_KNOBS = (
    "long_prefill_needs_chunked_prefill",
    "cache_aware_admission_window",
    "cache_aware_admission_threshold",
)


def _version_3(config: SchedulerConfig) -> dict[str, Any]:
    document = dataclasses.replace(_trace(), config=config).to_json()
    as_version(document, 3)
    for name in RELEASE_KNOBS:
        del document["config"][name]
    return document


def test_a_version_3_trace_loads_under_the_033_long_prefill_rule() -> None:
    """A trace without the knob was recorded when the cap applied with chunked prefill
    off too (0.33.0): it loads so, and replays as it was recorded. No cache-aware
    admission then either: the window is 0."""
    config = dataclasses.replace(
        _trace().config, enable_chunked_prefill=False, long_prefill_token_threshold=3
    )
    loaded = trace_from_json(_version_3(config))
    assert loaded.config == dataclasses.replace(config, long_prefill_needs_chunked_prefill=False)
    assert loaded.config.cache_aware_admission_window == 0
    replay(loaded, reference_engine, "vllm-v1")


def test_a_version_3_sglang_trace_keeps_the_default_rule() -> None:
    """SGLang has no long-prefill cap: its traces keep the vLLM knobs' defaults, as the
    family requires."""
    sglang = SchedulerConfig(
        family="sglang", block_size=1, num_blocks=16, max_num_batched_tokens=16,
        max_num_seqs=2, max_model_len=16,
    )  # fmt: skip
    document = Trace(sglang, ()).to_json()
    as_version(document, 3)
    for name in RELEASE_KNOBS:
        del document["config"][name]
    assert trace_from_json(document).config == sglang


@pytest.mark.parametrize("name", RELEASE_KNOBS)
def test_a_version_3_trace_cannot_carry_a_034_knob(name: str) -> None:
    document = _version_3(make_config())
    document["config"][name] = getattr(make_config(), name)
    with pytest.raises(TraceError) as info:
        trace_from_json(document)
    assert info.value.field == f"config.{name}"


def test_a_version_4_trace_keeps_its_release_knobs() -> None:
    config = dataclasses.replace(
        _trace().config,
        long_prefill_needs_chunked_prefill=False,
        cache_aware_admission_window=3,
        cache_aware_admission_threshold=0.25,
    )
    trace = dataclasses.replace(_trace(), config=config)
    document = as_version(trace.to_json(), 4)  # a version 4 file: steps without aborts
    assert VERSION > 4
    assert trace_from_json(document) == trace
    replay(trace, reference_engine, "vllm-v1")


def test_the_repositorys_older_traces_load_under_the_033_rule() -> None:
    """The findings, regression, formal and mutant traces were all recorded before
    version 4: each vLLM-family one replays under 0.33.0's long-prefill rule."""
    folders = ("docs/findings", "tests/regression_traces", "tests/formal_traces")
    paths = [p for f in folders for p in sorted((REPO / f).glob("*.json"))]
    paths += sorted((REPO / "tests" / "mutants" / "traces").glob("*.json"))
    older = [p for p in paths if json.loads(p.read_text())["version"] < 4]
    assert older
    for path in older:
        config = Trace.load(path).config
        assert config.long_prefill_needs_chunked_prefill is (config.family != "vllm"), path


def test_a_version_1_trace_cannot_claim_async_scheduling() -> None:
    document = _trace().to_json()
    as_version(document, 1)
    with pytest.raises(TraceError) as info:
        trace_from_json(document)
    assert info.value.field == "config.async_scheduling"


def test_an_async_trace_round_trips_and_replays() -> None:
    config = dataclasses.replace(_trace().config, async_scheduling=True)
    trace = dataclasses.replace(_trace(), config=config)
    document = trace.to_json()
    assert document["version"] == VERSION and document["config"]["async_scheduling"] is True
    assert trace_from_json(document) == trace
    replay(trace, reference_engine, "vllm-v1")


@pytest.mark.parametrize(
    ("corrupt", "field", "bound"),
    [
        (
            lambda d: d["events"][3].update(num_drafts={"a": 10**9}),
            "events[3].num_drafts",
            "[0, num_speculative_tokens (2)]",
        ),
        (
            lambda d: d["events"][3].update(num_drafts={"a": -1}),
            "events[3].num_drafts",
            "[0, num_speculative_tokens (2)]",
        ),
        (
            lambda d: d["events"][4].update(accepted={"a": -2}),
            "events[4].accepted",
            "[0, num_speculative_tokens (2)]",
        ),
        (
            lambda d: d["events"][4].update(stops={"b": -9}),
            "events[4].stops",
            "token ids in [0, 2**63)",
        ),
        (
            lambda d: d["events"][0].update(prompt_token_ids=[1] * 257),
            "events[0].prompt_token_ids",
            "at most max_model_len (256)",
        ),
        (lambda d: d["model"].update(vocab_size=2**64), "model.vocab_size", "[2, 2**63]"),
        (
            lambda d: d["config"].update(num_speculative_tokens=10**8),
            "config.num_speculative_tokens",
            "<= 256",
        ),
        (lambda d: d.update(note=["not", "text"]), "trace.note", "a string"),
    ],
)
def test_trace_values_are_bounded_naming_the_bound(corrupt: Any, field: str, bound: str) -> None:
    """A value the harness could not act on (a billion drafts hung it) is refused as read."""
    document = _document()
    corrupt(document)
    with pytest.raises(TraceError) as info:
        trace_from_json(document)
    assert info.value.field == field
    assert bound in str(info.value)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_bytes(b"\x00\x01\xfe\xff" * 10), "is not UTF-8 text"),
        (lambda p: p.write_text('{"format": "schedspec-trace"}', encoding="utf-16"), "UTF-16"),
        (lambda p: p.write_text("[" * 5000 + "]" * 5000), "nests deeper than 32 levels"),
        (lambda p: p.write_text('{"format": "schedspec-trace", "version": NaN}'), "NaN"),
    ],
)
def test_replay_refuses_an_unreadable_trace_naming_the_file(
    tmp_path: Path, make: Any, says: str
) -> None:
    path = tmp_path / "trace.json"
    make(path)
    result = CliRunner().invoke(main, ["replay", str(path)])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for 'TRACE': trace: {path}: " in result.output
    assert says in result.output


def test_replay_of_a_device_or_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    """`replay /dev/zero` used to read forever."""
    zero = CliRunner().invoke(main, ["replay", "/dev/zero"])
    assert zero.exit_code == 2 and "not a regular file" in zero.output
    folder = CliRunner().invoke(main, ["replay", str(tmp_path)])
    assert folder.exit_code == 2


def test_a_trace_larger_than_the_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("schedspec.traces.trace.MAX_TRACE_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_document()) + " " * 1000)
    with pytest.raises(TraceError, match="is larger than the 1,000 bytes this input may be"):
        Trace.load(path)
