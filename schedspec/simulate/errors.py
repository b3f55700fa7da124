"""Errors raised where simulation input enters: cost model, workloads, configs."""

from __future__ import annotations

from schedspec.spec import SpecInputError


class SimulationInputError(SpecInputError):
    """Bad simulation input; `field` names the field, the message its bound."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(field, detail)
        self.detail = detail


class TraceRecordError(SimulationInputError):
    """A bad record in a JSONL workload trace; the message names the line and field
    (line 0: the file as a whole)."""

    def __init__(self, path: str, line: int, field: str, detail: str) -> None:
        where = f"{path} line {line}" if line else path
        super().__init__(field, f"{where}: {detail}")
        self.line = line
        # The location first: "trace.jsonl line 4: field 'output_tokens' must be ...".
        self.args = (f"{where}: {detail}",)
