"""The engines a trace can be exported for, and the one call that writes the file."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from schedspec.export.sglang_file import sglang_test_file
from schedspec.export.test_file import Provenance
from schedspec.export.vllm_file import vllm_test_file
from schedspec.traces.trace import Trace

Writer = Callable[[Trace, Provenance, Mapping[str, object]], str]
WRITERS: Mapping[str, Writer] = {"vllm": vllm_test_file, "sglang": sglang_test_file}


def export_command(trace_name: str, engine: str, finding: str, engine_args: list[str]) -> str:
    """The command line that writes the file, as its docstring gives it."""
    words = ["schedspec export-test", trace_name, "--for", engine]
    if finding:
        words += ["--finding", f"'{finding}'"]
    words += [f"--engine-arg {arg}" for arg in engine_args]
    return " ".join(words)


def export_test(
    trace: Trace,
    trace_name: str,
    engine: str,
    finding: str = "",
    engine_args: Mapping[str, object] | None = None,
) -> str:
    """The standalone pytest file for `engine` (a WRITERS name) that replays the trace.
    Raises ExportError naming the trace's field it cannot express."""
    args = dict(engine_args or {})
    shown = [f"{name}={value}" for name, value in args.items()]
    provenance = Provenance(
        trace_name, export_command(trace_name, engine, finding, shown), trace.note, finding
    )
    return WRITERS[engine](trace, provenance, args)
