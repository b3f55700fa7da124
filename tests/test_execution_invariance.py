"""Output invariance and slot safety of the paged runner under random schedules.

Whatever the config (chunk sizes and long-prefill caps, tiny KV caches that
preempt, prefix caching with shared prefixes, speculative decoding with a
drafter that is often wrong), every request must emit exactly what the dense
one-request-at-a-time run emits, and every step must pass the slot checks.
The engines and devices are parameters: the reference scheduler always, the
gpu_impl scheduler once its adapter exists, CUDA when a GPU is present.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from schedspec.engines.events import AddRequest
from schedspec.engines.registry import load_engine_factory
from schedspec.gpu_impl.execution import (
    Arrival,
    ExecutionError,
    InvarianceReport,
    TinyModel,
    TinyModelConfig,
    check_output_invariance,
)
from schedspec.gpu_impl.execution.executed_run import ExecEngine
from schedspec.properties.strategies.actions import build_add_request, request_draws
from schedspec.properties.strategies.configs import configs
from schedspec.spec import Request, SchedulerConfig

MODEL = TinyModelConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, max_positions=256)

ENGINES = ["reference", "gpu"]  # load_engine_factory names: the two schedulers of this repo
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

EngineFactory = Callable[[SchedulerConfig], ExecEngine]


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny matrices gain nothing from intra-op threads and lose much when the
    cores are busy (7x per forward pass measured on this 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(device: str = "cpu") -> TinyModel:
    return TinyModel(MODEL, device=device)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[SchedulerConfig, list[tuple[int, AddRequest]]]:
    """A small config and up to six requests (arrival step, request), from the
    suite's own strategies: shared prefixes, stop tokens, edge prompt lengths. The
    paged runner runs synchronous steps whose drafts come from its own drafter, so
    no async scheduling and no placeholder padding (both releases' knobs are drawn)."""
    config = draw(configs(max_model_len_cap=40, async_scheduling=False, pad_spec_decode=False))
    adds = []
    for i in range(draw(st.integers(1, 6))):
        drawn = dataclasses.replace(draw(request_draws), door=0)  # only admissible requests
        adds.append((draw(st.integers(1, 8)), build_add_request(config, f"r{i}", (), drawn)))
    return config, adds


def arrivals(adds: list[tuple[int, AddRequest]]) -> list[Arrival]:
    """Fresh Request objects: the engine mutates the ones it is given."""
    return [Arrival(step, add.to_request()) for step, add in adds]


def assert_matched(report: InvarianceReport) -> None:
    assert report.matched, "\n".join(m.describe() for m in report.mismatches)
    assert report.num_output_tokens > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ENGINES)
@given(workload=workloads())
def test_every_schedule_emits_the_dense_outputs(
    engine: str, device: str, workload: tuple[SchedulerConfig, list[tuple[int, AddRequest]]]
) -> None:
    config, adds = workload
    report = check_output_invariance(
        load_engine_factory(engine), config, tiny_model(device), arrivals(adds)
    )
    assert_matched(report)


def shared_prefix_workload(num_requests: int, prompt_tail: int, max_tokens: int) -> list[Arrival]:
    """Requests sharing a 12-token prefix, arriving two per step."""
    prefix = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 0, 3]
    return [
        Arrival(
            1 + i // 2,
            Request(f"r{i}", prefix + [(11 * i + j) % 90 for j in range(prompt_tail)], max_tokens),
        )
        for i in range(num_requests)
    ]


TIGHT = SchedulerConfig(
    block_size=4,
    num_blocks=14,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=48,
    long_prefill_token_threshold=6,
    enable_prefix_caching=True,
    num_speculative_tokens=3,
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_tight_run_preempts_hits_rejects_and_still_matches(engine: str, device: str) -> None:
    """The worked example: a 14-block cache for six requests of up to 40 tokens, a
    16-token budget with a 6-token prefill cap, 12 shared prefix tokens, 3 drafts.

    The run must exercise every path the property is about, not just pass."""
    report = check_output_invariance(
        load_engine_factory(engine), TIGHT, tiny_model(device), shared_prefix_workload(6, 9, 20)
    )
    assert_matched(report)
    run = report.run
    assert run.num_preemptions > 0
    assert run.num_prefix_hit_tokens > 0
    assert 0 < run.num_accepted_drafts < run.num_drafts  # some drafts rejected, some kept
    assert report.num_output_tokens == 6 * 20


def test_stop_tokens_end_both_runs_at_the_same_token() -> None:
    """EOS and stop tokens: take the token the dense run emits third as r0's EOS
    and fifth as r1's stop token; both runs must stop there."""
    base = shared_prefix_workload(2, 5, 12)
    first = check_output_invariance(load_engine_factory("reference"), TIGHT, tiny_model(), base)
    out0, out1 = first.run.outputs["r0"], first.run.outputs["r1"]
    stopping = [
        Arrival(1, Request("r0", base[0].request.prompt_token_ids, 12, eos_token_id=out0[2])),
        Arrival(1, Request("r1", base[1].request.prompt_token_ids, 12, stop_token_ids=[out1[4]])),
    ]
    report = check_output_invariance(
        load_engine_factory("reference"), TIGHT, tiny_model(), stopping
    )
    assert_matched(report)
    assert report.run.outputs["r0"][-1] == out0[2] and len(report.run.outputs["r0"]) <= 3
    assert report.run.outputs["r1"][-1] == out1[4] and len(report.run.outputs["r1"]) <= 5


def test_a_token_outside_the_vocabulary_is_refused_by_name() -> None:
    bad = [Arrival(1, Request("r0", [1, 2, 500], 2))]
    with pytest.raises(
        ExecutionError, match=r"token_ids: must be in \[0, vocab_size=96\), got 500"
    ):
        check_output_invariance(load_engine_factory("reference"), TIGHT, tiny_model(), bad)
