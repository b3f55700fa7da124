"""SGLang's openings (schedspec/properties/strategies/openings.py): the workload shapes an
SGLang example may start with, each checked on the reference."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.engines.events import AddRequest, Step
from schedspec.properties.state_machine import SchedulerMachine, make_state_machine
from schedspec.properties.strategies.actions import RequestDraw
from schedspec.properties.strategies.openings import (
    ANY_LENGTH,
    ONE_TOKEN,
    LateShape,
    Opening,
    fit_room,
    ones_before_long,
    ones_then_long,
    opening_weights,
    paired_opening,
    sglang_openings,
)
from schedspec.properties.strategies.regimes import sglang_paged_chunks, sglang_readmit
from schedspec.spec import RequestStatus, SchedulerConfig
from schedspec.spec.config import MIN_SGLANG_MAX_MODEL_LEN
from schedspec.spec.request import max_prompt_tokens
from schedspec.spec.sglang_arithmetic import running_reservation
from tests.sched_helpers import make_config

# Mixed chunks, pages of one token, two seats, a chunk budget of four: the regime
# sglang-mixed-overcommit's shape.
MIXED = make_config(
    family="sglang",
    block_size=1,
    num_blocks=64,
    max_model_len=64,
    max_num_seqs=2,
    max_num_batched_tokens=4,
    enable_chunked_prefill=True,
    enable_mixed_chunk=True,
    schedule_conservativeness=0.1,
)


def draw(length_kind: int, max_tokens: int, anything: int = 0) -> RequestDraw:
    return RequestDraw(length_kind, anything, 0, 7, max_tokens, 0, 0, 0, 0)


def started(config: SchedulerConfig, opening: Opening) -> SchedulerMachine:
    machine = make_state_machine(reference_engine, "sglang")()
    assert isinstance(machine, SchedulerMachine)
    machine.start(config, 0, opening)
    return machine


def test_a_long_late_prompt_is_sized_to_the_fit_tests_room() -> None:
    """Two decodes drawn, one seat left for the long prompt: one decode arrives and runs
    eight steps, and the late prompt is the room the fit test sees (64 slots less the
    decode's 8, its prompt and the 7 outputs whose KV is written, less 0.07 of its 32
    tokens to go: 53) less its future (2), a page, a token for the strict test and its
    slack (3): 46 tokens. It is admitted at once and chunked, beside the decode."""
    opening = Opening(
        (draw(ONE_TOKEN, 40), draw(ONE_TOKEN, 40)),
        0,
        8,
        (draw(ANY_LENGTH, 2, 3),),
        LateShape.FITS_ROOM,
    )
    assert len(opening.first_arrivals(MIXED)) == 1
    machine = started(MIXED, opening)
    events = machine.engine().trace().events
    adds = [e for e in events if isinstance(e, AddRequest)]
    assert [len(a.prompt_token_ids) for a in adds] == [1, 46]
    assert sum(isinstance(e, Step) for e in events) == 8
    machine.apply(Step())
    state = machine.engine().state
    assert state.sglang is not None and state.sglang.chunked_request_id == adds[1].request_id
    machine.teardown()


def test_fit_room_counts_the_running_reservations() -> None:
    """fit_room: free and evictable slots less each running request's remaining future at
    new_token_ratio (the fit test's remaining_total before any admission of the pass)."""
    machine = started(MIXED, Opening((draw(ONE_TOKEN, 40),)))
    for _ in range(8):
        machine.apply(Step())
    state = machine.engine().state
    assert state.sglang is not None
    (rid,) = state.running
    left = 40 - len(state.requests[rid].output_token_ids)
    expected = len(state.kv.free_block_ids) - running_reservation(
        left, state.sglang.new_token_ratio
    )
    assert fit_room(state) == int(expected)
    machine.teardown()


def test_a_cohort_arrives_one_a_step_and_small_requests_after() -> None:
    """cohort-then-small: each first arrival is followed by a step (stagger 1), then the
    opening's steps, then the late arrivals together."""
    cohort = tuple(draw(ONE_TOKEN, 30) for _ in range(3))
    config = dataclasses.replace(
        MIXED, enable_mixed_chunk=False, max_num_seqs=8, max_num_batched_tokens=128
    )
    machine = started(config, Opening(cohort, 1, 4, (draw(ONE_TOKEN, 2), draw(ONE_TOKEN, 2))))
    kinds = [
        "add" if isinstance(e, AddRequest) else "step" for e in machine.engine().trace().events
    ]
    assert kinds == ["add", "step"] * 3 + ["step"] * 4 + ["add", "add"]
    machine.teardown()


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_long_after_decodes_is_drawn_only_under_mixed_chunks(data: st.DataObject) -> None:
    """Without mixed chunks no decode runs beside a chunk: the opening that needs one is
    never drawn there."""
    plain = dataclasses.replace(MIXED, enable_mixed_chunk=False)
    opening = data.draw(sglang_openings(8, plain))
    assert opening.late_shape is not LateShape.FITS_ROOM


# Pages of one token, a pool of 64, no chunking, four seats, the lowest conservativeness.
TIGHT = make_config(
    family="sglang",
    block_size=1,
    num_blocks=64,
    max_model_len=64,
    max_num_seqs=4,
    max_num_batched_tokens=64,
    schedule_conservativeness=0.1,
)


def test_tied_decodes_retract_the_longest_prompt_and_rank_the_shortest_first() -> None:
    """tied-decodes: prompts of 3, 1, 3 and 1 tokens with long futures (25, 25, 17, 17)
    arrive at once. The first pass admits the first two, each reserving its whole future
    (56 of 64 slots); the next pass, against their futures at 0.07, admits the other two,
    and the first two do not decode in that prefill step: all four carry one output. They
    decode in step until the pool runs out, then SGLang retracts one, ranked by (outputs,
    shortest prompt): a 3-token prompt, the later one (a stable sort keeps ties in batch
    order); the survivors run shortest prompt first, the 1-token requests ahead of the
    3-token one that arrived first."""
    opening = Opening(tuple(draw(ANY_LENGTH, future, length - 1) for length, future in TIED_SHAPES))
    machine = started(TIGHT, opening)
    r0, r1, r2, r3 = (
        e.request_id for e in machine.engine().trace().events if isinstance(e, AddRequest)
    )
    state = machine.engine().state
    for _ in range(20):
        machine.apply(Step())
        state = machine.engine().state
        if any(r.status == RequestStatus.PREEMPTED for r in state.requests.values()):
            break
    assert state.waiting == (r2,)
    assert state.running == (r1, r3, r0)
    outputs = [len(state.requests[r].output_token_ids) for r in (r0, r1, r2, r3)]
    assert outputs == [16, 16, 15, 16]
    machine.teardown()


# tied-decodes' worked example: (prompt length, max_tokens) in arrival order.
TIED_SHAPES = ((3, 25), (1, 25), (3, 17), (1, 17))


def test_tied_decodes_are_drawn_only_where_prompts_differ() -> None:
    """Where the longest prompt is one token (sglang-crowded's context), ties cannot differ
    in prompt length: the opening that ranks them by it has no weight there."""
    crowded = dataclasses.replace(TIGHT, max_model_len=MIN_SGLANG_MAX_MODEL_LEN)
    assert max_prompt_tokens(crowded) == 1
    assert opening_weights(crowded)[3] == 0
    assert opening_weights(TIGHT)[3] > 0
    mixed = dataclasses.replace(crowded, enable_chunked_prefill=True, enable_mixed_chunk=True)
    assert opening_weights(mixed)[3] == 0


# ones-then-long's config: pages of 4, a chunk budget of 16.
PAGED_CHUNKS = dataclasses.replace(
    TIGHT, block_size=4, enable_chunked_prefill=True, max_num_batched_tokens=16
)


def test_ones_then_long_is_drawn_only_for_chunks_of_pages() -> None:
    """ones-then-long shows the chunk budget paying whole pages: it has weight only where a
    page holds more than a token and prefill is chunked by a budget below the longest
    prompt."""
    assert opening_weights(PAGED_CHUNKS)[4] > 0
    assert opening_weights(dataclasses.replace(PAGED_CHUNKS, block_size=1))[4] == 0
    unchunked = dataclasses.replace(
        PAGED_CHUNKS, enable_chunked_prefill=False, max_num_batched_tokens=64
    )
    assert opening_weights(unchunked)[4] == 0
    # A budget that takes the longest prompt whole never chunks it.
    assert opening_weights(dataclasses.replace(PAGED_CHUNKS, max_num_batched_tokens=64))[4] == 0


@settings(max_examples=5, deadline=None)
@given(ones_then_long())
def test_ones_then_long_ends_past_the_chunk_budget(opening: Opening) -> None:
    """Two to four one-token prompts drawn, at most three kept (four seats leave the long
    prompt one), then one 1 to 8 tokens longer than the chunk budget (16 here), all before
    the first step."""
    machine = started(PAGED_CHUNKS, opening)
    events = machine.engine().trace().events
    lengths = [len(e.prompt_token_ids) for e in events if isinstance(e, AddRequest)]
    assert lengths[:-1] == [1] * (len(lengths) - 1) and 2 <= len(lengths) - 1 <= 3
    assert 16 < lengths[-1] <= 24
    assert not any(isinstance(e, Step) for e in events)
    machine.teardown()


def test_ones_then_long_chunks_the_long_prompt_to_the_budget_the_pages_leave() -> None:
    """Two one-token prompts and a 17-token one: the first pass admits the two, each paying
    a page (4) of the 16-token chunk budget, and chunks the long prompt to the 8 left. A
    budget paid in raw tokens would have left 14, a chunk of 12."""
    opening = Opening(
        (draw(ONE_TOKEN, 2), draw(ONE_TOKEN, 2)),
        late=(draw(ANY_LENGTH, 2),),
        late_shape=LateShape.PAST_CHUNK,
    )
    machine = started(PAGED_CHUNKS, opening)
    machine.apply(Step())
    state = machine.engine().state
    r0, r1, long = (
        e.request_id for e in machine.engine().trace().events if isinstance(e, AddRequest)
    )
    assert len(state.requests[long].prompt_token_ids) == 17
    assert state.sglang is not None and state.sglang.chunked_request_id == long
    computed = {r: state.requests[r].num_computed_tokens for r in (r0, r1, long)}
    assert computed == {r0: 1, r1: 1, long: 8}
    machine.teardown()


def test_ones_before_long_leaves_the_long_prompt_a_seat_a_page_and_the_pool() -> None:
    """Four seats, a budget of four pages of 4 and a pool of 64 pages: three short prompts
    (a seat, a page of budget and 4 + 4 pool tokens each) leave the long one a seat and a
    page. Two seats leave room for one short prompt; a budget of one page for none (the
    opening is then never drawn). A budget of ten pages in a pool of 16 pages (64 tokens):
    the long prompt (at most 40 + 8 tokens, a future of 4) leaves 12, one short prompt."""
    assert ones_before_long(PAGED_CHUNKS) == 3
    assert ones_before_long(dataclasses.replace(PAGED_CHUNKS, max_num_seqs=2)) == 1
    one_page = dataclasses.replace(PAGED_CHUNKS, max_num_batched_tokens=4)
    assert ones_before_long(one_page) == 0 and opening_weights(one_page)[4] == 0
    small_pool = dataclasses.replace(PAGED_CHUNKS, num_blocks=16, max_num_batched_tokens=40)
    assert ones_before_long(small_pool) == 1
    assert opening_weights(small_pool)[4] > 0


def test_the_short_prompts_are_cut_to_what_leaves_the_long_one_a_pass() -> None:
    """Four short prompts drawn, two seats: one arrives before the long prompt."""
    opening = Opening(
        tuple(draw(ONE_TOKEN, 2) for _ in range(4)),
        late=(draw(ANY_LENGTH, 2),),
        late_shape=LateShape.PAST_CHUNK,
    )
    machine = started(dataclasses.replace(PAGED_CHUNKS, max_num_seqs=2), opening)
    events = machine.engine().trace().events
    lengths = [len(e.prompt_token_ids) for e in events if isinstance(e, AddRequest)]
    assert lengths == [1, 17]
    machine.teardown()


def test_a_regimes_configs_draw_its_opening_at_least_half_the_time() -> None:
    """sglang-readmit's configs (its narrowing's fixed points) draw cohort-then-small, and
    sglang-paged-chunks' draw ones-then-long, at least half the time; a config outside
    both keeps the plain weights."""
    readmit = sglang_readmit(TIGHT)
    assert paired_opening(readmit) == "cohort-then-small"
    weights = opening_weights(readmit)
    assert weights[2] * 2 >= sum(weights)
    paged = sglang_paged_chunks(TIGHT)
    assert paired_opening(paged) == "ones-then-long"
    weights = opening_weights(paged)
    assert weights[4] * 2 >= sum(weights)
    assert paired_opening(TIGHT) is None
    assert opening_weights(TIGHT) == (2, 0, 1, 1, 0)
