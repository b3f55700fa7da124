"""Trace files: a config, the harness model's parameters, then events in order.

A trace replays on any engine. Loading validates every field and names the event and
field of the first bad one, with the bound it broke: a trace is input from anywhere (a
CI artifact, a hand edit, a fuzzer), and a value past what the harness can act on (a
billion drafts, a prompt longer than the config's max_model_len) must be refused here,
not hang the harness later. The file itself is read through schedspec.files: at most
MAX_TRACE_BYTES of UTF-8 JSON.

A trace holds its config, and an older trace loads under the rules it was recorded
with: a config field added in a later version gets the value of the release the trace
was recorded on, which is not always the field's default (VERSION says which: before
version 4, vLLM 0.33.0's long-prefill rule).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedspec.engines.events import (
    Abort,
    AddRequest,
    Drain,
    Event,
    KVTransfers,
    ProposeDrafts,
    Step,
)
from schedspec.engines.fake_model import StepDecisions
from schedspec.files import InputFileError, parse_json, read_input_text, write_atomically
from schedspec.spec import (
    ConfigError,
    RemoteKV,
    RequestError,
    SchedulerConfig,
    SpecInputError,
    named,
    shown,
)
from schedspec.spec.kv_groups import KVCacheGroupSpec, group_from_json
from schedspec.spec.request import MAX_TOKEN_ID

FORMAT = "schedspec-trace"
# Version 2 added the pipeline: a config may set async_scheduling and pad_spec_decode,
# and under async_scheduling a step event is one engine step of the batch queue
# (pipeline.BatchQueue), whose decisions shape the output that lands in it. A version 1
# trace is a synchronous one and replays unchanged. Version 3 added the policy family
# (family, schedule_conservativeness, enable_mixed_chunk); older traces are vLLM's.
# Version 4 added vLLM 0.34.0's knobs (long_prefill_needs_chunked_prefill,
# cache_aware_admission_window, cache_aware_admission_threshold). Every older trace
# was recorded under vLLM 0.33.0's rules, so a vLLM-family one loads with
# long_prefill_needs_chunked_prefill=False (the cap applied with chunked prefill off
# too) and replays as it was recorded; the cache-aware knobs keep their defaults
# (window 0: off, as before 0.34.0). Version 5 added a step's aborts in flight (the
# step event's "aborts": engines/events.py Step); an older trace has none. Version 6
# added the KV connector: the config's kv_connector, kv_load_failure_policy and
# max_num_inflight_kv_loads, a request's "remote_kv" and a step's "kv" reports.
# Version 7 added the config's kv_cache_groups (a list of objects, each with its
# "kind"); an older trace has the default single full-attention group.
VERSION = 7
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
STEP_ABORTS_SINCE_VERSION = 5
CONNECTOR_SINCE_VERSION = 6
# Config fields an older trace cannot carry (they did not exist), by the version
# that added them.
FIELD_SINCE_VERSION: dict[str, int] = {
    "async_scheduling": 2,
    "pad_spec_decode": 2,
    "family": 3,
    "schedule_conservativeness": 3,
    "enable_mixed_chunk": 3,
    "long_prefill_needs_chunked_prefill": 4,
    "cache_aware_admission_window": 4,
    "cache_aware_admission_threshold": 4,
    "kv_connector": CONNECTOR_SINCE_VERSION,
    "kv_load_failure_policy": CONNECTOR_SINCE_VERSION,
    "max_num_inflight_kv_loads": CONNECTOR_SINCE_VERSION,
    "kv_cache_groups": 7,
}
# What an older trace's vLLM-family config gets for a field it cannot carry, where that
# is not SchedulerConfig's default: the value of the release the trace was recorded on.
_BEFORE_VERSION: dict[str, tuple[int, object]] = {
    "long_prefill_needs_chunked_prefill": (4, False),
}

# The names commands give the traces they write (in --trace-dir, the current
# directory by default), through trace_file_name: stem-seed.json, or for prove
# stem-invariant-variant.json. The repository's .gitignore ignores them.
FAILURE_TRACE_STEM = "schedspec-failure"  # check, and the pytest plugin
DIFF_TRACE_STEM = "schedspec-diff"
SWARM_TRACE_STEM = "schedspec-swarm"  # check --instances
FORMAL_TRACE_STEM = "schedspec-formal"  # prove
TRACE_STEMS = (FAILURE_TRACE_STEM, DIFF_TRACE_STEM, SWARM_TRACE_STEM, FORMAL_TRACE_STEM)

# The largest trace file read: the suite writes traces of kilobytes, a long vLLM
# finding a few hundred; this leaves room for hand-made and fuzzed ones, and keeps
# `replay /dev/zero` or a mistaken multi-gigabyte file from eating memory.
MAX_TRACE_BYTES = 64 * 2**20


def trace_file_name(stem: str, *parts: object) -> str:
    """`schedspec-failure-7.json` for stem "schedspec-failure" and part 7."""
    return "-".join([stem, *map(str, parts)]) + ".json"


class TraceError(SpecInputError):
    """A trace file that cannot be replayed, naming the event and field at fault."""


@dataclass(frozen=True)
class ModelParams:
    """What the harness model needs to produce the same tokens on every engine."""

    seed: int = 0
    vocab_size: int = 64
    draft_acceptance: float = 0.7


@dataclass(frozen=True)
class Trace:
    config: SchedulerConfig
    events: tuple[Event, ...]
    model: ModelParams = ModelParams()
    note: str = ""  # e.g. the violation that made the suite write this trace

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "note": self.note,
            "config": dataclasses.asdict(self.config),
            "model": dataclasses.asdict(self.model),
            "events": [_event_to_json(e) for e in self.events],
        }

    def save(self, path: Path) -> None:
        """Write the trace as JSON, atomically (a reader never sees half of it)."""
        write_atomically(path, json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def load(path: Path) -> Trace:
        try:
            document = parse_json(read_input_text(path, MAX_TRACE_BYTES), str(path))
        except InputFileError as err:
            raise TraceError("trace", str(err)) from None
        return trace_from_json(document)


def _event_to_json(event: Event) -> dict[str, Any]:
    if isinstance(event, AddRequest):
        record = dataclasses.asdict(event)
        # JSON types in memory too, so to_json() round-trips without a file.
        record["prompt_token_ids"] = list(event.prompt_token_ids)
        record["stop_token_ids"] = list(event.stop_token_ids)
        if event.remote_kv is None:  # written only where there is one
            del record["remote_kv"]
        return {"op": "add_request", **record}
    if isinstance(event, Abort):
        return {"op": "abort", "request_ids": list(event.request_ids)}
    if isinstance(event, ProposeDrafts):
        return {"op": "propose_drafts", "num_drafts": dict(event.num_drafts)}
    if isinstance(event, Step):
        step: dict[str, Any] = {
            "op": "step",
            "stops": dict(event.decisions.stops),
            "accepted": dict(event.decisions.accepted),
        }
        if event.aborts:  # written only where there are some: most steps have none
            step["aborts"] = list(event.aborts)
        if event.kv:
            step["kv"] = {
                "loads_done": list(event.kv.loads_done),
                "loads_failed": list(event.kv.loads_failed),
                "blocks_failed": [[rid, index] for rid, index in event.kv.blocks_failed],
                "sends_done": list(event.kv.sends_done),
            }
        return step
    return {"op": "drain"}


def _field(
    record: Mapping[str, Any],
    name: str,
    where: str,
    kind: Callable[[Any], bool],
    what: str,
    default: Any = ...,
) -> Any:
    if name not in record:
        if default is ...:
            raise TraceError(f"{where}.{name}", "missing")
        return default
    value = record[name]
    if not kind(value):
        raise TraceError(f"{where}.{name}", f"must be {what}, got {shown(value)}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


class _Bounds:
    """The values a trace's events may carry under its config: what the harness can act
    on. Prompts may be refused by the engine (the door is under test: empty, negative
    token ids, one of max_model_len tokens), but never longer than that; drafts and
    accepted drafts at most num_speculative_tokens; stop tokens real token ids."""

    def __init__(self, config: SchedulerConfig, version: int) -> None:
        self.max_prompt = config.max_model_len
        self.max_drafts = config.num_speculative_tokens
        self.version = version

    def prompt(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) <= self.max_prompt and _all_ints(value)

    def drafts(self, value: Any) -> bool:
        return _is_str_map(value, lambda n: _is_int(n) and 0 <= n <= self.max_drafts)

    def stops(self, value: Any) -> bool:
        return _is_str_map(value, lambda t: _is_int(t) and 0 <= t < MAX_TOKEN_ID)

    def prompt_what(self) -> str:
        return f"a list of at most max_model_len ({self.max_prompt}) ints"

    def drafts_what(self) -> str:
        return f"an object of ints in [0, num_speculative_tokens ({self.max_drafts})]"


def _all_ints(values: list[Any]) -> bool:
    return all(_is_int(v) for v in values)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and _all_ints(value)


def _is_str_map(value: Any, is_value: Callable[[Any], bool]) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and is_value(v) for k, v in value.items()
    )


STOPS_WHAT = "an object of token ids in [0, 2**63)"
STR_LIST_WHAT = "a list of strings"


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, str) for i in value)


def _event_from_json(record: Any, where: str, bounds: _Bounds) -> Event:
    if not isinstance(record, dict):
        raise TraceError(where, f"must be an object, got {shown(record)}")
    op = _field(record, "op", where, _is_str, "a string")
    if op == "add_request":
        return AddRequest(
            request_id=_field(record, "request_id", where, _is_str, "a string"),
            prompt_token_ids=tuple(
                _field(record, "prompt_token_ids", where, bounds.prompt, bounds.prompt_what())
            ),
            max_tokens=_field(record, "max_tokens", where, _is_int, "an int"),
            eos_token_id=_field(
                record,
                "eos_token_id",
                where,
                lambda v: v is None or _is_int(v),
                "an int or null",
                None,
            ),
            stop_token_ids=tuple(
                _field(record, "stop_token_ids", where, _is_int_list, "a list of ints", [])
            ),
            priority=_field(record, "priority", where, _is_int, "an int", 0),
            remote_kv=_remote_kv(record, where, bounds),
        )
    if op == "abort":
        return Abort(tuple(_field(record, "request_ids", where, _is_str_list, STR_LIST_WHAT)))
    if op == "propose_drafts":
        counts = _field(record, "num_drafts", where, bounds.drafts, bounds.drafts_what())
        return ProposeDrafts(dict(counts))
    if op == "step":
        stops = _field(record, "stops", where, bounds.stops, STOPS_WHAT, {})
        accepted = _field(record, "accepted", where, bounds.drafts, bounds.drafts_what(), {})
        if "aborts" in record and bounds.version < STEP_ABORTS_SINCE_VERSION:
            raise TraceError(f"{where}.aborts", f"not a field of version {bounds.version} traces")
        aborts = _field(record, "aborts", where, _is_str_list, STR_LIST_WHAT, [])
        decisions = StepDecisions(stops=dict(stops), accepted=dict(accepted))
        return Step(decisions, tuple(aborts), _kv_transfers(record, where, bounds))
    if op == "drain":
        return Drain()
    raise TraceError(f"{where}.op", f"unknown event {shown(op)}")


def _newer_field(record: Mapping[str, Any], name: str, where: str, bounds: _Bounds) -> bool:
    """Whether the record carries a connector field, refused in a trace before version 6."""
    if name not in record:
        return False
    if bounds.version < CONNECTOR_SINCE_VERSION:
        raise TraceError(f"{where}.{name}", f"not a field of version {bounds.version} traces")
    return True


_REMOTE_KV_FIELDS = {f.name for f in dataclasses.fields(RemoteKV)}


def _remote_kv(record: Mapping[str, Any], where: str, bounds: _Bounds) -> RemoteKV | None:
    if not _newer_field(record, "remote_kv", where, bounds) or record["remote_kv"] is None:
        return None
    raw = _field(record, "remote_kv", where, lambda v: isinstance(v, dict), "an object or null")
    unknown = sorted(set(raw) - _REMOTE_KV_FIELDS)
    if unknown:
        raise TraceError(f"{where}.remote_kv.{named(unknown[0])}", "unknown field")
    remote = RemoteKV(**raw)
    prompt = record.get("prompt_token_ids")
    try:
        remote.validate(where, len(prompt) if isinstance(prompt, list) else 0)
    except RequestError as err:
        raise TraceError(f"{where}.{err.field}", str(err)) from None
    return remote


def _is_block_ref(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and _is_int(value[1])
        and value[1] >= 0
    )


def _kv_transfers(record: Mapping[str, Any], where: str, bounds: _Bounds) -> KVTransfers:
    if not _newer_field(record, "kv", where, bounds):
        return KVTransfers()
    raw = _field(record, "kv", where, lambda v: isinstance(v, dict), "an object")
    here = f"{where}.kv"
    unknown = sorted(set(raw) - {"loads_done", "loads_failed", "blocks_failed", "sends_done"})
    if unknown:
        raise TraceError(f"{here}.{named(unknown[0])}", "unknown field")
    blocks = _field(
        raw,
        "blocks_failed",
        here,
        lambda v: isinstance(v, list) and all(_is_block_ref(b) for b in v),
        "a list of [request id, block index >= 0] pairs",
        [],
    )
    return KVTransfers(
        loads_done=tuple(_field(raw, "loads_done", here, _is_str_list, STR_LIST_WHAT, [])),
        loads_failed=tuple(_field(raw, "loads_failed", here, _is_str_list, STR_LIST_WHAT, [])),
        blocks_failed=tuple((rid, index) for rid, index in blocks),
        sends_done=tuple(_field(raw, "sends_done", here, _is_str_list, STR_LIST_WHAT, [])),
    )


def _groups_from_json(raw_config: dict[str, Any]) -> tuple[KVCacheGroupSpec, ...]:
    raw = raw_config["kv_cache_groups"]
    if not isinstance(raw, list | tuple):  # a list in a file, a tuple from to_json()
        raise ConfigError("kv_cache_groups", f"must be a list, got {shown(raw)}")
    return tuple(group_from_json(g, f"kv_cache_groups[{i}]") for i, g in enumerate(raw))


def trace_from_json(document: Any) -> Trace:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TraceError("format", f"not a {FORMAT} document")
    version = document.get("version")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise TraceError("version", f"must be one of {SUPPORTED_VERSIONS}, got {shown(version)}")
    raw_config = _field(document, "config", "trace", lambda v: isinstance(v, dict), "an object")
    for name, since in FIELD_SINCE_VERSION.items():
        if name in raw_config and version < since:
            raise TraceError(f"config.{name}", f"not a field of version {version} traces")
    if raw_config.get("family", "vllm") == "vllm":
        older = {n: v for n, (since, v) in _BEFORE_VERSION.items() if version < since}
        raw_config = {**raw_config, **older}
    known = {f.name for f in dataclasses.fields(SchedulerConfig)}
    unknown_fields = sorted(set(raw_config) - known)
    if unknown_fields:
        raise TraceError(f"config.{named(unknown_fields[0])}", "unknown field")
    try:
        if "kv_cache_groups" in raw_config:
            raw_config = {**raw_config, "kv_cache_groups": _groups_from_json(raw_config)}
        config = SchedulerConfig(**raw_config)
    except ConfigError as err:
        raise TraceError(f"config.{err.field}", str(err)) from None
    except TypeError as err:  # a required field missing
        raise TraceError("config", str(err)) from None
    raw_model = _field(document, "model", "trace", lambda v: isinstance(v, dict), "an object", {})
    unknown = set(raw_model) - {"seed", "vocab_size", "draft_acceptance"}
    if unknown:
        raise TraceError(f"model.{named(sorted(unknown)[0])}", "unknown field")
    model = ModelParams(
        seed=_field(raw_model, "seed", "model", _is_int, "an int", 0),
        vocab_size=_field(
            raw_model,
            "vocab_size",
            "model",
            lambda v: _is_int(v) and 2 <= v <= MAX_TOKEN_ID,
            "an int in [2, 2**63]",
            64,
        ),
        draft_acceptance=_field(
            raw_model,
            "draft_acceptance",
            "model",
            lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1,
            "a number in [0, 1]",
            0.7,
        ),
    )
    raw_events = _field(document, "events", "trace", lambda v: isinstance(v, list), "a list")
    bounds = _Bounds(config, version)
    events = tuple(_event_from_json(e, f"events[{i}]", bounds) for i, e in enumerate(raw_events))
    note = _field(document, "note", "trace", _is_str, "a string", "")
    return Trace(config=config, events=events, model=model, note=note)
