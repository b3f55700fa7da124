"""What `schedspec diff` and `schedspec diff-replay` print: a lockstep replay, side by side.

Each event of the trace, then each engine's schedule() outputs under it:
one `both` line where the two agree, a `left` and a `right` line where they
do not, and a `^` line at the first failure. Nothing here depends on click.
"""

from __future__ import annotations

from schedspec.engines.protocol import EngineFactory
from schedspec.properties.differential import DiffOptions, DiffResult, diff_trace
from schedspec.properties.failure_report import (
    INDENT,
    counterexample_title,
    crash_report,
    format_config,
    format_event,
    format_output,
)
from schedspec.properties.suite import SuiteResult
from schedspec.spec import SchedulerOutput
from schedspec.traces.divergence import Divergence, show
from schedspec.traces.trace import Trace


def divergence_header(found: Divergence, left_name: str, right_name: str) -> list[str]:
    """The divergence, with each side's value on a line of its own."""
    left, right = f"left  ({left_name}):", f"right ({right_name}):"
    width = max(len(left), len(right))
    return [
        f"DIVERGENCE {found.where}, {found.observed}: {found.path} differs",
        f"  {left:<{width}} {show(found.left)}",
        f"  {right:<{width}} {show(found.right)}",
    ]


def format_diff_log(result: DiffResult) -> list[str]:
    lines: list[str] = []
    for entry in result.entries:
        lines.append(f"  #{entry.index} {format_event(entry.event)}")
        left, right = entry.outputs
        shown = len(left) if len(left) == len(right) else min(len(left), len(right)) + 1
        last = entry is result.entries[-1]
        if last and result.divergence is not None:
            shown = min(shown, result.divergence.step + 1)  # a drain runs on past it
        for index in range(min(shown, max(len(left), len(right)))):
            lines += _pair(_at(left, index), _at(right, index))
    return lines + _failure_lines(result)


def _at(outputs: list[SchedulerOutput], index: int) -> str:
    return format_output(outputs[index]) if index < len(outputs) else "(no step)"


def _pair(left: str, right: str) -> list[str]:
    if left == right:
        return [f"{INDENT}both   {left}"]
    return [f"{INDENT}left   {left}", f"{INDENT}right  {right}"]


def _failure_lines(result: DiffResult) -> list[str]:
    if result.divergence is not None:
        found = result.divergence
        return [
            f"{INDENT}^ {found.observed}: {found.path} differs: "
            f"left {show(found.left)}, right {show(found.right)}"
        ]
    if result.violation is not None:
        side = getattr(result.violation, "side", "")
        return [f"{INDENT}^ ({side} engine) {v}" for v in result.violation.violations]
    if result.error is not None:
        lines = crash_report(result.error)
        return [f"{INDENT}^ {lines[0]}", *(f"{INDENT}{line}" for line in lines[1:])]
    return []


def diff_failure_report(
    result: SuiteResult,
    left: EngineFactory,
    right: EngineFactory,
    names: tuple[str, str],
    options: DiffOptions,
) -> list[str]:
    """A failed diff run: what failed, then the counterexample replayed on both engines."""
    if result.divergence is not None:
        lines = divergence_header(result.divergence.divergence, *names)
    elif result.error is not None:
        lines = [f"VIOLATION {result.error}"]
    else:
        assert result.other_error is not None
        lines = crash_report(result.other_error)
    trace = result.trace
    if trace is None:
        return lines
    lines += ["", f"{counterexample_title(result)}, in lockstep:"]
    lines += [f"  {line}" for line in format_config(trace.config, trace.model)]
    replayed = diff_trace(trace, left, right, result.profile, options)
    lines += format_diff_log(replayed)
    if replayed.passed:
        lines.append("  (the replay did not fail again: are the engines deterministic?)")
    if result.trace_path is not None:
        lines += ["", f"trace written to {result.trace_path}"]
    return lines


def replay_header(trace: Trace) -> list[str]:
    lines = [f"  {line}" for line in format_config(trace.config, trace.model)]
    if trace.note:  # what the run that wrote the trace saw
        lines.append("recorded failure: " + trace.note.replace("\n", "\n  "))
    return lines
