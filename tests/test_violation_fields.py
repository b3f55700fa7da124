"""A violation names the field that failed: the helpers that turn a rule over several
fields into one violation per wrong field, and a record that must not change into the
fields that did."""

from __future__ import annotations

import dataclasses

from schedspec.spec.invariants import FieldCheck, changed_fields, field_violations, or_absent
from schedspec.spec.request import RequestStatus
from tests.invariant_builders import assert_actionable, fcfs_preemption


def test_field_violations_reports_only_the_wrong_fields_by_name() -> None:
    found = field_violations(
        "PREEMPT-RESET",
        "not reset",
        "r3",
        [
            FieldCheck("status", "PREEMPTED", "PREEMPTED"),
            FieldCheck("num_computed_tokens", 0, 5),
            FieldCheck("block_ids", (), (4, 7)),
        ],
    )
    assert [(v.message, v.expected, v.actual) for v in found] == [
        ("not reset: num_computed_tokens", 0, 5),
        ("not reset: block_ids", (), (4, 7)),
    ]
    assert all(v.request_id == "r3" for v in found)
    for violation in found:
        assert_actionable(violation)


def test_changed_fields_lists_what_moved_old_value_first() -> None:
    request = fcfs_preemption().pre.requests["B"]
    moved = dataclasses.replace(request, num_computed_tokens=3, status=RequestStatus.WAITING)
    checks = changed_fields(request, moved)
    assert {c.name: (c.expected, c.actual) for c in checks} == {
        "num_computed_tokens": (request.num_computed_tokens, 3),
        "status": (request.status, RequestStatus.WAITING),
    }
    assert changed_fields(request, moved, ignore=["status", "num_computed_tokens"]) == []
    assert changed_fields(request, None) == [FieldCheck("live", True, False)]
    assert changed_fields(request, request) == []


def test_or_absent_spells_none_out() -> None:
    assert or_absent(None, "no hash") == "no hash"
    assert or_absent(0, "no hash") == 0
