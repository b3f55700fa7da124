"""Transition invariants of the safety profile are not vacuous: add_request (DOOR),
schedule(), update_from_output(), finish_requests() and the end of a drain.

Each case runs the reference scheduler to a chosen moment, captures the real
transition (which holds), and corrupts the output or the post state the way a buggy
engine would (which must fail, naming the request or block at fault).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import Abort, AddRequest, ProposeDrafts, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.properties.checked_engine import CheckedEngine
from schedspec.spec import (
    CachedRequestData,
    NewRequestData,
    RequestError,
    SchedulerOutput,
    State,
)
from schedspec.spec.invariants import (
    CATALOGUE,
    CHECKS,
    DrainResult,
    PassedOver,
    ScheduleTransition,
)
from tests.invariant_builders import (
    Case,
    CaseBuilder,
    CaseRegistry,
    Driver,
    assert_caught,
    assert_holds,
    fcfs_preemption,
    tokens,
    two_running_and_an_admission,
    with_block_hash,
    with_config,
    with_kv,
    with_output,
    with_ref_count,
    with_request,
    with_scheduled,
    without_request,
)
from tests.sched_helpers import make_config

cases = CaseRegistry()
EMPTY_OUTPUT = SchedulerOutput((), (), {}, 0, {}, frozenset(), frozenset())  # nothing scheduled


# --------------------------------------------------------------------- DOOR


@cases("DOOR")
def case_accepts_a_request_the_spec_refuses() -> Case:
    driver = Driver()
    driver.add("A")
    good = driver.add("E", prompt=())  # the reference refuses the empty prompt
    assert isinstance(good.refusal, RequestError)
    bad = dataclasses.replace(good, refusal=None)
    return Case(
        "DOOR",
        good,
        bad,
        "accepted a request the spec refuses: prompt_token_ids: request 'E': "
        "the prompt must not be empty",
        request_id="E",
    )


@cases("DOOR")
def case_accepts_a_prompt_that_can_never_run() -> Case:
    # #39734: a request that can never be served must be refused at the door, not
    # left to wedge the queue.
    driver = Driver(max_model_len=32)
    good = driver.add("L", 32)
    assert good.refusal is not None
    bad = dataclasses.replace(good, refusal=None)
    return Case("DOOR", good, bad, "must be shorter than max_model_len (32)", request_id="L")


@cases("DOOR")
def case_accepts_a_live_duplicate_id() -> Case:
    driver = Driver()
    driver.add("A")
    good = driver.add("A")
    assert good.refusal is not None
    bad = dataclasses.replace(good, refusal=None)
    return Case(
        "DOOR",
        good,
        bad,
        "accepted a request the spec refuses: duplicate request id 'A'",
        request_id="A",
    )


@cases("DOOR")
def case_refuses_an_admissible_request() -> Case:
    driver = Driver()
    good = driver.add("A")
    bad = dataclasses.replace(good, refusal=RuntimeError("queue full"), post=good.pre)
    return Case("DOOR", good, bad, "refused an admissible request: queue full", request_id="A")


@cases("DOOR")
def case_refuses_with_the_wrong_exception() -> Case:
    driver = Driver()
    good = driver.add("E", prompt=())
    bad = dataclasses.replace(good, refusal=KeyError("E"))
    return Case("DOOR", good, bad, "refused with KeyError, not ValueError", request_id="E")


@cases("DOOR")
def case_refusal_changes_the_state() -> Case:
    driver = Driver()
    good = driver.add("E", prompt=())
    changed = driver.add("A").post
    bad = dataclasses.replace(good, post=changed)
    return Case("DOOR", good, bad, "a refused request changed the state", request_id="E")


@cases("DOOR")
def case_accepted_request_not_waiting() -> Case:
    driver = Driver()
    good = driver.add("A")
    bad = dataclasses.replace(good, post=without_request(good.post, "A"))
    return Case(
        "DOOR", good, bad, "accepted request is not a fresh WAITING request", request_id="A"
    )


@cases("DOOR")
def case_accepted_request_already_computed() -> Case:
    driver = Driver()
    good = driver.add("A")
    bad = dataclasses.replace(good, post=with_request(good.post, "A", num_computed_tokens=4))
    return Case(
        "DOOR", good, bad, "accepted request is not a fresh WAITING request", request_id="A"
    )


@cases(
    "DOOR",
)
def case_accepted_request_jumps_the_queue() -> Case:
    driver = Driver(max_num_seqs=1)
    driver.add("A")
    driver.add("B")
    driver.step()  # A runs, B waits
    good = driver.add("C")
    assert good.post.waiting == ("B", "C")
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("C", "B")))
    return Case("DOOR", good, bad, "", request_id="C")


# ------------------------------------------------------------------- BUDGET


@cases("BUDGET")
def case_over_the_token_budget() -> Case:
    good = two_running_and_an_admission()
    bad = with_scheduled(good, {"A": 1, "B": 1, "C": 15})
    return Case("BUDGET", good, bad, "step over the token budget", expected=16, actual=17)


@cases("BUDGET")
def case_total_is_not_the_sum() -> Case:
    good = two_running_and_an_admission()
    bad = with_output(good, total_num_scheduled_tokens=11)
    return Case(
        "BUDGET",
        good,
        bad,
        "total_num_scheduled_tokens is not the sum of the entries",
        expected=12,
        actual=11,
    )


@cases("BUDGET")
def case_zero_token_entry() -> Case:
    good = two_running_and_an_admission()
    bad = with_scheduled(good, {"A": 1, "B": 0, "C": 10})
    return Case("BUDGET", good, bad, "scheduled 0 tokens", request_id="B")


@cases("BUDGET")
def case_scheduled_but_not_running() -> Case:
    good = two_running_and_an_admission()
    bad = dataclasses.replace(
        good, post=dataclasses.replace(good.post, running=("A", "B"), waiting=("C",))
    )
    return Case("BUDGET", good, bad, "scheduled but not running", request_id="C")


# ------------------------------------------------------------- NO-OVERSHOOT


@cases("NO-OVERSHOOT")
def case_past_the_known_tokens() -> Case:
    good = two_running_and_an_admission()
    bad = with_scheduled(good, {"A": 2, "B": 1, "C": 10})
    # A: 6 computed of 7 tokens, no drafts; 6 + 2 = 8.
    return Case(
        "NO-OVERSHOOT",
        good,
        bad,
        "past the known tokens and drafts",
        request_id="A",
        expected=7,
        actual=8,
    )


def drafts_near_max_model_len() -> ScheduleTransition:
    """A (10 tokens, 9 computed, 2 drafts) one token below max_model_len 12: the step
    may run the last known token and one draft only."""
    driver = Driver(max_model_len=12, num_speculative_tokens=2)
    driver.add("A", 9)
    driver.step()
    driver.propose({"A": [11, 12]})
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"A": 2}
    assert dict(t.output.scheduled_spec_decode_tokens) == {"A": (11,)}
    return t


@cases("NO-OVERSHOOT")
def case_no_room_below_max_model_len() -> Case:
    good = drafts_near_max_model_len()
    bad = with_output(with_scheduled(good, {"A": 3}), scheduled_spec_decode_tokens={"A": (11, 12)})
    return Case(
        "NO-OVERSHOOT",
        good,
        bad,
        "no room for the sampled token below max_model_len",
        request_id="A",
        expected=11,
        actual=12,
    )


# ----------------------------------------------------------------- KV-COVER


@cases("KV-COVER")
def case_table_too_short() -> Case:
    good = two_running_and_an_admission()
    c = good.post.requests["C"]
    assert len(c.block_ids) == 3  # 10 tokens, block_size 4
    bad = dataclasses.replace(good, post=with_request(good.post, "C", block_ids=c.block_ids[:2]))
    return Case("KV-COVER", good, bad, "table too short", request_id="C", expected=10, actual=8)


@cases("KV-COVER")
def case_no_lookahead_slots() -> Case:
    # With 2 lookahead tokens, A (11 computed after the step) needs 13 slots: 4 blocks.
    good = drafts_near_max_model_len()
    a = good.post.requests["A"]
    assert len(a.block_ids) == 3
    bad = dataclasses.replace(good, post=with_request(good.post, "A", block_ids=a.block_ids[:2]))
    return Case("KV-COVER", good, bad, "table too short", request_id="A", expected=12, actual=8)


# ----------------------------------------------------------------- MONOTONE


@cases("MONOTONE")
def case_computed_moved_by_other_than_scheduled() -> Case:
    good = two_running_and_an_admission()
    bad = dataclasses.replace(good, post=with_request(good.post, "B", num_computed_tokens=8))
    return Case(
        "MONOTONE",
        good,
        bad,
        "num_computed_tokens moved by other than the tokens scheduled",
        request_id="B",
        expected=7,
        actual=8,
    )


@cases("MONOTONE")
def case_unscheduled_request_goes_backwards() -> Case:
    # B is skipped this step, yet its computed count drops: only preemption resets.
    good = two_running_and_an_admission()
    bad = dataclasses.replace(
        with_scheduled(good, {"A": 1, "C": 10}),
        post=with_request(good.post, "B", num_computed_tokens=3),
    )
    return Case(
        "MONOTONE",
        good,
        bad,
        "num_computed_tokens moved by other than the tokens scheduled",
        request_id="B",
        expected=6,
        actual=3,
    )


@cases("MONOTONE")
def case_reported_count_differs() -> Case:
    good = two_running_and_an_admission()
    cached = tuple(
        d._replace(num_computed_tokens=5) if d.request_id == "A" else d
        for d in good.output.scheduled_cached_reqs
    )
    bad = with_output(good, scheduled_cached_reqs=cached)
    return Case(
        "MONOTONE",
        good,
        bad,
        "reported computed count is not the state's",
        request_id="A",
        expected=6,
        actual=5,
    )


@cases("MONOTONE")
def case_request_appears_during_schedule() -> Case:
    good = two_running_and_an_admission()
    bad = dataclasses.replace(good, pre=without_request(good.pre, "C"))
    return Case("MONOTONE", good, bad, "appeared during schedule()", request_id="C")


# ------------------------------------------------------------------- DRAFTS


def decode_with_drafts() -> ScheduleTransition:
    """A decodes with 2 drafts (11, 12) on top of its last known token."""
    driver = Driver(num_speculative_tokens=2)
    driver.add("A", 8)
    driver.step()
    driver.propose({"A": [11, 12]})
    t = driver.schedule()
    assert dict(t.output.scheduled_spec_decode_tokens) == {"A": (11, 12)}
    return t


@cases("DRAFTS")
def case_drafts_not_the_proposed_ones() -> Case:
    good = decode_with_drafts()
    bad = with_output(good, scheduled_spec_decode_tokens={"A": (12, 11)})
    return Case(
        "DRAFTS",
        good,
        bad,
        "not a prefix of the proposed drafts",
        request_id="A",
        expected=(11, 12),
        actual=(12, 11),
    )


@cases("DRAFTS")
def case_more_drafts_than_num_speculative_tokens() -> Case:
    good = decode_with_drafts()
    bad = dataclasses.replace(good, post=with_config(good.post, num_speculative_tokens=1))
    return Case(
        "DRAFTS", good, bad, "draft count out of range", request_id="A", expected=1, actual=2
    )


@cases("DRAFTS")
def case_drafts_on_a_prefill_chunk() -> Case:
    # PR #30618: drafts must never ride on a prefill chunk.
    driver = Driver(num_speculative_tokens=2, max_num_batched_tokens=4, max_num_seqs=2)
    driver.add("A", 10)
    driver.step()
    good = driver.schedule()  # the second 4-token chunk: 4..8 of 10
    assert dict(good.output.num_scheduled_tokens) == {"A": 4}
    bad = dataclasses.replace(
        with_output(good, scheduled_spec_decode_tokens={"A": (5, 6)}),
        pre=with_request(good.pre, "A", spec_token_ids=(5, 6)),
    )
    return Case(
        "DRAFTS",
        good,
        bad,
        "drafts scheduled before the known tokens are done",
        request_id="A",
        expected=10,
        actual=6,
    )


@cases("DRAFTS")
def case_drafts_not_consumed() -> Case:
    good = decode_with_drafts()
    bad = dataclasses.replace(good, post=with_request(good.post, "A", spec_token_ids=(11, 12)))
    return Case("DRAFTS", good, bad, "drafts not consumed by the step", request_id="A")


@cases("DRAFTS")
def case_drafts_for_an_unscheduled_request() -> Case:
    good = two_running_and_an_admission()
    bad = with_output(
        with_scheduled(good, {"A": 1, "C": 10}), scheduled_spec_decode_tokens={"B": (3,)}
    )
    return Case("DRAFTS", good, bad, "drafts for a request not scheduled", request_id="B")


# ------------------------------------------------------------ PREEMPT-RESET


@cases("PREEMPT-RESET")
def case_victim_keeps_its_blocks() -> Case:
    good = fcfs_preemption()
    bad = dataclasses.replace(
        good, post=with_request(good.post, "B", block_ids=good.pre.requests["B"].block_ids)
    )
    return Case(
        "PREEMPT-RESET",
        good,
        bad,
        "not reset: block_ids",
        request_id="B",
        expected=(),
        actual=good.pre.requests["B"].block_ids,
    )


@cases("PREEMPT-RESET")
def case_victim_keeps_its_computed_tokens() -> Case:
    good = fcfs_preemption()
    bad = dataclasses.replace(good, post=with_request(good.post, "B", num_computed_tokens=12))
    return Case(
        "PREEMPT-RESET",
        good,
        bad,
        "not reset: num_computed_tokens",
        request_id="B",
        expected=0,
        actual=12,
    )


@cases("PREEMPT-RESET")
def case_victim_left_out_of_waiting() -> Case:
    good = fcfs_preemption()
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, waiting=("C",)))
    return Case(
        "PREEMPT-RESET",
        good,
        bad,
        "not reset: queue",
        request_id="B",
        expected="waiting",
        actual="in no queue",
    )


@cases("PREEMPT-RESET")
def case_preemption_not_counted() -> Case:
    good = fcfs_preemption()
    bad = dataclasses.replace(good, post=with_request(good.post, "B", num_preemptions=0))
    return Case(
        "PREEMPT-RESET",
        good,
        bad,
        "num_preemptions not raised by one",
        request_id="B",
        expected=1,
        actual=0,
    )


@cases("PREEMPT-RESET")
def case_victim_still_scheduled() -> Case:
    # #23347: a priority victim already scheduled in the step stayed scheduled.
    good = fcfs_preemption()
    bad = with_scheduled(good, {"A": 1, "B": 1})
    return Case("PREEMPT-RESET", good, bad, "preempted and scheduled in one step", request_id="B")


@cases("PREEMPT-RESET")
def case_preempted_while_waiting() -> Case:
    good = fcfs_preemption()
    bad = with_output(good, preempted_req_ids=frozenset({"B", "C"}))
    return Case("PREEMPT-RESET", good, bad, "preempted while WAITING", request_id="C")


# ------------------------------------------------------------------- OUTPUT


@cases("OUTPUT")
def case_new_request_table_differs() -> Case:
    good = two_running_and_an_admission()
    (new,) = good.output.scheduled_new_reqs
    bad = with_output(good, scheduled_new_reqs=(new._replace(block_ids=new.block_ids[:-1]),))
    return Case("OUTPUT", good, bad, "new request data differs from the state", request_id="C")


@cases("OUTPUT")
def case_new_request_prompt_differs() -> Case:
    good = two_running_and_an_admission()
    (new,) = good.output.scheduled_new_reqs
    bad = with_output(good, scheduled_new_reqs=(new._replace(prompt_token_ids=(1, 2, 3)),))
    return Case("OUTPUT", good, bad, "new request data differs from the state", request_id="C")


@cases("OUTPUT")
def case_running_request_sent_as_new() -> Case:
    good = two_running_and_an_admission()
    a = good.pre.requests["A"]
    fake_new = NewRequestData("A", a.prompt_token_ids, a.block_ids, a.num_computed_tokens)
    bad = with_output(
        good,
        scheduled_new_reqs=(*good.output.scheduled_new_reqs, fake_new),
        scheduled_cached_reqs=tuple(
            d for d in good.output.scheduled_cached_reqs if d.request_id != "A"
        ),
    )
    return Case("OUTPUT", good, bad, "new request was not WAITING", request_id="A")


@cases("OUTPUT")
def case_new_blocks_do_not_rebuild_the_table() -> Case:
    # A decodes into a fresh block; the output forgets to send it.
    driver = Driver(max_num_seqs=4)
    driver.add("A", 8)
    driver.step()
    good = driver.schedule()
    (a,) = good.output.scheduled_cached_reqs
    assert len(a.new_block_ids) == 1
    bad = with_output(good, scheduled_cached_reqs=(a._replace(new_block_ids=()),))
    table = good.post.requests["A"].block_ids
    return Case(
        "OUTPUT",
        good,
        bad,
        "block ids do not rebuild the table",
        request_id="A",
        expected=table,
        actual=table[:-1],
    )


@cases("OUTPUT")
def case_running_request_marked_resumed() -> Case:
    good = two_running_and_an_admission()
    cached = tuple(
        d._replace(resumed=True) if d.request_id == "B" else d
        for d in good.output.scheduled_cached_reqs
    )
    bad = with_output(good, scheduled_cached_reqs=cached)
    return Case("OUTPUT", good, bad, "resumed=True but was RUNNING", request_id="B")


@cases("OUTPUT")
def case_wrong_num_output_tokens() -> Case:
    good = two_running_and_an_admission()
    cached = tuple(
        d._replace(num_output_tokens=0) if d.request_id == "B" else d
        for d in good.output.scheduled_cached_reqs
    )
    bad = with_output(good, scheduled_cached_reqs=cached)
    return Case(
        "OUTPUT",
        good,
        bad,
        "num_output_tokens differs",
        request_id="B",
        expected=1,
        actual=0,
    )


@cases("OUTPUT")
def case_scheduled_request_not_described() -> Case:
    good = two_running_and_an_admission()
    bad = with_output(
        good,
        scheduled_cached_reqs=tuple(
            d for d in good.output.scheduled_cached_reqs if d.request_id != "B"
        ),
    )
    return Case(
        "OUTPUT",
        good,
        bad,
        "request data and num_scheduled_tokens name different requests",
        expected=["A", "B", "C"],
        actual=["A", "C"],
    )


@cases("OUTPUT")
def case_cached_request_not_live() -> Case:
    good = two_running_and_an_admission()
    extra = CachedRequestData("ghost", False, (), 0, 0)
    bad = with_output(good, scheduled_cached_reqs=(*good.output.scheduled_cached_reqs, extra))
    return Case("OUTPUT", good, bad, "cached request is not live", request_id="ghost")


# ------------------------------------------------------------ CACHE-CONTENT

SYSTEM = tokens(300, 8)  # two full blocks of a shared system prompt


def prefix_hit() -> tuple[Driver, ScheduleTransition]:
    """A (system prompt + 2 tokens, max_tokens 1) ran and finished a step earlier,
    leaving blocks 0 and 1 free but cached; B's admission hits both."""
    driver = Driver(enable_prefix_caching=True, num_blocks=16, max_model_len=48)
    driver.add("A", prompt=(*SYSTEM, 1, 2), max_tokens=1)
    driver.step()
    driver.add("B", prompt=(*SYSTEM, 3, 4, 5))
    t = driver.schedule()
    (new,) = t.output.scheduled_new_reqs
    assert new.request_id == "B" and new.num_computed_tokens == 8
    assert t.post.requests["B"].block_ids[:2] == (0, 1)
    assert set(t.kv_written) >= {0, 1}
    return driver, t


@cases("CACHE-CONTENT")
def case_hit_of_part_of_a_block() -> Case:
    _, good = prefix_hit()
    (new,) = good.output.scheduled_new_reqs
    bad = with_output(good, scheduled_new_reqs=(new._replace(num_computed_tokens=6),))
    return Case(
        "CACHE-CONTENT",
        good,
        bad,
        "hit is not whole blocks short of the last token",
        request_id="B",
        expected="multiple of 4, <= 10",
        actual=6,
    )


@cases("CACHE-CONTENT")
def case_hit_covers_the_last_token() -> Case:
    # B's prompt is exactly the two cached blocks: the last token must be recomputed,
    # so the reference hits one block only.
    driver = Driver(enable_prefix_caching=True, num_blocks=16, max_model_len=48)
    driver.add("A", prompt=(*SYSTEM, 1, 2))
    driver.step()
    driver.add("B", prompt=SYSTEM)
    good = driver.schedule()
    (new,) = good.output.scheduled_new_reqs
    assert new.num_computed_tokens == 4
    bad = with_output(good, scheduled_new_reqs=(new._replace(num_computed_tokens=8),))
    return Case(
        "CACHE-CONTENT",
        good,
        bad,
        "hit is not whole blocks short of the last token",
        request_id="B",
        expected="multiple of 4, <= 7",
        actual=8,
    )


@cases("CACHE-CONTENT")
def case_hit_block_holds_other_content() -> Case:
    # The block B hit at index 1 is (in the engine's own map) another content's block.
    _, good = prefix_hit()
    kv = good.post.kv
    bad = dataclasses.replace(
        good, post=with_kv(good.post, block_hashes=with_block_hash(kv, 1, 0xBAD))
    )
    return Case(
        "CACHE-CONTENT",
        good,
        bad,
        "hit block at index 1 holds other content",
        request_id="B",
        block_id=1,
    )


def chunked_prefill() -> ScheduleTransition:
    """A's first 6-token chunk of a 10-token prompt: block 0 is full and registered."""
    driver = Driver(
        enable_prefix_caching=True,
        max_num_batched_tokens=6,
        max_num_seqs=2,
        num_blocks=16,
        max_model_len=48,
    )
    driver.add("A", 10)
    t = driver.schedule()
    a = t.post.requests["A"]
    assert a.num_computed_tokens == 6 and a.block_ids == (0, 1)
    assert t.post.kv.block_hashes[0] is not None and t.post.kv.block_hashes[1] is None
    return t


@cases("CACHE-CONTENT")
def case_block_registered_before_its_tokens_are_scheduled() -> Case:
    good = chunked_prefill()
    own = good.hashes.of(good.post.requests["A"])
    kv = good.post.kv
    bad = dataclasses.replace(
        good, post=with_kv(good.post, block_hashes=with_block_hash(kv, 1, own[1]))
    )
    return Case(
        "CACHE-CONTENT",
        good,
        bad,
        "block at index 1 registered before its tokens are known and scheduled",
        request_id="A",
        block_id=1,
    )


@cases("CACHE-CONTENT")
def case_block_registered_under_another_hash() -> Case:
    good = chunked_prefill()
    kv = good.post.kv
    bad = dataclasses.replace(
        good, post=with_kv(good.post, block_hashes=with_block_hash(kv, 0, 0xBAD))
    )
    return Case(
        "CACHE-CONTENT",
        good,
        bad,
        "block at index 0 registered under another content's hash",
        request_id="A",
        block_id=0,
    )


def on_both_sides(t: ScheduleTransition, corrupt: Callable[[State], State]) -> ScheduleTransition:
    """The step with the same corruption before and after it (as if from earlier steps)."""
    return dataclasses.replace(t, pre=corrupt(t.pre), post=corrupt(t.post))


@cases("CACHE-CONTENT")
def case_block_holds_a_stale_entry() -> Case:
    # The wrong hash was there before the step too: no registration of this step's, but
    # a held block still names other content (the check's common case looks at these
    # blocks in one comparison, and must still fall back to find this one).
    good = chunked_prefill()

    def corrupted(state: State) -> State:
        return with_kv(state, block_hashes=with_block_hash(state.kv, 0, 0xBAD))

    return Case(
        "CACHE-CONTENT",
        good,
        on_both_sides(good, corrupted),
        "block at index 0 holds a stale entry under another content's hash",
        request_id="A",
        block_id=0,
    )


@cases("CACHE-CONTENT")
def case_stale_entry_after_an_unhashed_block() -> Case:
    # A held block past an unhashed one (here the first) carries a hash from before
    # the step: the common case's one comparison covers only leading hashed blocks.
    good = chunked_prefill()
    table = good.post.requests["A"].block_ids
    last, block = len(table) - 1, table[-1]
    assert last >= 1 and good.post.kv.block_hashes[block] is None

    def corrupted(state: State) -> State:
        hashes = with_block_hash(state.kv, table[0], None)
        return with_kv(state, block_hashes=(*hashes[:block], 0xBAD, *hashes[block + 1 :]))

    return Case(
        "CACHE-CONTENT",
        good,
        on_both_sides(good, corrupted),
        f"block at index {last} holds a stale entry under another content's hash",
        request_id="A",
        block_id=block,
    )


@cases("CACHE-CONTENT")
def case_registered_block_held_by_nobody() -> Case:
    good = chunked_prefill()
    kv = good.post.kv
    bad = dataclasses.replace(
        good, post=with_kv(good.post, block_hashes=with_block_hash(kv, 5, 0xBAD))
    )
    return Case(
        "CACHE-CONTENT",
        good,
        bad,
        "registered by this step but held by no live request",
        block_id=5,
    )


# ----------------------------------------------------------- CACHE-COMPUTED


@cases("CACHE-COMPUTED")
def case_hit_on_a_block_never_computed() -> Case:
    # As if A's step had registered blocks 0 and 1 but never run them (a step
    # unscheduled after registering; the #43569 family): the KV oracle has no content.
    _, good = prefix_hit()
    bad = dataclasses.replace(good, kv_written={})
    return Case(
        "CACHE-COMPUTED",
        good,
        bad,
        "hit at index 0 on a block whose KV was never computed for this content",
        request_id="B",
        block_id=0,
    )


@cases("CACHE-COMPUTED")
def case_hit_on_a_block_written_with_other_content() -> Case:
    _, good = prefix_hit()
    written = dict(good.kv_written)
    written[1] = 0xBAD  # block 1 was last computed for another content
    bad = dataclasses.replace(good, kv_written=written)
    return Case(
        "CACHE-COMPUTED",
        good,
        bad,
        "hit at index 1 on a block whose KV was never computed for this content",
        request_id="B",
        block_id=1,
    )


@cases("CACHE-COMPUTED")
def case_same_step_hit_without_the_writer() -> Case:
    """Good: A and B admitted in one step, B hitting the blocks A computes in it. Bad: A
    is not scheduled after all, so nobody computes them."""
    driver = Driver(enable_prefix_caching=True, num_blocks=16, max_model_len=48)
    driver.add("A", prompt=(*SYSTEM, 1, 2))
    driver.add("B", prompt=(*SYSTEM, 3, 4, 5))
    good = driver.schedule()
    assert {d.request_id: d.num_computed_tokens for d in good.output.scheduled_new_reqs} == {
        "A": 0,
        "B": 8,
    }
    assert not good.kv_written
    bad = with_scheduled(good, {"B": 3})
    return Case(
        "CACHE-COMPUTED",
        good,
        bad,
        "hit at index 0 on a block whose KV was never computed for this content",
        request_id="B",
        block_id=0,
    )


@cases(
    "CACHE-COMPUTED",
)
def case_hit_never_computed_while_the_writer_decodes() -> Case:
    driver = Driver(enable_prefix_caching=True, num_blocks=16, max_model_len=48)
    driver.add("A", prompt=(*SYSTEM, 1, 2))
    driver.step()
    driver.add("B", prompt=(*SYSTEM, 3, 4, 5))
    good = driver.schedule()
    assert dict(good.output.num_scheduled_tokens) == {"A": 1, "B": 3}  # A decodes position 10
    bad = dataclasses.replace(good, kv_written={})
    return Case(
        "CACHE-COMPUTED",
        good,
        bad,
        "hit at index 0 on a block whose KV was never computed for this content",
        request_id="B",
        block_id=0,
    )


# ---------------------------------------------------------- FINISH-REPORTED


def after_a_finish() -> tuple[Driver, ScheduleTransition]:
    """A (max_tokens 1) finished at the last update; this schedule() reports it."""
    driver = Driver()
    driver.add("A", 4, max_tokens=1)
    driver.add("B", 4)
    driver.step()
    t = driver.schedule()
    assert t.output.finished_req_ids == {"A"}
    return driver, t


@cases("FINISH-REPORTED")
def case_finish_not_reported() -> Case:
    _, good = after_a_finish()
    bad = with_output(good, finished_req_ids=frozenset())
    return Case("FINISH-REPORTED", good, bad, "wrong finished_req_ids", expected=["A"], actual=[])


@cases("FINISH-REPORTED")
def case_finish_reported_twice() -> Case:
    driver, first = after_a_finish()
    driver.update(first)
    good = driver.schedule()
    assert good.output.finished_req_ids == frozenset()
    bad = with_output(good, finished_req_ids=first.output.finished_req_ids)
    return Case("FINISH-REPORTED", good, bad, "wrong finished_req_ids", expected=[], actual=["A"])


# ------------------------------------------------------------ NO-EMPTY-STEP


@cases("NO-EMPTY-STEP")
def case_nothing_scheduled_with_work_left() -> Case:
    # #39734: a scheduler wedged on a request it can never fit returns empty steps.
    good = two_running_and_an_admission()
    bad = dataclasses.replace(good, output=EMPTY_OUTPUT, post=good.pre)
    return Case("NO-EMPTY-STEP", good, bad, "nothing scheduled with 3 unfinished requests")


# --------------------------------------------------------------------- STOP


def decode_step(**request: Any) -> tuple[Driver, ScheduleTransition]:
    """A (prompt 6) has prefilled; the returned schedule() is a one-token decode."""
    driver = Driver()
    driver.add("A", 6, **request)
    driver.step()
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"A": 1}
    return driver, t


@cases("STOP")
def case_live_after_eos() -> Case:
    driver, scheduled = decode_step(eos_token_id=2)
    good = driver.update(scheduled, {"A": [2]})
    assert "A" not in good.post.requests
    bad = dataclasses.replace(good, post=scheduled.post)
    return Case("STOP", good, bad, "still live after stop token 1 of 1", request_id="A")


@cases("STOP")
def case_length_cap_ignored() -> Case:
    # #51299: a request that reached max_tokens kept running (and held its blocks).
    driver, scheduled = decode_step(max_tokens=2)
    good = driver.update(scheduled)
    assert "A" not in good.post.requests
    a = scheduled.post.requests["A"]
    kept_alive = with_request(scheduled.post, "A", output_token_ids=(*a.output_token_ids, 7))
    bad = dataclasses.replace(good, post=kept_alive)
    return Case("STOP", good, bad, "still live after stop token 1 of 1", request_id="A")


@cases("STOP")
def case_finished_with_no_stop() -> Case:
    driver, scheduled = decode_step()
    good = driver.update(scheduled)
    bad = dataclasses.replace(good, post=without_request(good.post, "A"))
    return Case("STOP", good, bad, "finished with no stop condition met", request_id="A")


@cases("STOP")
def case_outputs_not_appended() -> Case:
    driver, scheduled = decode_step()
    good = driver.update(scheduled, {"A": [9]})
    bad = dataclasses.replace(good, post=with_request(good.post, "A", output_token_ids=(7, 8)))
    return Case(
        "STOP",
        good,
        bad,
        "outputs are not the old ones plus the sampled tokens",
        request_id="A",
        expected=(7, 9),
        actual=(7, 8),
    )


@cases("STOP")
def case_outputs_change_without_sampling() -> Case:
    # A prefill chunk samples nothing, so the outputs must not move.
    driver = Driver(max_num_batched_tokens=4, max_num_seqs=2)
    driver.add("A", 10)
    scheduled = driver.schedule()
    good = driver.update(scheduled)
    assert good.model_output.sampled_token_ids == {}
    bad = dataclasses.replace(good, post=with_request(good.post, "A", output_token_ids=(7,)))
    return Case("STOP", good, bad, "outputs changed without sampling", request_id="A")


@cases("STOP")
def case_unscheduled_request_finishes() -> Case:
    driver = Driver(max_num_seqs=1)
    driver.add("A", 6)
    driver.add("W", 6)  # waits behind A: max_num_seqs 1
    scheduled = driver.schedule()
    good = driver.update(scheduled)
    bad = dataclasses.replace(good, post=without_request(good.post, "W"))
    return Case("STOP", good, bad, "finished without sampling", request_id="W")


# ----------------------------------------------------------------- ROLLBACK


def verify_drafts() -> tuple[Driver, ScheduleTransition]:
    driver = Driver(num_speculative_tokens=2)
    driver.add("A", 8)
    driver.step()
    driver.propose({"A": [11, 12]})
    return driver, driver.schedule()


@cases("ROLLBACK")
def case_rejected_drafts_not_rolled_back() -> Case:
    # A ran 8 + drafts 11, 12 (11 computed); 11 accepted, 12 rejected: back to 10.
    driver, scheduled = verify_drafts()
    good = driver.update(scheduled, {"A": [11, 99]})
    assert good.post.requests["A"].num_computed_tokens == 10
    bad = dataclasses.replace(good, post=with_request(good.post, "A", num_computed_tokens=11))
    return Case(
        "ROLLBACK",
        good,
        bad,
        "num_computed_tokens after the output",
        request_id="A",
        expected=10,
        actual=11,
    )


@cases("ROLLBACK")
def case_rolled_back_too_far() -> Case:
    driver, scheduled = verify_drafts()
    good = driver.update(scheduled, {"A": [11, 12, 13]})  # both accepted
    assert good.post.requests["A"].num_computed_tokens == 11
    bad = dataclasses.replace(good, post=with_request(good.post, "A", num_computed_tokens=9))
    return Case(
        "ROLLBACK",
        good,
        bad,
        "a request that sampled must have computed all but its last token",
        request_id="A",
        expected=11,
        actual=9,
    )


@cases("ROLLBACK")
def case_request_appears_during_update() -> Case:
    driver, scheduled = verify_drafts()
    good = driver.update(scheduled, {"A": [11, 99]})
    bad = dataclasses.replace(good, pre=without_request(good.pre, "A"))
    return Case("ROLLBACK", good, bad, "appeared during update_from_output", request_id="A")


# -------------------------------------------------------------------- ABORT


@cases("ABORT")
def case_aborted_request_still_live() -> Case:
    driver = Driver(max_num_seqs=2)
    for rid in "ABC":
        driver.add(rid, 6)
    driver.step()
    good = driver.abort("A", "no-such-request")
    bad = dataclasses.replace(good, post=good.pre)
    return Case("ABORT", good, bad, "still live after abort", request_id="A")


@cases("ABORT")
def case_bystander_changed() -> Case:
    driver = Driver(max_num_seqs=2)
    for rid in "ABC":
        driver.add(rid, 6)
    driver.step()
    good = driver.abort("C")
    bad = dataclasses.replace(good, post=with_request(good.post, "B", num_computed_tokens=0))
    return Case("ABORT", good, bad, "a request not aborted changed", request_id="B")


@cases("ABORT")
def case_queues_rebuilt_wrong() -> Case:
    driver = Driver(max_num_seqs=3)
    for rid in "ABC":
        driver.add(rid, 6)
    driver.step()
    good = driver.abort("B")
    bad = dataclasses.replace(good, post=dataclasses.replace(good.post, running=("C", "A")))
    return Case(
        "ABORT",
        good,
        bad,
        "queues are not the old ones minus the aborted",
        expected=(("A", "C"), ()),
        actual=(("C", "A"), ()),
    )


# ----------------------------------------------------------------- PROGRESS


def head_admitted_with_nothing_running(**config: Any) -> ScheduleTransition:
    """A waits with nothing running; the step admits it, as every correct engine must."""
    driver = Driver(**config)
    driver.add("A", 8)
    driver.add("B", 4)
    t = driver.schedule()
    assert not t.pre.running and t.pre.waiting[0] == "A"
    assert "A" in t.output.num_scheduled_tokens
    return t


@cases("PROGRESS")
def case_head_passed_over_with_nothing_running() -> Case:
    # #39734, #40707: nothing runs, the head waits, and the step schedules nothing.
    good = head_admitted_with_nothing_running()
    bad = dataclasses.replace(good, output=EMPTY_OUTPUT, post=good.pre)
    return Case(
        "PROGRESS",
        good,
        bad,
        "passed over in 1 steps with nothing running",
        request_id="A",
        expected=0,
        actual=1,
    )


@cases("PROGRESS")
def case_head_passed_over_twice_under_async() -> Case:
    # Under async scheduling one step may wait on the head's stale output; the history
    # says one already did, so passing the head over again is a stall.
    good = head_admitted_with_nothing_running(async_scheduling=True)
    history = PassedOver("A", good.pre.requests["A"].arrival, 1)
    good = dataclasses.replace(good, head_passed_over=history)
    bad = dataclasses.replace(good, output=EMPTY_OUTPUT, post=good.pre)
    return Case(
        "PROGRESS",
        good,
        bad,
        "passed over in 2 steps with nothing running",
        request_id="A",
        expected=1,
        actual=2,
    )


# -------------------------------------------------------------------- DRAIN


def drained() -> DrainResult:
    driver = Driver(num_blocks=8, max_model_len=24, max_num_seqs=4, enable_prefix_caching=True)
    driver.add("A", prompt=(*SYSTEM, 1), max_tokens=6)
    driver.add("B", prompt=(*SYSTEM, 2, 3), max_tokens=9)
    driver.add("C", 12, max_tokens=4)
    result = driver.drain()
    assert not result.final.requests and result.num_steps <= result.step_bound
    return result


@cases("DRAIN")
def case_request_never_finishes() -> Case:
    # #39734: a request that can never be scheduled waits forever.
    good = drained()
    stuck = dataclasses.replace(good, final=good.initial, num_steps=good.step_bound + 1)
    return Case(
        "DRAIN",
        good,
        stuck,
        f"3 requests unfinished after {good.step_bound + 1} steps",
        expected=good.step_bound,
        actual=good.step_bound + 1,
    )


@cases("DRAIN")
def case_drain_slower_than_the_bound() -> Case:
    good = drained()
    bad = dataclasses.replace(good, num_steps=good.step_bound + 5)
    return Case(
        "DRAIN",
        good,
        bad,
        f"0 requests unfinished after {good.step_bound + 5} steps",
        expected=good.step_bound,
        actual=good.step_bound + 5,
    )


# ------------------------------------------------------------------ NO-LEAK


@cases("NO-LEAK")
def case_block_left_held() -> Case:
    good = drained()
    kv = good.final.kv
    leaked = kv.free_block_ids[0]
    final = with_kv(
        good.final,
        free_block_ids=kv.free_block_ids[1:],
        ref_counts=with_ref_count(kv, leaked, 1),
    )
    bad = dataclasses.replace(good, final=final)
    return Case("NO-LEAK", good, bad, "ref count 1 with nothing live", block_id=leaked)


@cases("NO-LEAK")
def case_blocks_missing_from_the_free_queue() -> Case:
    good = drained()
    kv = good.final.kv
    bad = dataclasses.replace(good, final=with_kv(good.final, free_block_ids=kv.free_block_ids[2:]))
    return Case(
        "NO-LEAK",
        good,
        bad,
        "blocks not free after everything finished",
        expected=8,
        actual=6,
    )


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("build", cases.params())
def test_step_invariant_holds_on_the_real_transition(build: CaseBuilder) -> None:
    assert_holds(build())


@pytest.mark.parametrize("build", cases.params(bad=True))
def test_step_invariant_fires_on_the_corrupted_transition(build: CaseBuilder) -> None:
    assert_caught(build())


def test_step_cases_are_safety_transition_invariants() -> None:
    for invariant_id in cases.ids():
        info = CATALOGUE[invariant_id]
        assert info.profile == "safety" and info.kind != "state", invariant_id


def test_same_step_hit_is_accepted_through_the_checked_engine() -> None:
    """The same-step hit of CACHE-COMPUTED's good case, through CheckedEngine: both
    admitted in one step, B hitting what A computes in it."""
    config = make_config(enable_prefix_caching=True, num_blocks=16, max_model_len=48)
    checked = CheckedEngine.from_factory(reference_engine, config, "vllm-v1")
    checked.apply(AddRequest("A", (*SYSTEM, 1, 2), 4))
    checked.apply(AddRequest("B", (*SYSTEM, 3, 4, 5), 4))
    checked.apply(Step())
    assert checked.state.requests["B"].block_ids[:2] == checked.state.requests["A"].block_ids[:2]


def test_predicates_report_rather_than_raise_on_an_out_of_range_block() -> None:
    t = two_running_and_an_admission()
    table = t.post.requests["A"].block_ids
    post = with_request(t.post, "A", block_ids=(*table, 999))
    shared = with_request(with_request(t.post, "A", block_ids=(999,)), "B", block_ids=(999,))
    for invariant_id, info in CATALOGUE.items():
        if info.kind == "schedule":
            CHECKS[invariant_id](dataclasses.replace(t, post=post))
        elif info.kind == "state":
            CHECKS[invariant_id](post)
            CHECKS[invariant_id](shared)


def test_hit_on_a_block_completed_by_accepted_drafts() -> None:
    """A's block (2, 3) is filled by its last known token and an accepted draft; after A
    is aborted, B (same tokens) hits it. The KV is there: no violation is due."""
    config = make_config(
        block_size=2,
        num_blocks=16,
        max_model_len=32,
        enable_prefix_caching=True,
        num_speculative_tokens=1,
    )
    checked = CheckedEngine.from_factory(reference_engine, config, "vllm-v1")
    checked.apply(AddRequest("A", (1, 2), 20))
    checked.apply(Step())  # prefill: A has 3 tokens, 2 computed
    checked.apply(ProposeDrafts({"A": 1}))
    checked.apply(Step(StepDecisions(accepted={"A": 1})))  # positions 2 and 3 (a draft)
    a = checked.state.requests["A"]
    assert a.num_computed_tokens == 4 and a.num_tokens == 5
    checked.apply(Abort(("A",)))
    prefix = a.prompt_token_ids + a.output_token_ids
    checked.apply(AddRequest("B", prefix, 4))
    checked.apply(Step())
    assert checked.state.requests["B"].num_computed_tokens >= 4
