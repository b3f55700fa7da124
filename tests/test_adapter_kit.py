"""The adapter kit's parts (schedspec.adapters.kit), each on a worked example: what every
adapter derives the same way, written once."""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.adapters.kit import (
    EngineRequest,
    FinishedSince,
    Given,
    HashCollisionError,
    HashTranslator,
    InFlight,
    OwnHashes,
    Pipeline,
    ScheduledRow,
    request_state,
    step_output,
)
from schedspec.spec import (
    CachedRequestData,
    KVState,
    ModelRunnerOutput,
    NewRequestData,
    OutputError,
    Request,
    RequestError,
    RequestOutput,
    RequestStatus,
    SchedulerConfig,
    State,
    extend_block_hashes,
)
from tests.example_engine import ADAPTER

import toyserve_adapter  # isort: skip  (on the path tests.example_engine sets)

CONFIG = SchedulerConfig(
    block_size=2, num_blocks=8, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=16
)
GIVEN = Given.of(Request("a", (1, 2, 3), 5, eos_token_id=9, stop_token_ids=(8,), priority=2), 4)


def test_given_keeps_what_add_request_was_told() -> None:
    assert (GIVEN.arrival, GIVEN.priority, GIVEN.eos_token_id, GIVEN.stop_token_ids) == (
        4,
        2,
        9,
        (8,),
    )
    assert (GIVEN.prompt_token_ids, GIVEN.max_tokens, GIVEN.remote_kv) == ((1, 2, 3), 5, None)


def test_request_state_fills_every_field_from_five_the_engine_gives() -> None:
    engine = EngineRequest((7,), 3, RequestStatus.RUNNING, (0, 1), 1)
    state = request_state("a", GIVEN, engine, InFlight(tokens=1, prefill_chunk=False))
    assert (state.prompt_token_ids, state.output_token_ids) == ((1, 2, 3), (7,))
    assert (state.priority, state.arrival, state.max_tokens) == (2, 4, 5)
    assert (state.eos_token_id, state.stop_token_ids) == (9, (8,))
    assert (state.num_computed_tokens, state.block_ids, state.num_preemptions) == (3, (0, 1), 1)
    assert state.num_in_flight_tokens == 1
    # The engine's own word wins where it keeps one (SGLang clips max_tokens).
    clipped = request_state("a", GIVEN, engine._replace(max_tokens=2, prompt_token_ids=(1,)))
    assert (clipped.max_tokens, clipped.prompt_token_ids) == (2, (1,))


def test_own_hashes_grow_with_the_tokens_and_match_the_spec() -> None:
    own = OwnHashes(2)
    assert own.of("a", [1, 2, 3]) == extend_block_hashes([], [1, 2, 3], 2)
    assert own.of("a", [1, 2, 3, 4]) == extend_block_hashes([], [1, 2, 3, 4], 2)
    own.keep_only([])
    assert own.of("a", [5, 6]) == extend_block_hashes([], [5, 6], 2)


def test_the_translator_pairs_engine_hashes_with_the_spec_by_content() -> None:
    hashes = HashTranslator(2)
    spec = extend_block_hashes([], [1, 2, 3, 4], 2)
    hashes.learn("a", ["x", "y"], [1, 2, 3, 4, 5])
    assert (hashes.spec_of("x"), hashes.spec_of("y")) == tuple(spec)
    hashes.forget("a")  # the request goes; the pairs it taught stay (a freed block keeps them)
    assert hashes.spec_or_none("y") == spec[1] and hashes.spec_or_none(None) is None
    with pytest.raises(RuntimeError, match="no request's tokens produced"):
        hashes.spec_of("z")
    with pytest.raises(HashCollisionError, match="the hash of other content"):
        hashes.learn("b", ["x"], [9, 9])  # "x" named [1, 2] before
    with pytest.raises(RuntimeError, match="its tokens fill only 1"):
        hashes.learn("c", ["p", "q"], [1, 2, 3])


def test_the_pipeline_of_a_synchronous_engine_holds_a_step_until_it_lands() -> None:
    pipeline = Pipeline(async_scheduling=False)
    rows = {"a": ScheduledRow("a", 3, 0, False)}
    pipeline.on_schedule(rows)
    assert pipeline.of("a") == InFlight(tokens=3, prefill_chunk=True)
    pipeline.on_land(rows)
    assert pipeline.of("a") == InFlight(tokens=0, prefill_chunk=True)
    pipeline.on_schedule(rows)
    pipeline.on_preempt("a", drop_stale=False)  # stale, and delivered (vLLM's way)
    assert pipeline.of("a") == InFlight(tokens=3, stale=3)
    pipeline.forget("a")
    assert pipeline.of("a") == InFlight()


def _state(**requests: tuple[RequestStatus, tuple[int, ...], tuple[int, ...]]) -> State:
    built = {
        rid: request_state(rid, GIVEN, EngineRequest(outputs, 0, status, blocks, 0))
        for rid, (status, blocks, outputs) in requests.items()
    }
    running = tuple(rid for rid, r in built.items() if r.status is RequestStatus.RUNNING)
    waiting = tuple(rid for rid in built if rid not in running)
    kv = KVState(8, tuple(range(8)), (0,) * 8, (None,) * 8, ())
    return State(CONFIG, built, waiting, running, kv)


def test_step_output_is_derived_from_the_states_around_schedule() -> None:
    pre = _state(
        new=(RequestStatus.WAITING, (), ()),
        back=(RequestStatus.PREEMPTED, (), (7, 7)),
        old=(RequestStatus.RUNNING, (3,), (7,)),
        victim=(RequestStatus.RUNNING, (4,), ()),
    )
    post = _state(
        new=(RequestStatus.RUNNING, (0, 1), ()),
        back=(RequestStatus.RUNNING, (2,), (7, 7)),
        old=(RequestStatus.RUNNING, (3, 5), (7,)),
        victim=(RequestStatus.PREEMPTED, (), ()),
    )
    rows = (
        ScheduledRow("old", 1, 3, True),
        ScheduledRow("new", 3, 0, True),
        ScheduledRow("back", 5, 0, True),
    )
    output = step_output(rows, pre, post, frozenset({"gone"}))
    assert output.scheduled_new_reqs == (NewRequestData("new", (1, 2, 3), (0, 1), 0),)
    assert output.scheduled_cached_reqs == (
        CachedRequestData("old", False, (5,), 3, 1),
        CachedRequestData("back", True, (2,), 0, 2),
    )
    assert list(output.num_scheduled_tokens.items()) == [("old", 1), ("new", 3), ("back", 5)]
    assert output.total_num_scheduled_tokens == 9
    assert output.preempted_req_ids == frozenset({"victim"})
    assert output.finished_req_ids == frozenset({"gone"})


def test_finished_since_reports_each_request_once() -> None:
    finished = FinishedSince()
    before = _state(a=(RequestStatus.RUNNING, (0,), ()), b=(RequestStatus.WAITING, (), ()))
    finished.note(before, _state(b=(RequestStatus.WAITING, (), ())))
    assert finished.take() == {"a"}
    assert finished.take() == frozenset()


def test_the_kit_adapter_refuses_what_no_engine_may_be_handed() -> None:
    adapter = toyserve_adapter.ToyServeAdapter(CONFIG)
    adapter.add_request(Request("a", (1, 2, 3), 2))
    with pytest.raises(RequestError, match="duplicate request id 'a'"):
        adapter.add_request(Request("a", (1, 2, 3), 2))
    with pytest.raises(OutputError, match="schedules no drafts"):
        adapter.update_draft_token_ids({"a": (5,)})
    step = adapter.schedule()
    answer = ModelRunnerOutput({"a": [7]})
    with pytest.raises(OutputError, match="not the oldest schedule"):
        adapter.update_from_output(dataclasses.replace(step, total_num_scheduled_tokens=9), answer)
    assert adapter.update_from_output(step, answer) == {"a": RequestOutput("a", (7,), None)}


def test_the_tutorial_adapter_is_the_file_examples_holds() -> None:
    assert toyserve_adapter.__file__ == str(ADAPTER)
