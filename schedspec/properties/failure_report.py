"""How a failure is shown: the violation or the crash, then the counterexample replayed
step by step with what the engine scheduled, and where its trace went.

`schedspec check` and `replay`, the lockstep reports of `diff` and the pytest
plugin all print failures through these functions. Nothing here depends on
click or pytest.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Iterable, Mapping

from schedspec.engines.boundary import guarded
from schedspec.engines.errors import EngineContractError, EngineHalt, engine_call_of
from schedspec.engines.events import Abort, AddRequest, Event, ProposeDrafts, Step
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.watchdog import StepTimeoutError
from schedspec.properties.replay_log import ReplayLog, replay_with_log
from schedspec.properties.suite import SuiteResult
from schedspec.spec import SchedulerConfig, SchedulerOutput
from schedspec.traces.trace import ModelParams

PROMPT_SHOWN = 12  # prompt tokens printed before eliding the rest
INDENT = "      "  # lines under an event: what the engine did, what broke
# This many identical events in a row (the same event, the engine doing the same with it:
# a request decoding alone for many steps) print as one, with their index range.
MERGED_RUN = 3


def failure_report(result: SuiteResult, factory: EngineFactory, engine_name: str) -> list[str]:
    """A failed suite run: the violation (or the crash's traceback), then the counterexample
    replayed step by step with the engine's decisions, and where its trace went."""
    if result.other_error is not None:
        lines = crash_report(result.other_error)
    else:
        lines = [f"VIOLATION {result.error}"]
    trace = result.trace
    if trace is None:  # run_suite records one with every failure of the engine itself
        return lines
    lines += ["", f"{counterexample_title(result)}, replayed:"]
    lines += [f"  {line}" for line in format_config(trace.config, trace.model)]
    try:
        engine = guarded(factory)(trace.config)
    except (Exception, EngineHalt) as err:
        return [*lines, *(f"  {line}" for line in crash_report(err))]
    log = replay_with_log(trace, engine, result.profile)
    lines += format_log(log)
    if not log.failed:
        lines.append("  (the replay did not fail again: is the engine deterministic?)")
    if result.trace_path is not None:
        lines += [
            "",
            f"trace written to {result.trace_path}",
            f"replay it: schedspec replay {result.trace_path} "
            f"--engine {engine_name} --profile {result.profile}",
        ]
    return lines


def counterexample_title(result: SuiteResult) -> str:
    events = plural(len(result.trace.events), "event") if result.trace else "no events"
    if isinstance(result.other_error, StepTimeoutError):
        # run_suite does not shrink a hang: every try would wait out the limit.
        return f"Counterexample ({events}, not shrunk: a hang)"
    if result.interrupted is not None:
        return f"Counterexample ({events}, as far as it was shrunk when interrupted)"
    return f"Shrunk counterexample ({events})"


def crash_report(err: BaseException) -> list[str]:
    """A failure that is not a finding, by whose it is: the engine's (it hung, tried to end
    the process, or raised in one of its calls) or schedspec's own."""
    if isinstance(err, StepTimeoutError):
        return [f"the engine hung: {err}; stopped here:", *_indent(err)]
    call = engine_call_of(err)
    if call is None:
        return [
            "schedspec itself raised (a harness error: a bug in schedspec, not a finding "
            "about the engine):",
            *_indent(err),
        ]
    if isinstance(err, EngineHalt):  # it tried to end the process, or ended its worker
        return [f"{err}:", *_indent(err)]
    if isinstance(err, EngineContractError):
        return [f"the engine broke the adapter protocol in {call}:", *_indent(err)]
    return [f"the engine raised in {call}:", *_indent(err)]


def _indent(err: BaseException) -> list[str]:
    return [f"  {line}" for line in format_crash(err)]


def format_config(config: SchedulerConfig, model: ModelParams) -> list[str]:
    fields = " ".join(f"{k}={v}" for k, v in config.own_fields().items())
    params = " ".join(f"{k}={v}" for k, v in dataclasses.asdict(model).items())
    return [f"config: {fields}", f"model: {params}"]


def _ids_counts(counts: Mapping[str, int]) -> str:
    return " ".join(f"{rid}={n}" for rid, n in counts.items()) or "-"


def format_event(event: Event) -> str:
    if isinstance(event, AddRequest):
        prompt = ", ".join(map(str, event.prompt_token_ids[:PROMPT_SHOWN]))
        if len(event.prompt_token_ids) > PROMPT_SHOWN:
            prompt += ", ..."
        text = (
            f"add_request {event.request_id!r} prompt=[{prompt}] "
            f"({plural(len(event.prompt_token_ids), 'token')}) max_tokens={event.max_tokens}"
        )
        if event.eos_token_id is not None:
            text += f" eos={event.eos_token_id}"
        if event.stop_token_ids:
            text += f" stop={list(event.stop_token_ids)}"
        return text + (f" priority={event.priority}" if event.priority else "")
    if isinstance(event, Abort):
        return "abort " + ", ".join(repr(r) for r in event.request_ids)
    if isinstance(event, ProposeDrafts):
        return "propose_drafts " + _ids_counts(event.num_drafts)
    if isinstance(event, Step):
        decided = event.decisions
        text = "step"
        if decided.stops:
            text += " stops: " + _ids_counts(decided.stops)
        if decided.accepted:
            text += " accepted: " + _ids_counts(decided.accepted)
        if event.aborts:
            text += " aborts in flight: " + ", ".join(repr(r) for r in event.aborts)
        return text
    return "drain (step with no arrivals until nothing is unfinished)"


def format_output(output: SchedulerOutput) -> str:
    """One schedule() result: per-request tokens, the claimed total, preempted, finished."""
    spec = {r: len(d) for r, d in output.scheduled_spec_decode_tokens.items() if d}
    text = f"scheduled: {_ids_counts(output.num_scheduled_tokens)}"
    text += f" (total {output.total_num_scheduled_tokens})"
    if spec:
        text += f" drafts: {_ids_counts(spec)}"
    text += f" | preempted: {_ids(output.preempted_req_ids)}"
    return text + f" | finished: {_ids(output.finished_req_ids)}"


def _ids(request_ids: Iterable[str]) -> str:
    # Shortest first puts the harness's ids r2 before r10.
    return ", ".join(sorted(request_ids, key=lambda r: (len(r), r))) or "-"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def format_log(log: ReplayLog, last: int | None = None) -> list[str]:
    """The replayed events with what the engine did, and what broke; with `last`, only
    the last that many events (a long trace's earlier ones held every invariant, or the
    replay would have stopped there), after a line saying how many are left out."""
    lines: list[str] = []
    entries = log.entries
    if last is not None and len(entries) > last:
        left_out = len(entries) - last
        lines.append(f"  ... {plural(left_out, 'earlier event')} not shown")
        entries = entries[left_out:]
    shown = [
        (entry.index, format_event(entry.event), [format_output(o) for o in entry.outputs])
        for entry in entries
    ]
    start = 0
    while start < len(shown):
        index, event, outputs = shown[start]
        end = start + 1
        while end < len(shown) and shown[end][1:] == (event, outputs):
            end += 1
        if end - start >= MERGED_RUN:
            lines.append(f"  #{index}-#{shown[end - 1][0]} {event} ({end - start} alike)")
        else:
            end = start + 1
            lines.append(f"  #{index} {event}")
        lines += [f"{INDENT}{output}" for output in outputs]
        start = end
    if log.violation is not None:
        lines += [f"{INDENT}^ {v}" for v in log.violation.violations]
    if log.crash is not None:
        lines += [f"{INDENT}^ {line}" for line in crash_report(log.crash)[:1]]
        lines += [f"{INDENT}{line}" for line in _indent(log.crash)]
    return lines


def format_crash(err: BaseException) -> list[str]:
    """The last few frames and the exception: enough to find the line, short enough to read."""
    text = "".join(traceback.format_exception(err, limit=-4))
    return text.rstrip("\n").splitlines()
