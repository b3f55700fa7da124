"""Assumptions the admission loop (gpu_impl/admission.py) makes about the state's codes."""

from __future__ import annotations

from schedspec.gpu_impl.batch_state import EMPTY, PREEMPTED, RUNNING, WAITING


def test_the_queued_status_codes_are_exactly_the_odd_ones() -> None:
    # StepPlan.start counts and _admit_heads finds queued requests by `status & 1`.
    assert [code & 1 for code in (EMPTY, WAITING, RUNNING, PREEMPTED)] == [0, 1, 0, 1]
