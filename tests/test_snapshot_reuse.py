"""The reference's snapshots share unchanged parts with the last one, and are equal to
snapshots built afresh: reuse changes what a snapshot costs, never what it says."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from schedspec.adapters.reference import ReferenceEngine, reference_engine
from schedspec.engines.events import Step
from schedspec.properties.checked_engine import CheckedEngine, CheckStats
from schedspec.properties.strategies.actions import RequestDraw, request_draws
from schedspec.properties.strategies.configs import configs
from schedspec.reference.request_records import COPIED_AS_IS, COPIED_OR_GIVEN, RequestRecords
from schedspec.spec import RemoteKV, Request, RequestState, RequestStatus, SchedulerConfig, State
from tests.sched_helpers import add_drawn


def _afresh(engine: ReferenceEngine) -> State:
    """The engine's snapshot with nothing kept from earlier ones."""
    kept_records = engine._records
    pool = engine.kv_cache_manager.block_pool
    kept_kv, kept_ids = pool._last_snapshot, pool.free_block_queue._ids
    engine._records = RequestRecords()
    pool._last_snapshot, pool.free_block_queue._ids = None, None
    try:
        return engine.snapshot()
    finally:
        engine._records = kept_records
        pool._last_snapshot, pool.free_block_queue._ids = kept_kv, kept_ids


def test_a_record_is_kept_while_its_request_is_unchanged_and_rebuilt_after() -> None:
    records = RequestRecords()
    request = Request("r", (1, 2, 3), max_tokens=4)
    first = records.record(request, (0,))
    records.done()
    assert records.record(request, (0,)) is first
    records.done()
    request.output_token_ids.append(7)  # changed in place: a new record
    second = records.record(request, (0,))
    records.done()
    assert second is not first and second.output_token_ids == (7,)
    request.num_computed_tokens = 3
    assert records.record(request, (0,)).num_computed_tokens == 3
    records.done()
    assert records.record(request, (0, 1)).block_ids == (0, 1)


def test_a_record_is_compared_on_every_field_of_requeststate() -> None:
    """A field added to RequestState (and so to what RequestState.of reads) must be
    compared before a record is reused, or a reused record would miss its change."""
    names = [f.name for f in dataclasses.fields(RequestState)]
    assert sorted(names) == sorted((*COPIED_AS_IS, *COPIED_OR_GIVEN))


def test_every_field_a_record_copies_is_compared() -> None:
    """A change to any single field of the request gives a new record, equal to
    RequestState.of's."""
    changes = {
        "priority": 5,
        "arrival": 9,
        "num_computed_tokens": 2,
        "status": RequestStatus.RUNNING,
        "num_preemptions": 1,
        "max_tokens": 8,
        "eos_token_id": 3,
        "stop_token_ids": (4,),
        "num_in_flight_tokens": 1,
        "num_output_placeholders": 1,
        "num_stale_output_tokens": 1,
        "drop_stale_output": True,
        "abort_pending": True,
        "is_prefill_chunk": True,
        "shared_prefix_boundary": 4,
        "spec_token_ids": [5],
        "prompt_token_ids": (1, 2),
        "remote_kv": RemoteKV(num_tokens=2),
    }
    fields = {f.name for f in dataclasses.fields(RequestState)}
    assert fields - set(changes) == {
        "request_id",
        "output_token_ids",
        "block_ids",
        "group_block_ids",
    }
    for name, value in changes.items():
        records = RequestRecords()
        request = Request("r", (1, 2, 3), max_tokens=4)
        records.record(request, ())
        records.done()
        setattr(request, name, value)
        record = records.record(request, ())
        assert record == RequestState.of(request, ()), name
        assert getattr(record, name) == (tuple(value) if isinstance(value, list) else value)


@settings(max_examples=40, deadline=None)
@given(
    config=configs(),
    draws=st.lists(request_draws, min_size=1, max_size=6),
    num_steps=st.integers(1, 10),
)
def test_shared_snapshots_equal_fresh_ones(
    config: SchedulerConfig, draws: list[RequestDraw], num_steps: int
) -> None:
    checked = CheckedEngine.from_factory(reference_engine, config, "vllm-v1", stats=CheckStats())
    engine = checked.engine.inner  # type: ignore[attr-defined]
    if not isinstance(engine, ReferenceEngine):
        return  # the SGLang family's reference builds its snapshots afresh
    for index, drawn in enumerate(draws):
        add_drawn(checked, config, index, drawn)
        assert engine.snapshot() == _afresh(engine)
    for _ in range(num_steps):
        checked.apply(Step())
        assert engine.snapshot() == _afresh(engine)
