"""The SGLang adapter's pure parts, which need no SGLang: the configs it runs and
refuses, its request ids, the block ids and free queue it reads from SGLang's pool, the
in-flight counters it keeps, the probe's plan, and the error where SGLang is missing.
(tests/test_sglang_adapter.py drives SGLang itself.)"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schedspec.adapters.kit import Given, InFlight, Pipeline, ScheduledRow
from schedspec.adapters.sglang import runtime as sglang_runtime
from schedspec.adapters.sglang.config import max_running_requests, refusal
from schedspec.adapters.sglang.engine import SGLangEngine
from schedspec.adapters.sglang.kv import (
    KVReads,
    SlotContents,
    free_block_order,
    slot_block,
    table_blocks,
)
from schedspec.adapters.sglang.probe import CACHE_VARIABLES, FAMILIES, PLAN
from schedspec.adapters.sglang.requests import (
    RequestStates,
    int_tuple,
    request_state,
    sglang_rid,
    spec_id,
)
from schedspec.properties import probe as runner
from schedspec.properties.strategies.engine_configs import sglang_default_configs
from schedspec.spec import RequestState, RequestStatus, SchedulerConfig


def sglang_config(**fields: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "family": "sglang",
        "block_size": 1,
        "num_blocks": 16,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 4,
        "max_model_len": 16,
    }
    return SchedulerConfig(**{**base, **fields})  # type: ignore[arg-type]


class TestConfigs:
    def test_max_running_requests_is_half_the_pools_tokens(self) -> None:
        # 16 slots: SGLang runs at most 8 requests; 6 pages of 4: 12.
        assert max_running_requests(sglang_config()) == 8
        assert max_running_requests(sglang_config(block_size=4, num_blocks=6)) == 12

    def test_more_running_requests_than_sglang_allows_is_refused_naming_the_field(self) -> None:
        refused = refusal(sglang_config(num_blocks=16, max_num_seqs=9))
        assert refused is not None and refused.field == "max_num_seqs"
        assert "half the pool's tokens, 8 here: got 9" in str(refused)
        assert refusal(sglang_config(max_num_seqs=8)) is None

    @settings(max_examples=200, deadline=None)
    @given(st.data())
    def test_the_default_configs_are_sglangs_family_within_its_caps(
        self, data: st.DataObject
    ) -> None:
        config = data.draw(sglang_default_configs())
        assert config.family == "sglang"
        assert refusal(config) is None

    def test_the_default_configs_reach_both_loops_and_every_knob(self) -> None:
        seen: set[tuple[object, ...]] = set()

        @settings(max_examples=300, deadline=None, database=None)
        @given(sglang_default_configs())
        def collect(config: SchedulerConfig) -> None:
            seen.add(
                (
                    config.async_scheduling,
                    config.enable_prefix_caching,
                    config.enable_chunked_prefill,
                    config.enable_mixed_chunk,
                )
            )

        collect()
        assert {s[0] for s in seen} == {False, True}
        assert {s[1] for s in seen} == {False, True}
        assert {s[2] for s in seen} == {False, True}
        assert {s[3] for s in seen} == {False, True}


class TestIds:
    def test_rids_are_prefix_free_and_translate_back(self) -> None:
        # SGLang aborts every rid that starts with the aborted one: "1#r" and "10#r"
        # must not be prefixes of each other, and ids with the separator survive.
        assert sglang_rid("r", 1) == "1#r"
        assert not sglang_rid("r", 10).startswith(sglang_rid("r", 1))
        assert spec_id(sglang_rid("a#b", 3)) == "a#b"


@dataclass
class _Allocator:
    free_pages: object
    release_pages: object | None = None


class TestBlocks:
    def test_slot_zero_and_page_zero_are_sglangs_padding(self) -> None:
        assert [slot_block(s, 1) for s in (1, 2, 9)] == [0, 1, 8]
        # page_size 4: slots 4-7 are page 1, block 0.
        assert [slot_block(s, 4) for s in (4, 7, 8, 13)] == [0, 0, 1, 2]

    def test_a_table_has_one_block_per_page_its_slots_touch(self) -> None:
        assert table_blocks([5, 3, 9], 1) == (4, 2, 8)
        assert table_blocks([8, 9, 10, 11, 20, 21], 4) == (1, 4)

    def test_the_free_queue_is_free_pages_then_held_back_pages_then_evictable(self) -> None:
        # SGLang's allocator keeps its free pages in int64 tensors.
        allocator = _Allocator(torch.tensor([3, 4]), torch.tensor([7]))
        assert free_block_order(allocator, (0, 5)) == (2, 3, 6, 0, 5)
        assert free_block_order(_Allocator(torch.tensor([2])), ()) == (1,)


@dataclass
class _Req:
    """The fields of SGLang's Req that request_state reads, as SGLang keeps them."""

    rid: str = "0#a"
    origin_input_ids: array[int] = field(default_factory=lambda: array("q", [5, 6, 7]))
    output_ids: array[int] = field(default_factory=lambda: array("q"))
    retraction_count: int = 0
    kv: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(kv_allocated_len=0))
    sampling_params: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(max_new_tokens=4)
    )


GIVEN_A = Given(arrival=0, priority=0, eos_token_id=None, stop_token_ids=())


class TestRequestStates:
    """RequestStates reuses a request's last state only while nothing request_state
    reads has changed: each case changes one input and gets request_state's answer."""

    def read(self, states: RequestStates, req: _Req, **changed: Any) -> RequestState:
        args: dict[str, Any] = {"running": False, "blocks": (), "aborting": False}
        counters = changed.pop("counters", InFlight())
        args.update(changed)
        fresh = request_state(req, GIVEN_A, counters, **args)
        got = states.of(req, GIVEN_A, counters, **args)
        assert got == fresh
        return got

    def test_an_unchanged_request_gives_the_same_state_object(self) -> None:
        states, req = RequestStates(), _Req()
        first = self.read(states, req)
        assert self.read(states, req) is first

    def test_a_token_changed_in_place_is_read_again(self) -> None:
        states, req = RequestStates(), _Req(output_ids=array("q", [1, 2]))
        first = self.read(states, req)
        req.output_ids[1] = 9  # same length, another token: compared item for item
        assert self.read(states, req) is not first
        req.origin_input_ids[0] = 8
        assert self.read(states, req).prompt_token_ids == (8, 6, 7)

    def test_each_other_input_is_compared(self) -> None:
        states, req = RequestStates(), _Req()
        self.read(states, req)
        req.retraction_count = 1
        assert self.read(states, req).status is RequestStatus.PREEMPTED
        req.sampling_params.max_new_tokens = 2
        assert self.read(states, req).max_tokens == 2
        req.kv.kv_allocated_len = 3
        running = self.read(states, req, running=True, blocks=(0, 1, 2))
        assert running.num_computed_tokens == 3
        assert self.read(states, req, running=True, blocks=(0, 1, 2), aborting=True).abort_pending
        held = self.read(states, req, counters=InFlight(tokens=1, placeholders=1))
        assert held.num_in_flight_tokens == 1

    def test_another_req_object_under_the_same_rid_is_read_again(self) -> None:
        states = RequestStates()
        first = self.read(states, _Req())
        assert self.read(states, _Req()) is not first

    def test_token_ids_are_ints_from_an_array_or_anything_else(self) -> None:
        assert int_tuple(array("q", [3, 4])) == (3, 4)
        assert int_tuple(torch.tensor([3, 4])) == (3, 4)
        assert all(type(t) is int for t in int_tuple(torch.tensor([3, 4])))


class _TreeCore:
    """The Rust tree core's walk, as walk_for_kv_canary gives it: slots, their
    positions and the slot before each, in tensors; `locked` slots are left out of the
    unlocked-only walk."""

    def __init__(self, slots: list[int], positions: list[int], previous: list[int]) -> None:
        self.slots, self.positions, self.previous = slots, positions, previous
        self.locked: set[int] = set()

    def walk_for_kv_canary(self, unlocked_only: bool, _: bool) -> SimpleNamespace:
        keep = [i for i, s in enumerate(self.slots) if not (unlocked_only and s in self.locked)]
        return SimpleNamespace(
            slot_indices=torch.tensor([self.slots[i] for i in keep]),
            positions=torch.tensor([self.positions[i] for i in keep]),
            prev_slot_indices=torch.tensor([self.previous[i] for i in keep]),
        )


def _scheduler(core: _TreeCore, allocator: _Allocator) -> SimpleNamespace:
    return SimpleNamespace(
        tree_cache=SimpleNamespace(disable=False, tree_core=core),
        token_to_kv_pool_allocator=allocator,
    )


class TestReadsKeptUntilChanged:
    """What KVReads and SlotContents keep between reads is read again once anything it
    was read from changed: each case changes one input and gets a fresh read's answer."""

    def test_free_pages_are_read_again_after_an_in_place_write_or_a_new_tensor(self) -> None:
        pages = torch.tensor([3, 4])
        allocator = _Allocator(pages)
        reads = KVReads(SlotContents(1), 8)
        scheduler = SimpleNamespace(
            tree_cache=SimpleNamespace(disable=True), token_to_kv_pool_allocator=allocator
        )
        assert reads.read(scheduler, {}).free_block_ids == (2, 3)
        pages[0] = 6  # the same tensor, written in place: its _version moves
        assert reads.read(scheduler, {}).free_block_ids == (5, 3)
        allocator.free_pages = pages[1:]  # a new tensor, as SGLang allocates
        assert reads.read(scheduler, {}).free_block_ids == (3,)
        allocator.release_pages = torch.tensor([8])
        assert reads.read(scheduler, {}).free_block_ids == (3, 7)

    def test_an_unchanged_row_keeps_its_table_and_the_records_their_version(self) -> None:
        contents = SlotContents(2)
        table = contents.observe("0#a", [5, 6, 7], [2, 3, 4])
        assert table == (0, 1)
        version = contents.version
        assert contents.observe("0#a", [5, 6, 7], [2, 3, 4]) is table
        assert contents.version == version
        # The token that fills the second block: its content is recorded, the version moves.
        assert contents.observe("0#a", [5, 6, 7, 8], [2, 3, 4]) == (0, 1)
        assert contents.version > version
        assert contents.content_of(1) is not None

    def test_the_trees_hashes_are_read_again_when_the_walk_or_the_records_change(self) -> None:
        contents = SlotContents(1)
        contents.observe("0#a", [5, 6], [1, 2])
        core = _TreeCore([1, 2], [0, 1], [0, 1])
        scheduler = _scheduler(core, _Allocator(torch.tensor([4])))
        reads = KVReads(contents, 4)
        first = reads.read(scheduler, {})
        assert first.block_hashes[:2] == (contents.content_of(0), contents.content_of(1))
        assert reads.read(scheduler, {}).block_hashes is first.block_hashes
        core.locked = {1, 2}  # locked now: not evictable, the same tree
        assert reads.read(scheduler, {}).free_block_ids == (3,)
        # Another request wrote slot 2 at another position: the same walk is refused now.
        contents.observe("1#b", [9, 9, 9], [3, 4, 2])
        with pytest.raises(RuntimeError, match="holds slot 2 at position 1"):
            reads.read(scheduler, {})
        # A walk that grew is checked and hashed anew.
        core.slots, core.positions, core.previous = [3, 4, 2], [0, 1, 2], [0, 3, 4]
        grown = reads.read(scheduler, {})
        assert grown.block_hashes[1:4] == tuple(contents.content_of(b) for b in (1, 2, 3))


class TestPipeline:
    def test_an_overlap_step_holds_tokens_and_a_placeholder_until_it_lands(self) -> None:
        pipeline = Pipeline(async_scheduling=True)
        rows = {"0#a": ScheduledRow("a", 5, 0, True)}
        pipeline.on_schedule(rows)
        held = pipeline.of("0#a")
        assert (held.tokens, held.placeholders, held.prefill_chunk) == (5, 1, False)
        pipeline.on_land(rows)
        assert (pipeline.of("0#a").tokens, pipeline.of("0#a").placeholders) == (0, 0)

    def test_a_retracted_requests_step_in_flight_is_stale_and_dropped(self) -> None:
        pipeline = Pipeline(async_scheduling=True)
        rows = {"0#a": ScheduledRow("a", 1, 7, True)}
        pipeline.on_schedule(rows)
        pipeline.on_preempt("0#a", drop_stale=True)
        held = pipeline.of("0#a")
        assert (held.stale, held.drop_stale, held.placeholders) == (1, True, 0)
        pipeline.on_land(rows)
        held = pipeline.of("0#a")
        assert (held.tokens, held.stale, held.drop_stale) == (0, 0, False)

    def test_a_chunk_samples_nothing_and_leaves_no_placeholder(self) -> None:
        pipeline = Pipeline(async_scheduling=True)
        pipeline.on_schedule({"0#a": ScheduledRow("a", 8, 0, False)})
        held = pipeline.of("0#a")
        assert (held.tokens, held.placeholders, held.prefill_chunk) == (8, 0, True)


def test_the_probe_families_are_every_loop_cache_page_and_mixed_combination() -> None:
    combinations = {(f.overlap, f.radix_cache, f.page_size, f.mixed_chunk) for f in FAMILIES}
    assert len(FAMILIES) == len(combinations) == 16
    assert [refusal(f.config()) for f in FAMILIES] == [None] * 16


def test_the_probe_plan_is_the_sglang_engine_on_its_families_and_caches() -> None:
    assert (PLAN.engine, PLAN.build, PLAN.built) == ("SGLang", SGLangEngine, "SGLangEngines")
    assert (PLAN.families, PLAN.cache_variables) == (FAMILIES, CACHE_VARIABLES)
    assert runner.PLANS["sglang"] is PLAN


def test_missing_sglang_names_the_install_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang_runtime.SGLANG, "loaded", None)
    monkeypatch.setattr(sglang_runtime, "_stub_torchvision_if_broken", lambda: None)
    # `import sglang...` fails here, also where SGLang's modules were imported already.
    for name in ["sglang", *(m for m in sys.modules if m.startswith("sglang."))]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(sglang_runtime.SglangMissingError, match=r"schedspec install sglang"):
        sglang_runtime.load_sglang()
    assert not sglang_runtime.sglang_available()
