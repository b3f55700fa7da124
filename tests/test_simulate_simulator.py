"""The simulator's clock, per-request timelines and KV ledger, with worked examples,
and agreement with the reference's own counters."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import pytest

from schedspec.adapters.reference import ReferenceEngine, reference_engine
from schedspec.simulate import simulator
from schedspec.simulate.block_ledger import BlockLedger
from schedspec.simulate.configs import resolve_configs
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.errors import SimulationInputError
from schedspec.simulate.metrics import request_metrics
from schedspec.simulate.simulator import (
    RequestTimeline,
    SimulationResult,
    SimulationStalledError,
    simulate,
)
from schedspec.simulate.timeline import ScheduledEntry
from schedspec.simulate.workloads import SimRequest, SyntheticWorkload
from schedspec.spec import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
)

# Every step costs 1 s plus 1 ms per KV token read: easy to add up by hand.
UNIT = CostModel(
    weight_bytes=1, hbm_bandwidth=1, flops_per_token=1e-9, peak_flops=1, kv_bytes_per_token=1e-3
)


def _config(**fields: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "block_size": 16,
        "num_blocks": 64,
        "max_num_batched_tokens": 512,
        "max_num_seqs": 8,
        "max_model_len": 512,
        "enable_prefix_caching": True,
    }
    return SchedulerConfig(**{**base, **fields})  # type: ignore[arg-type]


def _run(
    requests: Iterable[SimRequest], config: SchedulerConfig | None = None, cost: CostModel = UNIT
) -> SimulationResult:
    return simulate("t", reference_engine, config or _config(), requests, cost, 0, 10_000)


class TestClock:
    def test_one_request_worked_example(self) -> None:
        # Arrives at 0.5: prefill 100 (reads 100 KV) 1.100 s -> first token at 1.6;
        # decode (reads 101) 1.101 s -> 2.701; decode (reads 102) 1.102 s -> 3.803.
        result = _run([SimRequest("A", 0.5, tuple(range(100)), 3)])
        (timeline,) = result.requests.values()
        assert timeline.emit_times == pytest.approx([1.6, 2.701, 3.803])
        m = request_metrics(timeline)
        assert m.ttft == pytest.approx(1.1)
        assert m.tpot == pytest.approx((3.803 - 1.6) / 2)
        assert m.worst_gap == pytest.approx(1.102)
        assert m.e2e == pytest.approx(3.303)
        assert [s.work.kv_tokens_read for s in result.steps] == [100, 101, 102]
        assert [s.entries[0].kind for s in result.steps] == ["prefill", "decode", "decode"]

    def test_idle_engine_jumps_to_the_next_arrival(self) -> None:
        result = _run(
            [
                SimRequest("A", 0.0, tuple(range(10)), 1),
                SimRequest("B", 100.0, tuple(range(50, 60)), 1),
            ]
        )
        a, b = (request_metrics(t) for t in result.requests.values())
        assert a.ttft == pytest.approx(1.010) and b.ttft == pytest.approx(1.010)
        assert result.steps[1].start == 100.0

    def test_arrivals_join_the_next_step(self) -> None:
        # B arrives while A's first step runs: it is scheduled in the second step.
        result = _run(
            [
                SimRequest("A", 0.0, tuple(range(10)), 3),
                SimRequest("B", 0.5, tuple(range(50, 60)), 1),
            ]
        )
        assert [e.request_id for e in result.steps[0].entries] == ["A"]
        assert [e.request_id for e in result.steps[1].entries] == ["A", "B"]
        assert request_metrics(result.requests["B"]).ttft == pytest.approx(1.010 + 1.021 - 0.5)

    def test_async_arrivals_join_the_step_after_next(self) -> None:
        """Async scheduling: step 2 is scheduled when step 1 starts executing (t=0), so
        B, arriving at 0.5 while step 1 runs, joins step 3. A's tokens land at the same
        times as synchronously: the steps run back to back either way."""
        result = _run(
            [
                SimRequest("A", 0.0, tuple(range(10)), 3),
                SimRequest("B", 0.5, tuple(range(50, 60)), 1),
            ],
            _config(async_scheduling=True),
        )
        assert [[e.request_id for e in s.entries] for s in result.steps] == [
            ["A"],
            ["A"],
            ["A", "B"],
        ]
        assert result.requests["A"].emit_times == pytest.approx([1.010, 2.021, 3.043])
        assert request_metrics(result.requests["B"]).ttft == pytest.approx(3.043 - 0.5)
        (decode,) = result.steps[1].entries
        assert decode.num_in_flight == 1  # scheduled before step 1's token landed

    def test_refused_request_names_its_source(self) -> None:
        bad = SimRequest("A", 0.0, tuple(range(600)), 3, source="t.jsonl line 9")
        with pytest.raises(SimulationInputError, match=r"t\.jsonl line 9: the engine refused"):
            _run([bad])

    def test_arrivals_out_of_order_are_refused_naming_the_request(self) -> None:
        """Requests are taken as they arrive, never all held: the clock cannot go back."""
        late = SimRequest("A", 2.0, (1, 2), 2, source="request 0")
        early = SimRequest("B", 1.0, (1, 2), 2, source="request 1")
        with pytest.raises(SimulationInputError, match="request 1 arrives before the request"):
            _run([late, early])

    def test_max_steps_stops_the_run(self) -> None:
        with pytest.raises(SimulationStalledError, match="max_steps=2"):
            simulate("t", reference_engine, _config(), [SimRequest("A", 0, (1, 2), 5)], UNIT, 0, 2)


class TestTimeline:
    def test_recomputed_tokens_after_preemption(self) -> None:
        t = RequestTimeline("A", 0.0, prompt_len=64, max_tokens=10)
        t.account(ScheduledEntry("A", "prefill", 64, 0), before=0, fresh=True, start=0.0)
        t.account(ScheduledEntry("A", "decode", 1, 0), before=64, fresh=False, start=1.0)
        # Preempted; resumed with 66 known tokens and a 32-token cache hit: 65 were
        # computed before, so 65 - 32 = 33 of these 34 are recomputed.
        t.account(
            ScheduledEntry("A", "prefill", 34, 0, num_cached=32), before=32, fresh=True, start=2.0
        )
        assert t.recomputed_tokens == 33
        assert (t.cached_tokens, t.queried_tokens, t.first_scheduled) == (32, 64 + 64, 0.0)

    def test_rejected_drafts_are_not_computed(self) -> None:
        t = RequestTimeline("A", 0.0, prompt_len=8, max_tokens=10)
        t.account(ScheduledEntry("A", "spec", 3, 2, num_accepted=0), before=8, fresh=False, start=0)
        # Only the verified token counts: a later prefill from 9 recomputes nothing.
        t.account(ScheduledEntry("A", "prefill", 4, 0), before=9, fresh=False, start=1)
        assert t.recomputed_tokens == 0


def _output(
    new: tuple[NewRequestData, ...] = (),
    cached: tuple[CachedRequestData, ...] = (),
    preempted: frozenset[str] = frozenset(),
) -> SchedulerOutput:
    return SchedulerOutput(new, cached, {}, 0, {}, preempted, frozenset())


class _LedgerMissingPreemptions(BlockLedger):
    def apply(self, out: SchedulerOutput) -> None:
        super().apply(dataclasses.replace(out, preempted_req_ids=frozenset()))


class TestBlockLedger:
    def test_shared_blocks_count_once_and_free_with_their_last_holder(self) -> None:
        ledger = BlockLedger(10)
        ledger.apply(
            _output(new=(NewRequestData("A", (), (1, 2), 0), NewRequestData("B", (), (1, 3), 16)))
        )
        assert (ledger.used_blocks, ledger.usage) == (3, 0.3)
        ledger.apply(_output(cached=(CachedRequestData("A", False, (4,), 32, 0),)))
        assert ledger.used_blocks == 4
        ledger.apply(_output(preempted=frozenset({"A"})))
        assert ledger.used_blocks == 2  # blocks 1 and 3, still B's
        ledger.apply(_output(cached=(CachedRequestData("A", True, (1, 5), 16, 0),)))
        assert ledger.used_blocks == 3
        ledger.release("B")
        ledger.release("A")
        assert ledger.used_blocks == 0

    @pytest.mark.parametrize("broken", [False, True])
    def test_agrees_with_the_reference_block_pool_every_step(
        self, broken: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        if broken:  # a ledger that misses preemptions must disagree: the check can fail
            monkeypatch.setattr(simulator, "BlockLedger", _LedgerMissingPreemptions)
        # A small cache under load: prefix hits, preemptions, resumptions, drafts.
        config = _config(num_blocks=48, num_speculative_tokens=2, max_num_seqs=16)
        workload = SyntheticWorkload(num_requests=60, rate=50.0, prefix_len=64).generate(
            1, config.max_model_len
        )
        engines: list[ReferenceEngine] = []

        def factory(c: SchedulerConfig) -> ReferenceEngine:
            engines.append(ReferenceEngine(c))
            return engines[-1]

        seen: list[float] = []
        result = simulate(
            "t",
            factory,
            config,
            workload,
            UNIT,
            0,
            100_000,
            lambda _: seen.append(engines[0].kv_cache_manager.block_pool.get_usage()),
        )
        assert sum(len(s.preempted) for s in result.steps) > 0
        # Block counts: usage is used / num_blocks here, 1 - free / num_blocks there.
        agree = [round(s.kv_usage * 48) for s in result.steps] == [round(u * 48) for u in seen]
        assert agree is not broken


class _SilentEngine(ReferenceEngine):
    """Reports no RequestOutputs, as an adapter may."""

    def update_from_output(  # type: ignore[override]
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        super().update_from_output(scheduler_output, model_runner_output)
        return None


def test_an_engine_without_request_outputs_gives_the_same_metrics() -> None:
    config = _config(num_blocks=48, max_num_seqs=16, max_model_len=300)
    workload = SyntheticWorkload(num_requests=40, rate=40.0).generate(2, config.max_model_len)
    reported = _run(workload, config)
    silent = simulate("t", _SilentEngine, config, workload, UNIT, 0, 100_000)
    assert [request_metrics(t) for t in silent.requests.values()] == [
        request_metrics(t) for t in reported.requests.values()
    ]
    assert any(t.num_tokens == 300 for t in silent.requests.values())  # max_model_len caps


def test_prefix_hit_counts_worked_example() -> None:
    prefix = tuple(range(1000, 1064))  # four full blocks
    a = SimRequest("A", 0.0, (*prefix, *range(16)), 1)
    b = SimRequest("B", 10.0, (*prefix, *range(100, 116)), 1)
    result = _run([a, b])
    ta, tb = result.requests.values()
    assert (ta.cached_tokens, ta.queried_tokens) == (0, 80)
    assert (tb.cached_tokens, tb.queried_tokens) == (64, 80)
    assert result.steps[1].work.prefill_tokens == 16


def test_presets_preempt_only_when_the_cache_is_small() -> None:
    cost = CostModel()
    workload = SyntheticWorkload(num_requests=120, rate=40.0).generate(0, 4096)
    big, small = resolve_configs(["chunked", "small-kv"], False, False, {}, cost)
    runs = {
        c.name: simulate(c.name, reference_engine, c.config, workload, cost, 0, 10**6)
        for c in (big, small)
    }
    preemptions = {n: sum(len(s.preempted) for s in r.steps) for n, r in runs.items()}
    recomputed = {n: sum(t.recomputed_tokens for t in r.requests.values()) for n, r in runs.items()}
    assert preemptions["chunked"] == 0 and recomputed["chunked"] == 0
    assert preemptions["small-kv"] > 0 and recomputed["small-kv"] > 0
