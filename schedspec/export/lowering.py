"""A trace's events as the body of a test: one call of the generated file's helpers an
event, in order, whatever the engine (each engine's file defines the helpers: add_request,
step, abort, propose_drafts, drain; vllm_file.py and sglang_file.py).

What cannot be lowered is refused where it is met, naming the trace's field
(ExportError): a KV connector's events, drafts for an engine that takes none. A request
the spec's door refuses is left out with a comment saying why: the generated test drives
the scheduler below the engine's front end, which refuses it first.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from schedspec.engines.events import Abort, AddRequest, Drain, Event, ProposeDrafts, Step
from schedspec.export.source import INDENT, LINE_LENGTH, call, literal
from schedspec.spec import (
    ConfigError,
    RequestError,
    SchedulerConfig,
    SpecInputError,
    validate_new_request,
)
from schedspec.spec.invariants import drain_step_bound


class ExportError(SpecInputError):
    """A trace that cannot be written as a test for the engine: the field at fault, why."""


@dataclass(frozen=True)
class Lowering:
    """What the engine's file can express of a trace."""

    engine: str  # as messages name it: "vLLM", "SGLang"
    family: str  # the policy family of the traces it takes
    loop: str  # how the file steps the engine, for the refusal of async scheduling
    takes_drafts: bool


def config_refusal(
    config: SchedulerConfig, how: Lowering, adapter_refusal: ConfigError | None
) -> ExportError | None:
    """Why the trace's config cannot be the engine's file (the field at fault), or None:
    another family, async scheduling, a KV connector, or what the engine's adapter
    refuses (`adapter_refusal`)."""
    if config.family != how.family:
        return ExportError("config.family", f"{config.family!r}: not {how.engine}'s policy family")
    if config.async_scheduling:
        return ExportError("config.async_scheduling", f"True: the exported test {how.loop}")
    if config.kv_connector:
        return ExportError("config.kv_connector", "a KV connector's test is not exported")
    if adapter_refusal is not None:
        return ExportError(f"config.{adapter_refusal.field}", str(adapter_refusal))
    return None


def body_lines(
    config: SchedulerConfig, events: tuple[Event, ...], how: Lowering, failed_at: int | None
) -> list[str]:
    """The test function's body: `run` is the engine under test, already started.
    failed_at: the event where schedspec saw the failure, marked with a comment."""
    lines: list[str] = []
    added = 0
    for index, event in enumerate(events):
        where = f"events[{index}]"
        if index == failed_at:
            lines.append(
                f"{INDENT}# schedspec saw the failure at this event (the docstring's note)."
            )
        if isinstance(event, AddRequest):
            lines += _add_request(config, event, where)
            added += 1
        elif isinstance(event, Step):
            lines += _step(event, where, how)
        elif isinstance(event, Abort):
            lines += call("abort", ["run", literal(event.request_ids)], INDENT)
        elif isinstance(event, ProposeDrafts):
            lines += _propose_drafts(event, where, how)
        elif isinstance(event, Drain):
            # Every request added may still be unfinished: the spec's bound for that many.
            bound = drain_step_bound(config, added)
            lines += call("drain", ["run", f"max_steps={bound}"], INDENT)
    return lines


def _add_request(config: SchedulerConfig, event: AddRequest, where: str) -> list[str]:
    if event.remote_kv is not None:
        raise ExportError(f"{where}.remote_kv", "a KV connector's transfer is not exported")
    try:
        validate_new_request(event.to_request(), config)
    except RequestError as err:
        # The engine's front end refuses it before its scheduler sees it, as the spec's
        # door does (DOOR): the scheduler's test has nothing to do.
        why = f"{where}: request {event.request_id!r} left out, the front end refuses it: {err}"
        return textwrap.wrap(
            why, LINE_LENGTH, initial_indent=f"{INDENT}# ", subsequent_indent=f"{INDENT}# "
        )
    args = ["run", literal(event.request_id), "@list", f"max_tokens={event.max_tokens}"]
    if event.priority:
        args.append(f"priority={event.priority}")
    if event.eos_token_id is not None:
        args.append(f"eos_token_id={event.eos_token_id}")
    if event.stop_token_ids:
        args.append(f"stop_token_ids={literal(event.stop_token_ids)}")
    return call("add_request", args, INDENT, event.prompt_token_ids)


def _step(event: Step, where: str, how: Lowering) -> list[str]:
    if event.kv:
        raise ExportError(f"{where}.kv", "a KV connector's transfer is not exported")
    decisions = event.decisions
    if decisions.accepted and not how.takes_drafts:
        raise ExportError(f"{where}.accepted", f"{how.engine} takes no drafts")
    args = ["run"]
    if decisions.accepted:
        args.append(f"accepted={literal(dict(decisions.accepted))}")
    if decisions.stops:
        args.append(f"stops={literal(dict(decisions.stops))}")
    if event.aborts:
        args.append(f"aborts={literal(event.aborts)}")
    return call("step", args, INDENT)


def _propose_drafts(event: ProposeDrafts, where: str, how: Lowering) -> list[str]:
    counts = {rid: n for rid, n in event.num_drafts.items() if n}
    if not counts:
        return []  # nothing proposed: the engine's call would change nothing
    if not how.takes_drafts:
        raise ExportError(f"{where}.num_drafts", f"{how.engine} takes no drafts")
    return call("propose_drafts", ["run", literal(dict(event.num_drafts))], INDENT)
