"""CI reports for `schedspec check` and `schedspec diff`: outcome, exit code, JSON, JUnit XML.

One RunReport is filled in as a run goes (what it checks, then what it found) and
rendered two ways: a JSON summary for scripts, and JUnit XML for CI front ends (one
testcase per invariant of the profile, one for engine errors, one for the harness,
and for a diff one for the lockstep comparison). It is written however the run ends,
interrupted or failed included (write_reports, atomically). The outcome and exit
code follow one contract for every command (EXIT_CODES, and 128 + the signal for an
interrupt), documented in docs/CI.md. Nothing here depends on click.
"""

from __future__ import annotations

import enum
import json
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedspec.cli.exit_codes import Outcome, error_outcome, exit_code_of, outcome_of
from schedspec.cli.interrupts import interrupt_name
from schedspec.cli.printing.check_report import invariants_of
from schedspec.engines.capabilities import ALL_CAPABILITIES, Capability
from schedspec.engines.watchdog import StepTimeoutError
from schedspec.files import write_atomically
from schedspec.properties.checked_engine import CheckStats, InvariantViolationError
from schedspec.properties.corners import Corner, applicable, shown_corners
from schedspec.properties.differential import failing_side
from schedspec.properties.failure_report import format_event
from schedspec.spec.invariants import InvariantInfo, Profile
from schedspec.traces.divergence import Divergence, show

FORMAT = "schedspec-report"
# Version 2 added the outcomes usage-error, harness-error and interrupted, and the
# fields usage_error, harness_error and interrupted; version 3 added campaign; version 4
# added each violation's rule (and expected and actual are never null).
VERSION = 4


@dataclass
class RunReport:
    """What a CI job needs to know about one run of `check` or `diff`, filled in as the
    run goes: a report written when the run ends early says how far it got."""

    command: str  # "check" or "diff"
    engines: dict[str, str]  # {"engine": name} or {"left": name, "right": name}
    profile: Profile | None  # None: the run ended before a profile was chosen
    seed: int | None
    examples: int = 0  # every example run, shrinking's included
    stats: CheckStats = field(default_factory=CheckStats)
    seconds: float = 0.0
    violation: InvariantViolationError | None = None
    divergence: Divergence | None = None
    # A failure that is not a finding: the engine's (error_outcome) or the harness's.
    error: BaseException | None = None
    usage_error: str | None = None  # a bad flag found once the run had started
    interrupted: KeyboardInterrupt | None = None  # Ctrl-C, SIGTERM or SIGHUP
    trace_path: Path | None = None
    trace_events: int | None = None
    replay_command: str | None = None
    options: dict[str, object] = field(default_factory=dict)
    first_failure_example: int | None = None  # which example the search first failed in
    # A run on several workers or for a time (cli/campaign_run.py): where it ran, what it
    # covered, every distinct failure it kept; None for a run in one process.
    campaign: dict[str, object] | None = None
    # What the engines declare they have (None: the run ended before they were read).
    capabilities: frozenset[Capability] | None = None

    @property
    def outcome(self) -> Outcome:
        if self.usage_error is not None:
            return Outcome.USAGE_ERROR
        if self.error is not None and error_outcome(self.error) is Outcome.HARNESS_ERROR:
            return Outcome.HARNESS_ERROR
        if self.interrupted is not None:
            return Outcome.INTERRUPTED
        return outcome_of(self.violation, self.divergence, self.error)

    @property
    def exit_code(self) -> int:
        return exit_code_of(self.outcome, self.interrupted)

    @property
    def engine_error(self) -> BaseException | None:
        """The error, if the engine is to blame for it (it raised, hung or exited)."""
        if self.error is None or error_outcome(self.error) is Outcome.HARNESS_ERROR:
            return None
        return self.error

    @property
    def harness_error(self) -> BaseException | None:
        """The error, if schedspec itself is to blame for it."""
        if self.error is None or error_outcome(self.error) is not Outcome.HARNESS_ERROR:
            return None
        return self.error


def write_reports(report: RunReport, junit: Path | None, json_path: Path | None) -> list[str]:
    """Write each report asked for, atomically; return a line per report that could not
    be written (the caller says so: the run's outcome stands)."""
    problems = []
    for path, text in ((junit, junit_xml), (json_path, json_text)):
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(path, text(report))
            except OSError as err:
                problems.append(f"could not write the report {path}: {err.strerror or err}")
    return problems


# -------------------------------------------------------------------- JSON


def json_text(report: RunReport) -> str:
    return json.dumps(summary(report), indent=1) + "\n"


def summary(report: RunReport) -> dict[str, Any]:
    stats = report.stats
    failed = _violated(report)
    return {
        "format": FORMAT,
        "version": VERSION,
        "command": report.command,
        "engines": report.engines,
        "profile": report.profile,
        "seed": report.seed,
        "examples": report.examples,
        "first_failure_example": report.first_failure_example,
        "steps": stats.steps,
        "events": stats.events,
        "seconds": round(report.seconds, 3),
        "outcome": report.outcome.value,
        "exit_code": report.exit_code,
        "usage_error": report.usage_error,
        "interrupted": None if report.interrupted is None else interrupt_name(report.interrupted),
        "options": jsonable(report.options),
        "invariants": {
            info.id: {
                "kind": info.kind,
                "profile": info.profile,
                "checked": stats.checks.get(info.id, 0),
                "failures": int(info.id in failed),
            }
            for info in _invariants(report)
        },
        "capabilities": (
            None if report.capabilities is None else sorted(c.value for c in report.capabilities)
        ),
        "corners": {
            c.name: stats.corners.get(c.name, 0)
            for c in _corners(report, stats.corners)
            if applicable(c, _capabilities(report))
        },
        "corners_not_applicable": [
            c.name
            for c in _corners(report, stats.corners)
            if not applicable(c, _capabilities(report))
        ],
        "violations": _violations(report.violation),
        "divergence": _divergence(report.divergence),
        "engine_error": _engine_error(report.engine_error),
        "harness_error": _harness_error(report.harness_error),
        "trace": (
            None
            if report.trace_path is None
            else {"path": str(report.trace_path), "events": report.trace_events}
        ),
        "replay_command": report.replay_command,
        "campaign": jsonable(report.campaign) if report.campaign is not None else None,
    }


def _violations(err: InvariantViolationError | None) -> list[dict[str, Any]]:
    if err is None:
        return []
    return [
        {
            "invariant": v.invariant,
            "message": v.message,
            "text": str(v),
            "request_id": v.request_id,
            "block_id": v.block_id,
            "expected": jsonable(v.expected),
            "actual": jsonable(v.actual),
            "rule": v.rule,
            "event_index": err.event_index,
            "event": format_event(err.event),
            "engine": failing_side(err),  # which one, in a diff
        }
        for v in err.violations
    ]


def _divergence(found: Divergence | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {
        "event_index": found.event_index,
        "event": None if found.event is None else format_event(found.event),
        "step": found.step,
        "observed": found.observed,
        "field": found.field,
        "request_id": found.request_id,
        "path": found.path,
        "left": jsonable(found.left),
        "right": jsonable(found.right),
        "text": found.render(),
    }


def _engine_error(err: BaseException | None) -> dict[str, Any] | None:
    if err is None:
        return None
    return {
        "type": type(err).__name__,
        "message": str(err),
        "hang": isinstance(err, StepTimeoutError),
        "engine": failing_side(err),  # which one, in a diff
        "notes": list(getattr(err, "__notes__", [])),
        "traceback": "".join(traceback.format_exception(err)),
    }


def _harness_error(err: BaseException | None) -> dict[str, Any] | None:
    if err is None:
        return None
    return {
        "type": type(err).__name__,
        "message": str(err),
        "traceback": "".join(traceback.format_exception(err)),
    }


def jsonable(value: object) -> Any:
    """Spec values as JSON: enums by name, sets sorted, tuples as lists."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted((jsonable(v) for v in value), key=str)
    if isinstance(value, tuple | list):
        return [jsonable(v) for v in value]
    return repr(value)


# ------------------------------------------------------------------- JUnit


def junit_xml(report: RunReport) -> str:
    """One testsuite: a testcase per invariant of the profile, then engine errors, (diff)
    the lockstep comparison, and the harness (an error of schedspec's own, a usage error
    found once the run had started, an interrupt). Invariants never checked are skipped."""
    classname = f"schedspec.{report.command}"
    cases: list[ET.Element] = []
    failed = _violated(report)
    for info in _invariants(report):
        case = _case(classname, info.id)
        if info.id in failed and report.violation is not None:
            violation = report.violation
            where = str(violation).splitlines()[0]  # "after event N (Kind):", maybe with a side
            mine = [str(v) for v in violation.violations if v.invariant == info.id]
            lines = [where, *mine, *_trace_lines(report)]
            _child(case, "failure", mine[0], "InvariantViolation", lines)
        elif report.stats.checks.get(info.id, 0) == 0:
            ET.SubElement(case, "skipped", message="never checked in this run")
        cases.append(case)
    errors = _case(classname, "engine-errors")
    if report.engine_error is not None:
        err = report.engine_error
        verb = "hung" if isinstance(err, StepTimeoutError) else "raised"
        text = "".join(traceback.format_exception(err)).rstrip("\n").splitlines()
        message = f"the engine {verb}: {type(err).__name__}: {err}"
        _child(errors, "error", message, type(err).__name__, [*text, *_trace_lines(report)])
    cases.append(errors)
    if report.command == "diff":
        lockstep = _case(classname, "lockstep")
        if report.divergence is not None:
            found = report.divergence
            lines = [
                found.render(),
                f"left  ({report.engines['left']}): {show(found.left)}",
                f"right ({report.engines['right']}): {show(found.right)}",
                *_trace_lines(report),
            ]
            _child(lockstep, "failure", found.render(), "Divergence", lines)
        cases.append(lockstep)
    harness = _case(classname, "harness")
    if report.harness_error is not None:
        err = report.harness_error
        text = "".join(traceback.format_exception(err)).rstrip("\n").splitlines()
        message = f"schedspec itself raised: {type(err).__name__}: {err}"
        _child(harness, "error", message, type(err).__name__, [*text, *_trace_lines(report)])
    elif report.usage_error is not None:
        _child(harness, "error", report.usage_error, "UsageError", [report.usage_error])
    elif report.interrupted is not None:
        message = f"interrupted by {interrupt_name(report.interrupted)}"
        _child(harness, "error", message, "Interrupted", [message, *_trace_lines(report)])
    cases.append(harness)
    return _document(report, cases)


def _document(report: RunReport, cases: list[ET.Element]) -> str:
    counts = {
        "tests": str(len(cases)),
        "failures": str(sum(c.find("failure") is not None for c in cases)),
        "errors": str(sum(c.find("error") is not None for c in cases)),
        "skipped": str(sum(c.find("skipped") is not None for c in cases)),
        "time": f"{report.seconds:.3f}",
    }
    root = ET.Element("testsuites", {"name": "schedspec", **counts})
    engines = " vs ".join(report.engines.values())
    name = f"schedspec {report.command} {engines}"
    suite = ET.SubElement(root, "testsuite", {"name": name, **counts})
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("profile", report.profile),
        ("seed", report.seed),
        ("examples", report.examples),
        ("steps", report.stats.steps),
        ("outcome", report.outcome.value),
        ("trace", report.trace_path),
        *((f"engine.{k}", v) for k, v in report.engines.items()),
    ):
        if value is not None:
            ET.SubElement(properties, "property", name=name, value=str(value))
    suite.extend(cases)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _case(classname: str, name: str) -> ET.Element:
    return ET.Element("testcase", classname=classname, name=name, time="0")


def _child(case: ET.Element, tag: str, message: str, kind: str, lines: list[str]) -> None:
    element = ET.SubElement(case, tag, message=message, type=kind)
    element.text = "\n".join(lines)


def _trace_lines(report: RunReport) -> list[str]:
    lines = []
    if report.trace_path is not None:
        lines.append(f"trace: {report.trace_path} ({report.trace_events} events)")
    if report.replay_command is not None:
        lines.append(f"replay it: {report.replay_command}")
    return lines


def _violated(report: RunReport) -> set[str]:
    return {v.invariant for v in report.violation.violations} if report.violation else set()


def _corners(report: RunReport, counts: Mapping[str, int]) -> tuple[Corner, ...]:
    return shown_corners(counts, report.profile or "safety")


def _capabilities(report: RunReport) -> frozenset[Capability]:
    return ALL_CAPABILITIES if report.capabilities is None else report.capabilities


def _invariants(report: RunReport) -> list[InvariantInfo]:
    return [] if report.profile is None else invariants_of(report.profile)
