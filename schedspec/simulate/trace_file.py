"""A workload from a JSONL trace: one request per line, the shape public traces share.

    {"arrival_time": 0.25, "prompt_tokens": 812, "output_tokens": 97}

arrival_time is in seconds; only the gaps matter: the trace is shifted so that its
first arrival is at 0 (a trace in epoch seconds simulates as well as one from 0).
prompt_tokens is a count (tokens are then drawn from the seed, when the request is)
or a list of token ids (so a trace can carry shared prefixes), either way shorter than
max_model_len; output_tokens is the number of tokens to generate. Optional:
request_id (a string, unique; default "line<N>"), priority (an int). Blank lines are
skipped. The file is UTF-8 text of at most MAX_WORKLOAD_BYTES and MAX_SIM_REQUESTS
records. A bad record raises TraceRecordError naming the line and the field.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from schedspec.files import InputFileError, parse_json, read_input_text, write_atomically
from schedspec.simulate.errors import TraceRecordError
from schedspec.simulate.workloads import MAX_SIM_REQUESTS, VOCAB_SIZE, SimRequest, Workload
from schedspec.spec import named, shown
from schedspec.spec.request import MAX_TOKEN_ID

KNOWN_FIELDS = ("arrival_time", "prompt_tokens", "output_tokens", "request_id", "priority")
# Public request traces run to tens of megabytes (a million short records is about
# 60 MB); this leaves room, and keeps a mistaken multi-gigabyte file out of memory.
MAX_WORKLOAD_BYTES = 256 * 2**20


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Record:
    """One line, checked: its prompt is a count until the request is drawn."""

    number: int
    request_id: str
    arrival_time: float
    prompt: int | tuple[int, ...]
    max_tokens: int
    priority: int


class _Line:
    """One record being read: field checks raise errors naming this line."""

    def __init__(self, path: str, number: int, record: dict[str, object]) -> None:
        self.path, self.number, self.record = path, number, record

    def fail(self, field: str, detail: str) -> TraceRecordError:
        return TraceRecordError(self.path, self.number, field, f"field {field!r} {detail}")

    def required(self, name: str) -> object:
        if name not in self.record:
            raise self.fail(name, "is missing")
        return self.record[name]

    def arrival_time(self) -> float:
        value = self.required("arrival_time")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.fail("arrival_time", f"must be a number of seconds, got {shown(value)}")
        try:
            seconds = float(value)
        except OverflowError:  # an integer too large for a float
            seconds = math.inf
        if not math.isfinite(seconds) or seconds < 0:
            raise self.fail("arrival_time", f"must be finite and >= 0, got {shown(value)}")
        return seconds

    def prompt(self, max_model_len: int) -> int | tuple[int, ...]:
        value = self.required("prompt_tokens")
        shorter = f"shorter than max_model_len ({max_model_len})"
        if _is_int(value):
            assert isinstance(value, int)
            if not 1 <= value < max_model_len:
                raise self.fail("prompt_tokens", f"must be >= 1 and {shorter}, got {shown(value)}")
            return value
        if (
            isinstance(value, list)
            and value
            and all(_is_int(t) and 0 <= t < MAX_TOKEN_ID for t in value)
        ):
            if len(value) >= max_model_len:
                raise self.fail(
                    "prompt_tokens", f"must be {shorter}, got a list of {len(value)} token ids"
                )
            return tuple(value)
        raise self.fail(
            "prompt_tokens",
            f"must be a count >= 1 or a non-empty list of token ids >= 0, got {shown(value)}",
        )

    def positive_int(self, name: str) -> int:
        value = self.required(name)
        if not _is_int(value) or not isinstance(value, int) or not 1 <= value < MAX_TOKEN_ID:
            raise self.fail(name, f"must be an integer in [1, 2**63), got {shown(value)}")
        return value

    def priority(self) -> int:
        value = self.record.get("priority", 0)
        if not _is_int(value) or not isinstance(value, int) or abs(value) >= MAX_TOKEN_ID:
            raise self.fail(
                "priority", f"must be an integer in (-2**63, 2**63), got {shown(value)}"
            )
        return value


def load_trace(path: Path, seed: int, *, max_model_len: int) -> Workload:
    """The trace's requests sorted by arrival time (stable for equal times), the first
    at time 0. Counted prompts are drawn from the seed (and the line) when iterated."""
    name = str(path)
    try:
        text = read_input_text(path, MAX_WORKLOAD_BYTES)
    except InputFileError as err:
        raise TraceRecordError(name, 0, "workload", f"cannot be read: {err.detail}") from None
    records: list[_Record] = []
    seen: set[str] = set()
    for number, line_text in enumerate(text.splitlines(), start=1):
        if not line_text.strip():
            continue
        if len(records) == MAX_SIM_REQUESTS:
            raise TraceRecordError(
                name,
                number,
                "workload",
                f"more than {MAX_SIM_REQUESTS} records (each request's timeline is kept for "
                "the metrics): split the trace",
            )
        records.append(_record(name, number, line_text, seen, max_model_len))
    if not records:
        raise TraceRecordError(name, 0, "workload", "the trace has no records")
    records.sort(key=lambda r: r.arrival_time)
    origin = records[0].arrival_time
    return Workload(lambda: _requests(records, origin, seed, name), len(records))


# A field whose value is one of the constants JSON lacks (NaN, Infinity), as a line has it.
_NON_JSON_FIELD = re.compile(r'"([^"\\]+)"\s*:\s*(-?Infinity|NaN)\b')


def _refused_field(text: str, detail: str) -> tuple[str, str]:
    """(field, detail) for a line the JSON parser refused: the field holding NaN or
    Infinity where there is one (an arrival time of NaN names arrival_time), else the
    whole record."""
    found = _NON_JSON_FIELD.search(text)
    if found is None:
        return "record", detail
    field = named(found.group(1))
    return field, f"field {field!r} must be a finite number, got {found.group(2)} (not JSON)"


def _record(name: str, number: int, text: str, seen: set[str], max_model_len: int) -> _Record:
    try:
        record = parse_json(text, f"{name} line {number}")
    except InputFileError as err:
        raise TraceRecordError(name, number, *_refused_field(text, err.detail)) from None
    if not isinstance(record, dict):
        raise TraceRecordError(name, number, "record", "expected a JSON object")
    line = _Line(name, number, record)
    unknown = sorted(set(record) - set(KNOWN_FIELDS))
    if unknown:
        raise line.fail(named(unknown[0]), f"is not one of {', '.join(KNOWN_FIELDS)}")
    request_id = record.get("request_id", f"line{number}")
    if not isinstance(request_id, str) or not request_id or request_id in seen:
        raise line.fail("request_id", f"must be a unique non-empty string, got {shown(request_id)}")
    seen.add(request_id)
    return _Record(
        number,
        request_id,
        line.arrival_time(),
        line.prompt(max_model_len),
        line.positive_int("output_tokens"),
        line.priority(),
    )


def _requests(
    records: Sequence[_Record], origin: float, seed: int, name: str
) -> Iterator[SimRequest]:
    for r in records:
        prompt = r.prompt
        if isinstance(prompt, int):
            # Each line its own stream: a request's tokens do not depend on the others.
            rng = random.Random(f"{seed}/{r.number}")
            prompt = tuple(rng.choices(range(VOCAB_SIZE), k=prompt))
        yield SimRequest(
            request_id=r.request_id,
            arrival_time=r.arrival_time - origin,
            prompt_token_ids=prompt,
            max_tokens=r.max_tokens,
            priority=r.priority,
            source=f"{name} line {r.number}",
        )


def write_trace(path: Path, requests: Iterable[SimRequest]) -> None:
    """Write requests in the loader's format (token ids kept, so a reload is exact),
    atomically."""
    lines = []
    for r in requests:
        record = {
            "request_id": r.request_id,
            "arrival_time": r.arrival_time,
            "prompt_tokens": list(r.prompt_token_ids),
            "output_tokens": r.max_tokens,
            "priority": r.priority,
        }
        lines.append(json.dumps(record) + "\n")
    write_atomically(path, "".join(lines))
