"""Async scheduling (vLLM's AsyncScheduler) in the reference: one worked example per rule.

The engine core schedules step N+1 before step N's output lands. Each test drives the
reference by hand in that order: schedule, schedule, land, ... (`land` answers an
earlier output), and checks the counts vLLM 0.33.0 keeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from schedspec.reference import Scheduler
from schedspec.spec import (
    PLACEHOLDER_TOKEN_ID,
    ModelRunnerOutput,
    RequestOutput,
    RequestStatus,
    SchedulerOutput,
)
from tests.sched_helpers import add, free_blocks, make_scheduler, single_group_kv

PH = PLACEHOLDER_TOKEN_ID


class Scheduled:
    """An output and the requests whose step samples (decided when it was scheduled)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.output: SchedulerOutput = scheduler.schedule()
        self.samplers = [
            rid
            for rid in self.output.num_scheduled_tokens
            if not scheduler.requests[rid].is_prefill_chunk
        ]


def land(
    scheduler: Scheduler, step: Scheduled, tokens: Mapping[str, Sequence[int]] | None = None
) -> dict[str, RequestOutput]:
    """The step's output arrives: each sampler still live emits tokens[id] (default [7])."""
    given = dict(tokens or {})
    sampled = {rid: given.get(rid, [7]) for rid in step.samplers if rid in scheduler.requests}
    return scheduler.update_from_output(step.output, ModelRunnerOutput(sampled_token_ids=sampled))


def counters(scheduler: Scheduler, rid: str) -> tuple[int, int, int, int]:
    """(computed, in flight, placeholders, stale) of a live request."""
    r = scheduler.requests[rid]
    return (
        r.num_computed_tokens,
        r.num_in_flight_tokens,
        r.num_output_placeholders,
        r.num_stale_output_tokens,
    )


def test_the_next_step_is_scheduled_before_the_output_arrives() -> None:
    s = make_scheduler(async_scheduling=True)
    a = add(s, "a", 5)
    first = Scheduled(s)
    assert dict(first.output.num_scheduled_tokens) == {"a": 5}
    # The prefill samples: one output position in flight.
    assert counters(s, "a") == (5, 5, 1, 0)
    second = Scheduled(s)
    # num_tokens 5 + placeholders 1 - computed 5: the in-flight token's position.
    assert dict(second.output.num_scheduled_tokens) == {"a": 1}
    (cached,) = second.output.scheduled_cached_reqs
    assert (cached.num_computed_tokens, cached.num_output_tokens) == (5, 1)
    assert counters(s, "a") == (6, 6, 2, 0)
    land(s, first, {"a": [50]})
    assert a.output_token_ids == [50]
    assert counters(s, "a") == (6, 1, 1, 0)  # confirmed 6 - 1 = 5 = tokens - 1
    land(s, second, {"a": [51]})
    assert a.output_token_ids == [50, 51]
    assert counters(s, "a") == (6, 0, 0, 0)


def test_a_request_sure_to_reach_max_tokens_is_not_scheduled_again() -> None:
    """vLLM PR #27922: without the rule async scheduling computed a third token."""
    s = make_scheduler(async_scheduling=True)
    a = add(s, "a", 5, max_tokens=2)
    first, second = Scheduled(s), Scheduled(s)
    land(s, first, {"a": [50]})
    # 6 computed + 2 - 1 placeholder = 7 sure tokens = prompt 5 + max_tokens 2.
    third = Scheduled(s)
    assert third.output.num_scheduled_tokens == {}
    outputs = land(s, second, {"a": [51]})
    assert outputs["a"].finish_status is RequestStatus.FINISHED_LENGTH_CAPPED
    assert a.output_token_ids == [50, 51]
    assert land(s, third) == {}
    assert free_blocks(s) == 64


def test_eos_found_one_step_late_drops_the_extra_steps_token() -> None:
    s = make_scheduler(async_scheduling=True)
    a = add(s, "a", 5, eos_token_id=99)
    first, second = Scheduled(s), Scheduled(s)
    assert dict(second.output.num_scheduled_tokens) == {"a": 1}  # in flight already
    outputs = land(s, first, {"a": [99]})
    assert outputs["a"] == RequestOutput("a", (99,), RequestStatus.FINISHED_STOPPED, 5)
    assert "a" not in s.requests and free_blocks(s) == 64  # its KV is freed at once
    third = Scheduled(s)
    assert third.output.finished_req_ids == {"a"} and third.output.num_scheduled_tokens == {}
    # The extra step's token arrives for a finished request: dropped, not delivered.
    assert land(s, second, {"a": [51]}) == {}
    assert a.output_token_ids == [99]


def test_abort_with_output_in_flight_drops_that_output() -> None:
    s = make_scheduler(async_scheduling=True)
    a = add(s, "a", 5)
    first, second = Scheduled(s), Scheduled(s)
    s.finish_requests(["a"])
    assert a.status is RequestStatus.FINISHED_ABORTED and free_blocks(s) == 64
    assert land(s, first, {"a": [50]}) == {}
    assert land(s, second, {"a": [51]}) == {}
    assert a.output_token_ids == []


def _preempted_with_output_in_flight() -> tuple[Scheduler, Scheduled, Scheduled]:
    """4 blocks of 4: A and B (7-token prompts) fill the cache. Step 3 needs a block for
    A's ninth slot and preempts B (fcfs: running[-1]) while B's step 2 is in flight."""
    s = make_scheduler(async_scheduling=True, num_blocks=4, max_model_len=16)
    add(s, "A", 7)
    add(s, "B", 7, first_token=2000)
    first, second = Scheduled(s), Scheduled(s)
    assert dict(second.output.num_scheduled_tokens) == {"A": 1, "B": 1}
    land(s, first, {"A": [50], "B": [60]})
    third = Scheduled(s)
    assert third.output.preempted_req_ids == {"B"}
    return s, second, third


def test_preemption_marks_the_output_in_flight_stale() -> None:
    s, _, third = _preempted_with_output_in_flight()
    b = s.requests["B"]
    assert b.status is RequestStatus.PREEMPTED
    # Reset: nothing computed, no placeholders; its one in-flight token is stale.
    assert counters(s, "B") == (0, 1, 0, 1)
    assert dict(third.output.num_scheduled_tokens) == {"A": 1}


def test_stale_output_is_delivered_and_moves_no_reset_counter() -> None:
    s, second, _ = _preempted_with_output_in_flight()
    b = s.requests["B"]
    outputs = land(s, second, {"A": [51], "B": [61]})
    # Its token was sampled at the right position: delivered, but computed stays 0.
    assert b.output_token_ids == [60, 61]
    assert outputs["B"] == RequestOutput("B", (61,), None, None)
    assert counters(s, "B") == (0, 0, 0, 0)
    assert b.status is RequestStatus.PREEMPTED and s.waiting.peek() is b


def test_a_request_waiting_for_stale_output_is_skipped_not_blocking() -> None:
    """With a deeper pipeline (a third step scheduled before the first lands) B still has
    stale output in flight: it keeps its place, and C behind it is admitted."""
    s, _, _ = _preempted_with_output_in_flight()
    add(s, "C", 3, first_token=3000)
    fourth = Scheduled(s)
    assert set(fourth.output.num_scheduled_tokens) == {"A", "C"}
    assert [r.request_id for r in s.waiting] == ["B"]


def test_placeholder_drafts_are_verified_late_and_rolled_back() -> None:
    s = make_scheduler(async_scheduling=True, num_speculative_tokens=2)
    a = add(s, "a", 5)
    first = Scheduled(s)
    assert a.spec_token_ids == [PH, PH]  # the runner proposes them
    assert counters(s, "a") == (5, 5, 1, 0)
    second = Scheduled(s)
    assert dict(second.output.num_scheduled_tokens) == {"a": 3}
    assert dict(second.output.scheduled_spec_decode_tokens) == {"a": (PH, PH)}
    assert counters(s, "a") == (8, 8, 4, 0)  # 1 + (1 + 2 drafts) output positions
    land(s, first, {"a": [50]})
    assert counters(s, "a") == (8, 3, 3, 0)
    land(s, second, {"a": [51, 52]})  # one draft accepted, one rejected
    assert a.output_token_ids == [50, 51, 52]
    assert counters(s, "a") == (7, 0, 0, 0)  # 8 - 1 rejected = tokens - 1


def test_only_landed_kv_is_registered_in_the_prefix_cache() -> None:
    s = make_scheduler(async_scheduling=True, enable_prefix_caching=True)
    add(s, "a", 7)
    kv = single_group_kv(s)

    def registered() -> int:
        return kv.num_cached_block.get("a", 0)

    first = Scheduled(s)
    assert registered() == 1  # the prompt's one full block
    second = Scheduled(s)
    # Positions 4-7 are computed or in flight, but position 7's token is not known.
    assert registered() == 1
    land(s, first, {"a": [50]})
    # Position 7 is known now, but its KV is computed by step 2, still in flight.
    assert registered() == 1
    land(s, second, {"a": [51]})
    assert registered() == 2


def test_a_victim_keeps_the_registrations_of_its_prefill_in_flight() -> None:
    """Priority: V's 16-token prompt runs in chunks of 10 and 6; A (more urgent) is
    admitted beside the second. The next step serves V, then preempts it for A's block,
    while V's second chunk is in flight. Its four prompt blocks were registered when
    scheduled; the chunk still runs and writes blocks 2 and 3, so all four stay
    registered as V's blocks are freed (CACHE-SCHEDULE-KEPT); only what this very step
    registered for V past those tokens is taken back. Once its stale token lands, V's
    lookup hits all four."""
    s = make_scheduler(
        async_scheduling=True,
        policy="priority",
        enable_prefix_caching=True,
        num_blocks=6,
        max_model_len=24,
        max_num_batched_tokens=10,
        max_num_seqs=4,
    )
    v = add(s, "V", 16, priority=1)
    first = Scheduled(s)
    add(s, "A", 4, first_token=2000, priority=0)
    second = Scheduled(s)
    land(s, first)
    blocks = list(single_group_kv(s).req_to_blocks["V"][:4])
    third = Scheduled(s)
    assert third.output.preempted_req_ids == {"V"}
    assert v.num_in_flight_tokens == 6  # its second chunk, stale now
    assert all(b.block_hash is not None for b in blocks)
    land(s, second, {"V": [60]})  # stale: delivered, and V has 17 known tokens
    assert single_group_kv(s).get_computed_blocks(v)[1] == 16


def test_a_victim_served_first_keeps_what_its_service_registered_in_flight() -> None:
    """Priority, 4 blocks: V's 7-token prompt runs, then its first decode (position 7,
    whose token is a placeholder) beside A's admission (more urgent). When the prefill
    lands, V's block 1 is full of known tokens, but its last position's KV is in
    flight: the landing registers only block 0. The next step serves V first and
    registers block 1; then A needs a block and V is preempted. vLLM takes back only
    what lies past V's computed tokens, so block 1 stays registered (the decode in
    flight writes it; CACHE-SCHEDULE-KEPT), and once that decode lands V hits both
    blocks."""
    s = make_scheduler(
        async_scheduling=True,
        policy="priority",
        enable_prefix_caching=True,
        num_blocks=4,
        max_model_len=16,
        max_num_seqs=4,
    )
    v = add(s, "V", 7, priority=1)
    first = Scheduled(s)
    add(s, "A", 4, first_token=2000, priority=0)
    second = Scheduled(s)
    land(s, first, {"V": [60]})
    kv = single_group_kv(s)
    block = kv.req_to_blocks["V"][1]
    assert block.block_hash is None  # position 7's KV is in flight
    third = Scheduled(s)
    assert dict(third.output.num_scheduled_tokens) == {"A": 1}
    assert third.output.preempted_req_ids == {"V"}
    assert block.block_hash is not None
    land(s, second, {"V": [61], "A": [70]})  # V's is stale: delivered, 9 known tokens
    assert kv.get_computed_blocks(v)[1] == 8


class TestSpecDecodePadding:
    """pad_spec_decode (vLLM's uniform decode batches), synchronous here."""

    @staticmethod
    def _decoding_a(prompt: int = 5, **overrides: object) -> Scheduler:
        """'a' has sampled its first token and decodes (no drafts proposed)."""
        fields: dict[str, object] = {"num_speculative_tokens": 2, "pad_spec_decode": True}
        fields.update(overrides)
        s = make_scheduler(**fields)
        add(s, "a", prompt)
        land(s, Scheduled(s), {"a": [50]})
        return s

    def test_a_one_token_admission_beside_a_decode_is_padded(self) -> None:
        s = self._decoding_a()
        b = add(s, "b", 1, first_token=2000)
        step = Scheduled(s)
        assert dict(step.output.num_scheduled_tokens) == {"a": 1, "b": 3}
        assert dict(step.output.scheduled_spec_decode_tokens) == {"b": (PH, PH)}
        assert b.num_computed_tokens == 3
        # Slots for 3 tokens + 2 lookahead: the KV is charged like any draft's.
        assert len(single_group_kv(s).get_block_ids("b")) == 2
        land(s, step, {"b": [70]})  # both placeholders rejected
        assert b.num_computed_tokens == 1 == b.num_tokens - 1

    def test_a_lone_admission_with_no_prefix_hit_is_not_padded(self) -> None:
        s = make_scheduler(num_speculative_tokens=2, pad_spec_decode=True)
        add(s, "b", 1)
        step = Scheduled(s)
        assert dict(step.output.num_scheduled_tokens) == {"b": 1}
        assert step.output.scheduled_spec_decode_tokens == {}

    def test_no_padding_while_a_running_prefill_continues(self) -> None:
        s = make_scheduler(
            num_speculative_tokens=2,
            pad_spec_decode=True,
            max_num_batched_tokens=16,
            long_prefill_token_threshold=8,
        )
        add(s, "p", 40)
        land(s, Scheduled(s))  # alone, uncapped: a 16-token chunk; p is mid-prefill
        add(s, "b", 1, first_token=2000)
        step = Scheduled(s)
        assert dict(step.output.num_scheduled_tokens) == {"p": 8, "b": 1}

    def test_a_padded_step_over_the_budget_left_waits(self) -> None:
        s = self._decoding_a(prompt=2, max_num_batched_tokens=3, max_num_seqs=2)
        add(s, "b", 1, first_token=2000)
        step = Scheduled(s)
        # 2 tokens left < 1 + 2: vLLM prefers no step to an unpadded one.
        assert dict(step.output.num_scheduled_tokens) == {"a": 1}
        assert [r.request_id for r in s.waiting] == ["b"]

    def test_no_padding_where_the_long_prefill_cap_would_cut_it(self) -> None:
        """vLLM pads and then asserts (docs/FINDINGS.md F3); the reference does not pad."""
        s = self._decoding_a(long_prefill_token_threshold=2)
        add(s, "b", 1, first_token=2000)
        step = Scheduled(s)
        assert dict(step.output.num_scheduled_tokens) == {"a": 1, "b": 1}

    def test_padding_needs_room_below_max_model_len(self) -> None:
        # b repeats a's 5-token prompt: its first block (4 tokens) hits, 1 token is left.
        # Padded, b's positions and the token they sample end at hit 4 + 3 + 1 = 8.
        fits = self._decoding_a(enable_prefix_caching=True, max_model_len=8, num_blocks=4)
        add(fits, "b", 5)
        assert Scheduled(fits).output.num_scheduled_tokens["b"] == 3
        short = self._decoding_a(enable_prefix_caching=True, max_model_len=7, num_blocks=4)
        add(short, "b", 5)
        assert Scheduled(short).output.num_scheduled_tokens["b"] == 1

    def test_a_prefix_hit_that_leaves_one_token_is_padded_even_alone(self) -> None:
        s = make_scheduler(
            num_speculative_tokens=2, pad_spec_decode=True, enable_prefix_caching=True
        )
        add(s, "a", 9, max_tokens=1)
        land(s, Scheduled(s))  # a finishes; its 2 full blocks stay cached
        add(s, "b", 9)  # the same prompt: 8 tokens hit, 1 to compute
        step = Scheduled(s)
        assert dict(step.output.num_scheduled_tokens) == {"b": 3}
        assert step.output.scheduled_new_reqs[0].num_computed_tokens == 8

    def test_padding_under_async_adds_its_positions_as_placeholders(self) -> None:
        s = make_scheduler(num_speculative_tokens=2, pad_spec_decode=True, async_scheduling=True)
        add(s, "a", 5)
        land(s, Scheduled(s), {"a": [50]})
        add(s, "b", 1, first_token=2000)
        Scheduled(s)
        assert counters(s, "b") == (3, 3, 3, 0)
        assert s.requests["b"].spec_token_ids == [PH, PH]
