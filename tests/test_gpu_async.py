"""gpu_impl's async scheduling and spec-decode padding, beside the reference, call by call.

`Pair` drives the reference and gpu_impl (B = 1) through the same calls in any order
(schedule() several times before an output lands, as a batch queue deeper than the
engine core's does) and requires every result and every state after each call to be
equal field by field: the pipeline counters, placeholder drafts, block ids and the
free queue included. The worked examples below each reach one rule and state what
gpu_impl holds there; the last test draws random call orders.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import schedspec.gpu_impl.admission as admission
from schedspec.adapters.gpu import GpuEngine
from schedspec.adapters.reference import ReferenceEngine
from schedspec.engines.fake_model import FakeModel, StepDecisions
from schedspec.gpu_impl.batch_state import BatchState
from schedspec.properties.strategies.configs import configs
from schedspec.spec import (
    PLACEHOLDER_TOKEN_ID,
    Request,
    RequestOutput,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from tests.sched_helpers import make_config

PH = PLACEHOLDER_TOKEN_ID


def same_state(left: State, right: State) -> str | None:
    """Where two states differ (every request field, block ids, the free queue, ref
    counts, cached hashes and their holders), or None. The prefix-cache map is compared
    as a map: gpu_impl orders its keys by oldest holder (docs/GPU_IMPL.md)."""
    if left.requests != right.requests:
        for rid in left.requests.keys() | right.requests.keys():
            if left.requests.get(rid) != right.requests.get(rid):
                return f"request {rid}: {left.requests.get(rid)} != {right.requests.get(rid)}"
    for name in ("waiting", "running"):
        if getattr(left, name) != getattr(right, name):
            return f"{name}: {getattr(left, name)} != {getattr(right, name)}"
    a, b = left.kv, right.kv
    for name in ("free_block_ids", "ref_counts", "block_hashes"):
        if getattr(a, name) != getattr(b, name):
            return f"kv.{name}: {getattr(a, name)} != {getattr(b, name)}"
    if dict(a.prefix_cache) != dict(b.prefix_cache):
        return f"kv.prefix_cache: {a.prefix_cache} != {b.prefix_cache}"
    return None


class Pair:
    """The reference and gpu_impl called alike; each call's results must be equal."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.reference = ReferenceEngine(config)
        self.gpu = GpuEngine(config, device="cpu")
        self.model = FakeModel(
            seed=0, vocab_size=64, num_speculative_tokens=config.num_speculative_tokens
        )
        # Each step in flight as each engine returned it (the reference takes back only
        # its own outputs).
        self.in_flight: deque[tuple[SchedulerOutput, SchedulerOutput]] = deque()
        self._compare("the start")

    def _compare(self, after: str) -> None:
        difference = same_state(self.reference.snapshot(), self.gpu.snapshot())
        assert difference is None, f"after {after}: {difference}"

    def add(self, rid: str, prompt: Sequence[int], max_tokens: int = 100, **kw: Any) -> None:
        for engine in (self.reference, self.gpu):
            engine.add_request(Request(rid, tuple(prompt), max_tokens, **kw))
        self._compare(f"add_request({rid})")

    def abort(self, *ids: str) -> None:
        for engine in (self.reference, self.gpu):
            engine.finish_requests(ids)
        self._compare(f"finish_requests({ids})")

    def schedule(self) -> SchedulerOutput:
        """Schedule a step and put it in flight; returns gpu_impl's output."""
        expected, output = self.reference.schedule(), self.gpu.schedule()
        assert output == expected, f"schedule(): {output} != {expected}"
        self._compare("schedule()")
        self.in_flight.append((expected, output))
        return output

    def land(self, decisions: StepDecisions | None = None) -> Mapping[str, RequestOutput]:
        """The oldest step in flight lands: the model answers it, both engines apply it."""
        own, output = self.in_flight.popleft()
        answer = self.model.execute(output, decisions)
        expected = self.reference.update_from_output(own, answer)
        returned = self.gpu.update_from_output(output, answer)
        assert returned == expected, f"update_from_output: {returned} != {expected}"
        self._compare("update_from_output()")
        return returned

    def request(self, rid: str) -> RequestState:
        return self.gpu.snapshot().requests[rid]

    def counters(self, rid: str) -> tuple[int, int, int, int]:
        """gpu_impl's (computed, in flight, placeholders, stale) of a live request."""
        r = self.request(rid)
        return (
            r.num_computed_tokens,
            r.num_in_flight_tokens,
            r.num_output_placeholders,
            r.num_stale_output_tokens,
        )


def prompt(first: int, length: int) -> tuple[int, ...]:
    return tuple(range(first, first + length))


def test_the_next_step_is_scheduled_before_the_output_lands() -> None:
    pair = Pair(make_config(async_scheduling=True))
    pair.add("a", prompt(1000, 5))
    assert dict(pair.schedule().num_scheduled_tokens) == {"a": 5}
    assert pair.counters("a") == (5, 5, 1, 0)  # the prefill samples: one position in flight
    second = pair.schedule()
    assert dict(second.num_scheduled_tokens) == {"a": 1}  # the in-flight token's position
    # The runner counts the output in flight: num_output_tokens 1 before any landed.
    assert second.scheduled_cached_reqs[0].num_output_tokens == 1
    assert pair.counters("a") == (6, 6, 2, 0)
    pair.land()
    assert pair.counters("a") == (6, 1, 1, 0)
    pair.land()
    assert pair.counters("a") == (6, 0, 0, 0)
    assert len(pair.request("a").output_token_ids) == 2


def test_a_request_sure_to_reach_max_tokens_is_not_scheduled_again() -> None:
    pair = Pair(make_config(async_scheduling=True))
    pair.add("a", prompt(1000, 5), max_tokens=2)
    pair.schedule()
    pair.schedule()
    pair.land()
    # 6 computed + 2 - 1 placeholder = 7 sure tokens = prompt 5 + max_tokens 2.
    assert pair.schedule().num_scheduled_tokens == {}
    assert pair.land()["a"].finish_status is RequestStatus.FINISHED_LENGTH_CAPPED
    assert pair.land() == {}


def _preempted_with_output_in_flight(b_eos: int | None = None) -> Pair:
    """4 blocks of 4: A and B (7-token prompts) fill the cache. The third step needs a
    block for A's ninth slot and preempts B (fcfs: the newest) while B's second step
    is in flight."""
    pair = Pair(make_config(async_scheduling=True, num_blocks=4, max_model_len=16))
    pair.add("A", prompt(1000, 7))
    pair.add("B", prompt(2000, 7), eos_token_id=b_eos)
    pair.schedule()
    assert dict(pair.schedule().num_scheduled_tokens) == {"A": 1, "B": 1}
    pair.land()
    assert pair.schedule().preempted_req_ids == {"B"}
    return pair


def test_preemption_turns_the_output_in_flight_stale() -> None:
    pair = _preempted_with_output_in_flight()
    assert pair.request("B").status is RequestStatus.PREEMPTED
    assert pair.counters("B") == (0, 1, 0, 1)  # reset; its one in-flight token is stale


def test_stale_output_is_delivered_and_moves_no_reset_counter() -> None:
    pair = _preempted_with_output_in_flight()
    outputs = pair.land()
    assert len(outputs["B"].new_token_ids) == 1 and outputs["B"].num_computed_tokens is None
    assert pair.counters("B") == (0, 0, 0, 0)
    assert len(pair.request("B").output_token_ids) == 2
    assert pair.gpu.snapshot().waiting == ("B",)


def test_a_request_awaiting_stale_output_is_passed_over_in_its_place() -> None:
    """A third step scheduled before the second lands: B still awaits its stale token,
    keeps the head of the queue, and C behind it is admitted."""
    pair = _preempted_with_output_in_flight()
    pair.add("C", prompt(3000, 3))
    assert set(pair.schedule().num_scheduled_tokens) == {"A", "C"}
    assert pair.gpu.snapshot().waiting == ("B",)
    pair.land()  # B's stale token lands: it may be resumed from now on
    assert pair.counters("B") == (0, 0, 0, 0)


def test_a_head_that_awaits_stale_output_but_blocks_the_queue_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule broken: B heads the queue again, does not fit, and C behind it waits."""
    pair = _preempted_with_output_in_flight()
    pair.add("C", prompt(3000, 3))

    def nobody_awaits(state: BatchState) -> torch.Tensor:
        return torch.zeros_like(state.status, dtype=torch.bool)

    monkeypatch.setattr(admission, "awaits_stale_output", nobody_awaits)
    with pytest.raises(AssertionError, match=r"schedule\(\): .*'A': 1}"):
        pair.schedule()


def test_a_stale_stop_finishes_the_preempted_request() -> None:
    pair = _preempted_with_output_in_flight(b_eos=99)
    outputs = pair.land(StepDecisions(stops={"B": 99}))
    assert outputs["B"].finish_status is RequestStatus.FINISHED_STOPPED
    assert "B" not in pair.gpu.snapshot().requests and pair.gpu.snapshot().waiting == ()


def test_placeholder_drafts_are_verified_late_and_rolled_back() -> None:
    pair = Pair(make_config(async_scheduling=True, num_speculative_tokens=2))
    pair.add("a", prompt(1000, 5))
    pair.schedule()
    assert pair.request("a").spec_token_ids == (PH, PH)  # the runner proposes them
    second = pair.schedule()
    assert dict(second.scheduled_spec_decode_tokens) == {"a": (PH, PH)}
    assert pair.counters("a") == (8, 8, 4, 0)  # 1 + (1 + 2 drafts) output positions
    pair.land()
    assert pair.counters("a") == (8, 3, 3, 0)
    pair.land(StepDecisions(accepted={"a": 1}))  # one draft accepted, one rejected
    assert pair.counters("a") == (7, 0, 0, 0)  # 8 - 1 rejected = tokens - 1


def test_only_landed_kv_is_registered_in_the_prefix_cache() -> None:
    pair = Pair(make_config(async_scheduling=True, enable_prefix_caching=True))
    pair.add("a", prompt(1000, 7))

    def registered() -> int:
        state = pair.gpu.snapshot()
        return sum(state.kv.block_hashes[b] is not None for b in state.requests["a"].block_ids)

    pair.schedule()
    assert registered() == 1  # the prompt's one full block
    pair.schedule()
    assert registered() == 1  # position 7's token is not known yet
    pair.land()
    assert registered() == 1  # known now, but its KV is computed by the step in flight
    pair.land()
    assert registered() == 2


class TestSpecDecodePadding:
    @staticmethod
    def _decoding_a(length: int = 5, **overrides: Any) -> Pair:
        """'a' has sampled its first token and decodes (no drafts proposed)."""
        pair = Pair(make_config(num_speculative_tokens=2, pad_spec_decode=True, **overrides))
        pair.add("a", prompt(1000, length))
        pair.schedule()
        pair.land()
        return pair

    def test_a_one_token_admission_beside_a_decode_is_padded(self) -> None:
        pair = self._decoding_a()
        pair.add("b", (2000,))
        step = pair.schedule()
        assert dict(step.num_scheduled_tokens) == {"a": 1, "b": 3}
        assert dict(step.scheduled_spec_decode_tokens) == {"b": (PH, PH)}
        # Slots for 3 tokens + 2 lookahead: the KV is charged like any draft's.
        assert len(pair.request("b").block_ids) == 2
        pair.land(StepDecisions(accepted={"b": 0}))  # both placeholders rejected
        assert pair.request("b").num_computed_tokens == 1

    def test_a_lone_admission_with_no_prefix_hit_is_not_padded(self) -> None:
        pair = Pair(make_config(num_speculative_tokens=2, pad_spec_decode=True))
        pair.add("b", (2000,))
        assert dict(pair.schedule().num_scheduled_tokens) == {"b": 1}

    def test_no_padding_while_a_running_prefill_continues(self) -> None:
        pair = Pair(
            make_config(
                num_speculative_tokens=2,
                pad_spec_decode=True,
                max_num_batched_tokens=16,
                long_prefill_token_threshold=8,
            )
        )
        pair.add("p", prompt(1000, 40))
        pair.schedule()  # alone, uncapped: a 16-token chunk; p is mid-prefill
        pair.land()
        pair.add("b", (2000,))
        assert dict(pair.schedule().num_scheduled_tokens) == {"p": 8, "b": 1}

    def test_a_padded_step_over_the_budget_left_waits(self) -> None:
        pair = self._decoding_a(length=2, max_num_batched_tokens=3, max_num_seqs=2)
        pair.add("b", (2000,))
        assert dict(pair.schedule().num_scheduled_tokens) == {"a": 1}
        assert pair.gpu.snapshot().waiting == ("b",)

    def test_no_padding_where_the_long_prefill_cap_would_cut_it(self) -> None:
        pair = self._decoding_a(long_prefill_token_threshold=2)
        pair.add("b", (2000,))
        assert dict(pair.schedule().num_scheduled_tokens) == {"a": 1, "b": 1}

    @pytest.mark.parametrize(("max_model_len", "tokens"), [(8, 3), (7, 1)])
    def test_padding_needs_room_below_max_model_len(self, max_model_len: int, tokens: int) -> None:
        # b repeats a's prompt: its first block (4 tokens) hits, 1 token is left. Padded,
        # b's positions and the token they sample end at 4 + 3 + 1 = 8.
        pair = self._decoding_a(
            enable_prefix_caching=True, max_model_len=max_model_len, num_blocks=4
        )
        pair.add("b", prompt(1000, 5))
        assert pair.schedule().num_scheduled_tokens["b"] == tokens

    def test_a_prefix_hit_that_leaves_one_token_is_padded_even_alone(self) -> None:
        pair = Pair(
            make_config(num_speculative_tokens=2, pad_spec_decode=True, enable_prefix_caching=True)
        )
        pair.add("a", prompt(1000, 9), max_tokens=1)
        pair.schedule()
        pair.land()  # a finishes; its 2 full blocks stay cached
        pair.add("b", prompt(1000, 9))
        step = pair.schedule()
        assert dict(step.num_scheduled_tokens) == {"b": 3}
        assert step.scheduled_new_reqs[0].num_computed_tokens == 8

    def test_padding_under_async_adds_its_positions_as_placeholders(self) -> None:
        pair = Pair(
            make_config(num_speculative_tokens=2, pad_spec_decode=True, async_scheduling=True)
        )
        pair.add("a", prompt(1000, 5))
        pair.schedule()
        pair.land()
        pair.add("b", (2000,))
        pair.schedule()
        assert pair.counters("b") == (3, 3, 3, 0)
        assert pair.request("b").spec_token_ids == (PH, PH)


# ------------------------------------------------------------ random call orders

PREFIXES = ((1, 2, 3, 4, 5, 0, 1, 2), (5,) * 16)


@st.composite
def calls(draw: st.DrawFn) -> tuple[SchedulerConfig, int, list[tuple[str, int]]]:
    """An async config, a pipeline depth (steps in flight before the oldest lands) and
    a call order: ("add", n), ("abort", n), ("step", accepted drafts)."""
    config = draw(configs(max_model_len_cap=48, async_scheduling=True))
    depth = draw(st.integers(1, 3))
    kinds = st.sampled_from(["add", "add", "abort", "step", "step", "step"])
    order = draw(st.lists(st.tuples(kinds, st.integers(0, 2**16)), min_size=10, max_size=60))
    return config, depth, order


@given(drawn=calls())
def test_random_call_orders_agree_at_every_pipeline_depth(
    drawn: tuple[SchedulerConfig, int, list[tuple[str, int]]],
) -> None:
    config, depth, order = drawn
    pair = Pair(config)
    live: list[str] = []
    for number, (kind, value) in enumerate(order):
        if kind == "add":
            rid = f"r{number}"
            base = (*PREFIXES[value % 2][: value % 9], value % 7, number)
            length = 1 + value % (config.max_model_len - 1)
            tokens = (base * length)[:length]
            pair.add(rid, tokens, 1 + value % 12, eos_token_id=value % 5, priority=value % 3)
            live.append(rid)
        elif kind == "abort" and live:
            pair.abort(live.pop(value % len(live)))
        elif kind == "step":
            _step(pair, depth, value)
    # Drain: land what is in flight, then step until every request is done.
    for _ in range(40 * (len(live) + 1)):
        if not (pair.gpu.has_unfinished_requests() or pair.in_flight):
            break
        _step(pair, depth, 0)
    assert not pair.gpu.has_unfinished_requests()


def _step(pair: Pair, depth: int, value: int) -> None:
    """Schedule if there is anything to schedule, then land the oldest step once `depth`
    are in flight (or nothing more can be scheduled); `value` picks accepted drafts."""
    scheduled = pair.gpu.has_unfinished_requests()
    if scheduled:
        pair.schedule()
    if pair.in_flight and (len(pair.in_flight) >= depth or not scheduled):
        accepted = dict.fromkeys(pair.in_flight[0][1].num_scheduled_tokens, value % 3)
        pair.land(StepDecisions(accepted=accepted))
