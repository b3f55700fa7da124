"""A workload from a JSONL trace: one request per line, the shape public traces share.

    {"arrival_time": 0.25, "prompt_tokens": 812, "output_tokens": 97}

arrival_time is in seconds from the start; prompt_tokens is a count (tokens
are then drawn from the seed) or a list of token ids (so a trace can carry
shared prefixes); output_tokens is the number of tokens to generate.
Optional: request_id (a string, unique; default "line<N>"), priority (an
int). Blank lines are skipped. A bad record raises TraceRecordError naming
the line and the field.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from schedspec.simulate.errors import TraceRecordError
from schedspec.simulate.workloads import VOCAB_SIZE, SimRequest

KNOWN_FIELDS = ("arrival_time", "prompt_tokens", "output_tokens", "request_id", "priority")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
            raise self.fail("arrival_time", f"must be a number of seconds, got {value!r}")
        if not math.isfinite(value) or value < 0:
            raise self.fail("arrival_time", f"must be finite and >= 0, got {value!r}")
        return float(value)

    def prompt(self, rng: random.Random) -> tuple[int, ...]:
        value = self.required("prompt_tokens")
        if _is_int(value):
            assert isinstance(value, int)
            if value < 1:
                raise self.fail("prompt_tokens", f"must be >= 1, got {value}")
            return tuple(rng.choices(range(VOCAB_SIZE), k=value))
        if isinstance(value, list) and value and all(_is_int(t) and t >= 0 for t in value):
            return tuple(value)
        raise self.fail(
            "prompt_tokens",
            f"must be a count >= 1 or a non-empty list of token ids >= 0, got {value!r}",
        )

    def positive_int(self, name: str) -> int:
        value = self.required(name)
        if not _is_int(value) or not isinstance(value, int) or value < 1:
            raise self.fail(name, f"must be an integer >= 1, got {value!r}")
        return value


def load_trace(path: Path, seed: int) -> list[SimRequest]:
    """The trace's requests sorted by arrival time (stable for equal times)."""
    rng = random.Random(seed)
    name = str(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise TraceRecordError(name, 0, "workload", f"cannot read: {err}") from None
    requests: list[SimRequest] = []
    seen: set[str] = set()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceRecordError(name, number, "record", f"not JSON: {err.msg}") from None
        if not isinstance(record, dict):
            raise TraceRecordError(name, number, "record", "expected a JSON object")
        line = _Line(name, number, record)
        unknown = sorted(set(record) - set(KNOWN_FIELDS))
        if unknown:
            raise line.fail(unknown[0], f"is not one of {', '.join(KNOWN_FIELDS)}")
        request_id = record.get("request_id", f"line{number}")
        if not isinstance(request_id, str) or not request_id or request_id in seen:
            raise line.fail("request_id", f"must be a unique non-empty string, got {request_id!r}")
        seen.add(request_id)
        priority = record.get("priority", 0)
        if not _is_int(priority):
            raise line.fail("priority", f"must be an integer, got {priority!r}")
        assert isinstance(priority, int)
        requests.append(
            SimRequest(
                request_id=request_id,
                arrival_time=line.arrival_time(),
                prompt_token_ids=line.prompt(rng),
                max_tokens=line.positive_int("output_tokens"),
                priority=priority,
                source=f"{name} line {number}",
            )
        )
    if not requests:
        raise TraceRecordError(name, 0, "workload", "the trace has no records")
    return sorted(requests, key=lambda r: r.arrival_time)


def write_trace(path: Path, requests: list[SimRequest]) -> None:
    """Write requests in the loader's format (token ids kept, so a reload is exact)."""
    with path.open("w") as out:
        for r in requests:
            record = {
                "request_id": r.request_id,
                "arrival_time": r.arrival_time,
                "prompt_tokens": list(r.prompt_token_ids),
                "output_tokens": r.max_tokens,
                "priority": r.priority,
            }
            out.write(json.dumps(record) + "\n")
