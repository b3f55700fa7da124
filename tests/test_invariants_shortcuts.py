"""Shortcuts inside the step checks give the answer of the full check they stand in for.

CACHE-CONTENT skips reading each table's hashes before the step when the step left the
hash tuple as it was (safety/schedule.py). Here the shortcut and the full path meet on
the schedule transitions of real reference runs and on corruptions of them that keep the
hash tuples equal on both sides (a stale entry, a table pointed at another block), so
the shortcut is taken on bad transitions too.

Several step checks pass over a request the step did not schedule whose record is the
very object on both sides (the reference's snapshots share unchanged records). Those
checks meet themselves on the same transitions with every pre record a copy, on real
runs and on corruptions that change one record or keep one as it was.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest, Step
from schedspec.properties.checked_engine import CheckedEngine, CheckStats
from schedspec.properties.strategies.actions import RequestDraw, request_draws
from schedspec.properties.strategies.configs import configs
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import CHECKS, Kind, ScheduleTransition, UpdateTransition, Violation
from schedspec.spec.invariants.safety.schedule import _held_blocks_carry_own_hashes
from tests.invariant_builders import with_kv, with_request
from tests.sched_helpers import add_drawn, make_config


class _Recording(CheckedEngine):
    """A CheckedEngine that keeps every schedule transition it checks."""

    transitions: list[ScheduleTransition]

    def _run(self, kind: Kind, subject: object) -> list[Violation]:
        if kind == "schedule":
            assert isinstance(subject, ScheduleTransition)
            self.transitions.append(subject)
        return super()._run(kind, subject)


def _same_hashes_corruptions(t: ScheduleTransition) -> list[ScheduleTransition]:
    """Bad transitions whose pre and post hash tuples stay equal: a held block's hash
    changed on both sides (a stale entry), and a table pointed at another block."""
    out: list[ScheduleTransition] = []
    kv = t.post.kv
    if kv.block_hashes != t.pre.kv.block_hashes:
        return out
    for rid, request in t.post.requests.items():
        for block in request.block_ids[:2]:
            for wrong in (None, 12345, -7):
                hashes = list(kv.block_hashes)
                hashes[block] = wrong
                pre = with_kv(t.pre, block_hashes=tuple(hashes))
                post = with_kv(t.post, block_hashes=tuple(hashes))
                out.append(dataclasses.replace(t, pre=pre, post=post))
        if request.block_ids and kv.num_blocks > 1:
            moved = ((request.block_ids[0] + 1) % kv.num_blocks, *request.block_ids[1:])
            out.append(dataclasses.replace(t, post=with_request(t.post, rid, block_ids=moved)))
    return out


def _both_ways(t: ScheduleTransition) -> tuple[list[str], list[str]]:
    return (
        [str(v) for v in _held_blocks_carry_own_hashes(t)],
        [str(v) for v in _held_blocks_carry_own_hashes(t, shortcut=False)],
    )


@given(
    config=configs(),
    draws=st.lists(request_draws, min_size=1, max_size=6),
    num_steps=st.integers(1, 8),
)
def test_cache_content_shortcut_gives_the_full_answer(
    config: SchedulerConfig, draws: list[RequestDraw], num_steps: int
) -> None:
    checked = _Recording(reference_engine(config), config, "vllm-v1", stats=CheckStats())
    checked.transitions = []
    for index, drawn in enumerate(draws):
        add_drawn(checked, config, index, drawn)
    for _ in range(num_steps):
        checked.apply(Step())
    for t in checked.transitions:
        for case in [t, *_same_hashes_corruptions(t)]:
            shortcut, full = _both_ways(case)
            assert shortcut == full


def test_the_corruptions_take_the_shortcut_and_fail() -> None:
    """The test has teeth: some corruption keeps the hash tuples equal and breaks
    CACHE-CONTENT, so the shortcut is exercised on a bad transition."""
    config = make_config(enable_prefix_caching=True)
    checked = _Recording(reference_engine(config), config, "vllm-v1", stats=CheckStats())
    checked.transitions = []
    checked.apply(AddRequest("r0", tuple(range(10, 19)), max_tokens=4))
    for _ in range(3):
        checked.apply(Step())
    found = [
        shortcut
        for t in checked.transitions
        for case in _same_hashes_corruptions(t)
        if case.pre.kv.block_hashes == case.post.kv.block_hashes
        for shortcut, _ in [_both_ways(case)]
        if shortcut
    ]
    assert found


# The step checks that pass over a request whose record is the very object on both sides
# of the transition (the reference shares unchanged records between snapshots) when the
# step did not schedule it; and CACHE-CONTENT, which passes over a request with no block.
RECORD_SHORTCUTS = {
    "schedule": ("MONOTONE", "SCHEDULE-PIPELINE", "CACHE-CONTENT"),
    "update": ("STOP", "ROLLBACK", "UPDATE-FRAME", "UPDATE-PIPELINE", "DELIVERY"),
}


class _RecordingSteps(CheckedEngine):
    """A CheckedEngine that keeps every schedule and update transition it checks."""

    steps: list[tuple[Kind, ScheduleTransition | UpdateTransition]]

    def _run(self, kind: Kind, subject: object) -> list[Violation]:
        if isinstance(subject, ScheduleTransition | UpdateTransition):
            self.steps.append((kind, subject))
        return super()._run(kind, subject)


def _unshared(t: ScheduleTransition | UpdateTransition) -> ScheduleTransition | UpdateTransition:
    """The transition with every pre record a copy: equal, never the post's very record."""
    copies = {rid: dataclasses.replace(r) for rid, r in t.pre.requests.items()}
    return dataclasses.replace(t, pre=dataclasses.replace(t.pre, requests=copies))


def _one_record_changed(
    t: ScheduleTransition | UpdateTransition,
) -> list[ScheduleTransition | UpdateTransition]:
    """Bad transitions in which one post record changed and the others stay shared, or in
    which one request's post record is its very pre record (a step that left it as it
    was, scheduled or not)."""
    out: list[ScheduleTransition | UpdateTransition] = []
    for rid, post in t.post.requests.items():
        pre = t.pre.requests.get(rid)
        if pre is not None and pre is not post:
            kept = {**t.post.requests, rid: pre}
            out.append(dataclasses.replace(t, post=dataclasses.replace(t.post, requests=kept)))
        for changes in (
            {"num_computed_tokens": post.num_computed_tokens + 1},
            {"num_in_flight_tokens": post.num_in_flight_tokens + 1},
            {"output_token_ids": (*post.output_token_ids, 7)},
            {"priority": post.priority + 1},
        ):
            out.append(dataclasses.replace(t, post=with_request(t.post, rid, **changes)))
    return out


def _record_shortcut_answers(
    kind: Kind, t: ScheduleTransition | UpdateTransition
) -> tuple[list[str], list[str]]:
    ids = RECORD_SHORTCUTS[kind]
    shared = [str(v) for i in ids for v in CHECKS[i](t)]
    unshared = [str(v) for i in ids for v in CHECKS[i](_unshared(t))]
    return shared, unshared


@given(
    config=configs(),
    draws=st.lists(request_draws, min_size=1, max_size=6),
    num_steps=st.integers(1, 8),
)
def test_shared_record_shortcuts_give_the_full_answer(
    config: SchedulerConfig, draws: list[RequestDraw], num_steps: int
) -> None:
    checked = _RecordingSteps(reference_engine(config), config, "vllm-v1", stats=CheckStats())
    checked.steps = []
    for index, drawn in enumerate(draws):
        add_drawn(checked, config, index, drawn)
    for _ in range(num_steps):
        checked.apply(Step())
    for kind, t in checked.steps:
        for case in [t, *_one_record_changed(t)]:
            shared, unshared = _record_shortcut_answers(kind, case)
            assert shared == unshared


def test_the_record_shortcuts_are_taken_on_bad_transitions() -> None:
    """The test has teeth: a run whose steps pass over shared records of waiting requests,
    with another record changed, breaks some of these invariants."""
    config = make_config(max_num_seqs=1)
    checked = _RecordingSteps(reference_engine(config), config, "vllm-v1", stats=CheckStats())
    checked.steps = []
    checked.apply(AddRequest("r0", tuple(range(10, 19)), max_tokens=4))
    checked.apply(AddRequest("r1", tuple(range(20, 29)), max_tokens=4))
    for _ in range(3):
        checked.apply(Step())
    taken = [
        shared
        for kind, t in checked.steps
        if any(t.pre.requests[rid] is r for rid, r in t.post.requests.items())
        for case in _one_record_changed(t)
        for shared, _ in [_record_shortcut_answers(kind, case)]
        if shared
    ]
    assert {kind for kind, _ in checked.steps} == {"schedule", "update"}
    assert taken
