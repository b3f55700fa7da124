"""SGLang 0.5.23's Scheduler under schedspec, through schedspec.adapters.sglang.engine.

Needs SGLang, in a venv of its own: `scripts/install_sglang.sh VENV_DIR`. Skipped, with
that reason, where SGLang is not installed, except in CI's SGLang venv
(tests/sglang_required.py), where a missing SGLang fails.
"""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.sglang_required import require_sglang

require_sglang("the SGLang adapter tests")

from schedspec.adapters.engine_import import TINY_VOCAB_SIZE  # noqa: E402
from schedspec.adapters.reference import reference_engine  # noqa: E402
from schedspec.adapters.sglang import engine as adapter  # noqa: E402
from schedspec.adapters.sglang.config import server_args, start_scheduler  # noqa: E402
from schedspec.adapters.sglang.engine import SGLangEngine, generate_request  # noqa: E402
from schedspec.adapters.sglang.runtime import load_sglang  # noqa: E402
from schedspec.properties.checked_engine import replay  # noqa: E402
from schedspec.properties.differential import DiffOptions, diff_trace  # noqa: E402
from schedspec.properties.strategies.engine_configs import sglang_default_configs  # noqa: E402
from schedspec.properties.suite import SuiteSettings, run_suite  # noqa: E402
from schedspec.spec import (  # noqa: E402
    ConfigError,
    ModelRunnerOutput,
    Request,
    RequestError,
    RequestStatus,
    SchedulerConfig,
    extend_block_hashes,
)
from schedspec.spec.request import admitted_max_tokens, max_prompt_tokens  # noqa: E402
from schedspec.traces.trace import Trace  # noqa: E402
from tests.sglang_engine_rows import EngineDriver  # noqa: E402
from tests.sglang_helpers import as_row, prompt  # noqa: E402
from tests.test_sglang_reference import SCENARIOS  # noqa: E402

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "findings"
BASE = SchedulerConfig(
    family="sglang",
    block_size=1,
    num_blocks=64,
    max_num_batched_tokens=32,
    max_num_seqs=4,
    max_model_len=64,
)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_adapter_shows_sglangs_observed_steps(name: str) -> None:
    """The worked examples SGLang was observed on (tests/test_sglang_reference.py), read
    from the adapter's snapshots alone: batch kind, scheduled tokens, waiting queue,
    chunked request, free/evictable/protected tokens, new_token_ratio and the latch.
    The reference's engine shows the same rows through its own snapshots."""
    config, events, observed = SCENARIOS[name]
    for engine in (SGLangEngine(config), reference_engine(config)):
        rows = EngineDriver(engine, config.async_scheduling).run(events, len(observed))
        for step, (mine, theirs) in enumerate(zip(rows, observed, strict=True)):
            assert mine == as_row(theirs), f"{type(engine).__name__}, {name} step {step}"


class TestTheDoor:
    def test_the_specs_longest_prompt_is_sglangs(self, monkeypatch: pytest.MonkeyPatch) -> None:
        engine = SGLangEngine(BASE)
        longest = max_prompt_tokens(BASE)  # 64 - 7 = 57
        engine.add_request(Request("ok", prompt(1, longest), 4))
        # One token more: refused by SGLang itself too, with the spec's door taken away.
        monkeypatch.setattr(adapter, "validate_new_request", lambda request, config: None)
        with pytest.raises(RequestError, match="SGLang refused it") as refused:
            engine.add_request(Request("long", prompt(2, longest + 1), 4))
        assert refused.value.field == "prompt_token_ids"
        assert engine.snapshot().waiting == ("ok",)

    def test_max_tokens_is_sglangs_clipped_max_new_tokens(self) -> None:
        engine = SGLangEngine(BASE)
        request = Request("a", prompt(1, 50), 30)
        engine.add_request(request)
        # max_req_len 63: at most 63 - 50 - 1 = 12 new tokens.
        assert engine.snapshot().requests["a"].max_tokens == 12
        assert admitted_max_tokens(BASE, request) == 12

    def test_a_duplicate_live_id_is_refused(self) -> None:
        engine = SGLangEngine(BASE)
        engine.add_request(Request("a", prompt(1, 5), 4))
        with pytest.raises(RequestError, match="duplicate request id 'a'"):
            engine.add_request(Request("a", prompt(2, 5), 4))

    def test_a_config_sglang_would_change_is_refused_naming_the_field(self) -> None:
        with pytest.raises(ConfigError, match="max_num_seqs"):
            SGLangEngine(replace(BASE, num_blocks=8, max_model_len=8, max_num_seqs=5))

    def test_a_config_of_the_other_family_is_refused(self) -> None:
        vllm_config = SchedulerConfig(
            block_size=1, num_blocks=64, max_num_batched_tokens=32, max_num_seqs=4,
            max_model_len=64,
        )  # fmt: skip
        with pytest.raises(ConfigError, match="family"):
            SGLangEngine(vllm_config)


def drive(engine: SGLangEngine, steps: int, token: int = 7) -> None:
    """Plain loop: schedule, then land with `token` for every sampling request."""
    for _ in range(steps):
        output = engine.schedule()
        state = engine.snapshot()
        sampled = {
            rid: [token]
            for rid in output.num_scheduled_tokens
            if rid in state.requests and not state.requests[rid].is_prefill_chunk
        }
        engine.update_from_output(output, ModelRunnerOutput(sampled))


class TestAborts:
    def test_a_waiting_request_leaves_at_once(self) -> None:
        engine = SGLangEngine(replace(BASE, max_num_seqs=1))
        engine.add_request(Request("a", prompt(1, 5), 4))
        engine.add_request(Request("b", prompt(2, 5), 4))
        drive(engine, 1)
        engine.finish_requests(["b"])
        assert "b" not in engine.snapshot().requests
        assert engine.schedule().finished_req_ids == frozenset({"b"})

    def test_a_running_request_is_marked_and_finishes_when_its_next_step_lands(self) -> None:
        engine = SGLangEngine(BASE)
        engine.add_request(Request("a", prompt(1, 5), 8))
        drive(engine, 2)
        engine.finish_requests(["a"])
        marked = engine.snapshot().requests["a"]
        assert marked.abort_pending and marked.status is RequestStatus.RUNNING
        output = engine.schedule()
        assert dict(output.num_scheduled_tokens) == {"a": 1}
        reported = engine.update_from_output(output, ModelRunnerOutput({"a": [9]}))
        # The step's token is kept, then the request finishes aborted.
        assert reported["a"].new_token_ids == (9,)
        assert reported["a"].finish_status is RequestStatus.FINISHED_ABORTED
        assert "a" not in engine.snapshot().requests


def test_a_finished_requests_cached_blocks_carry_the_specs_hashes() -> None:
    config = replace(BASE, block_size=4, num_blocks=16, enable_prefix_caching=True)
    engine = SGLangEngine(config)
    tokens = prompt(3, 13)
    engine.add_request(Request("a", tokens, 3))
    drive(engine, 3, token=11)
    kv = engine.snapshot().kv
    assert engine.snapshot().requests == {}
    hashes = extend_block_hashes([], [*tokens, 11, 11, 11], 4)
    cached = {h for h, _ in kv.prefix_cache}
    # The radix cache keeps the whole pages of prompt and outputs: 16 tokens, 4 pages
    # (the last output's KV is not computed: 15 tokens, 3 whole pages).
    assert cached == set(hashes[:3])
    # Free: every block; the evictable cached ones last, in eviction order.
    assert sorted(kv.free_block_ids) == list(range(16))


def test_the_overlap_loop_skips_a_request_its_queued_result_finishes() -> None:
    """max_tokens 3: when the fourth schedule runs, the queued third step gives the last
    token, so SGLang's overlap loop leaves the request out of the batch (without that
    skip it would decode it once more, a step whose token is thrown away). The request
    is still RUNNING, with nothing new scheduled, until that result lands."""
    engine = SGLangEngine(replace(BASE, async_scheduling=True))
    engine.add_request(Request("a", prompt(1, 5), 3))
    scheduled = []
    in_flight = []
    for _ in range(4):
        output = engine.schedule()
        scheduled.append(dict(output.num_scheduled_tokens))
        in_flight.append(output)
        if len(in_flight) > 1:
            landing = in_flight.pop(0)
            still = engine.snapshot().requests["a"]
            assert still.status is RequestStatus.RUNNING
            engine.update_from_output(
                landing, ModelRunnerOutput({rid: [7] for rid in landing.num_scheduled_tokens})
            )
    assert scheduled == [{"a": 5}, {"a": 1}, {"a": 1}, {}]
    assert engine.snapshot().requests == {}


def test_s1_a_chunk_budget_below_the_page_size_admits_nothing_ever() -> None:
    """docs/FINDINGS.md S1. SGLang takes chunked_prefill_size 2 with pages of 4, then
    cuts every chunk to whole pages, 0 tokens, and schedules nothing while a 10-token
    request waits and all 64 slots are free. The spec refuses the config instead."""
    chunk_fits = replace(
        BASE, block_size=4, num_blocks=16, max_num_batched_tokens=4, max_model_len=32
    )
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        replace(chunk_fits, max_num_batched_tokens=2)
    v = load_sglang()
    args = server_args(v, chunk_fits)
    args.chunked_prefill_size = 2  # what the spec refuses; SGLang's ServerArgs takes it
    s = start_scheduler(v, args).scheduler
    params = v.SamplingParams(max_new_tokens=2, temperature=0.0)
    params.normalize(None)
    params.verify(TINY_VOCAB_SIZE)
    s.handle_generate_request(generate_request(v, "a", list(range(10, 20)), params))
    for _ in range(5):
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch, s.last_batch = plan.running_batch, plan.batch_to_run
        assert plan.batch_to_run is None
        assert len(s.waiting_queue) == 1
        assert s.token_to_kv_pool_allocator.available_size() == 64


def _plain_loop_results(s: Any, steps: int) -> list[tuple[str, list[int], str, list[list[int]]]]:
    """Three requests through SGLang's plain event loop, each result as SGLang sampled it:
    per step the batch kind, its tokens and their dtype, and its requests' outputs."""
    v = load_sglang()
    params = v.SamplingParams(max_new_tokens=3, temperature=0.0)
    params.normalize(None)
    params.verify(TINY_VOCAB_SIZE)
    for rid in ("a", "b", "c"):
        s.handle_generate_request(generate_request(v, rid, [5, 6, 7], params))
    seen = []
    for _ in range(steps):
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch, batch = plan.running_batch, plan.batch_to_run
        result = s.run_batch(batch)
        tokens = result.next_token_ids
        s.process_batch_result(batch, result)
        s.last_batch = batch
        outputs = [list(req.output_ids) for req in batch.reqs]
        seen.append((batch.forward_mode.name, tokens.tolist(), str(tokens.dtype), outputs))
    return seen


def test_the_forward_stand_in_gives_what_sglangs_forward_gives_with_the_harness_model() -> None:
    """adapters/sglang/runtime.py, 7: the model worker's forward is stood in for by one
    token 0 per request. A Scheduler with SGLang's own forward back (the model runner,
    the harness model's zero logits, the sampler) runs the same steps with the same
    tokens, of the same dtype, to the same outputs; a forward the stand-in does not
    cover is refused."""
    v = load_sglang()
    own = start_scheduler(v, server_args(v, BASE)).scheduler
    del own.tp_worker.forward_batch_generation  # the class's method: SGLang's forward
    stood_in = start_scheduler(v, server_args(v, BASE)).scheduler
    expected = _plain_loop_results(own, 3)
    assert [kind for kind, *_ in expected] == ["EXTEND", "DECODE", "DECODE"]
    assert expected[0][1:3] == ([0, 0, 0], "torch.int64")
    assert _plain_loop_results(stood_in, 3) == expected
    with pytest.raises(RuntimeError, match="does not stand in"):
        stood_in.tp_worker.forward_batch_generation(None)


def test_a_built_scheduler_keeps_no_load_snapshot_writer_nor_its_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """adapters/sglang/config.py: the Scheduler is left without the load snapshot writer
    SGLang gave it (as every rank but rank zero is), and the writer's shared-memory file
    is removed, not left behind one per build; the suite's steps still run."""
    from schedspec.adapters.sglang import config

    dropped: list[Any] = []
    original = config._drop_load_snapshot_writer

    def recording(scheduler: Any) -> None:
        dropped.append(scheduler.load_snapshot_writer)
        original(scheduler)

    monkeypatch.setattr(config, "_drop_load_snapshot_writer", recording)
    v = load_sglang()
    scheduler = start_scheduler(v, server_args(v, BASE)).scheduler
    assert scheduler.load_snapshot_writer is None
    [writer] = dropped
    assert writer is not None and not Path(writer.path).exists()
    assert scheduler.publish_load_snapshot(force=True) is None


def test_a_built_scheduler_starts_no_thread_and_is_freed_with_its_engine() -> None:
    """adapters/sglang/runtime.py, 8: SGLang's watchdog thread (which never ends and
    holds its Scheduler) is not started: building an engine leaves the process's threads
    as they were, and once the engine is dropped its Scheduler is garbage."""
    SGLangEngine(BASE)  # the first build's one-off set-up (the parallel runtime) first
    threads = set(threading.enumerate())
    engine = SGLangEngine(BASE)
    assert set(threading.enumerate()) == threads
    from sglang.srt.utils.watchdog import WatchdogRaw

    assert not isinstance(engine.scheduler.watchdog, WatchdogRaw)
    scheduler = weakref.ref(engine.scheduler)
    del engine
    gc.collect()
    assert scheduler() is None


def test_a_scheduler_dropped_unclosed_has_its_zeromq_ends_closed_when_collected() -> None:
    """adapters/sglang/config.py, _close_ends: a Scheduler freed by the garbage collector
    (nothing holds it now: runtime.py, 8) without close() has its sockets and context
    closed by name first; left to the context's own __del__, whose socket list the
    collector empties first, the collection would wait forever."""
    v = load_sglang()
    built = start_scheduler(v, server_args(v, BASE))
    context, sockets = built.context, built.sockets
    scheduler = weakref.ref(built.scheduler)
    del built
    gc.collect()
    assert scheduler() is None
    assert sockets and all(socket.closed for socket in sockets)
    assert context.closed


def test_s2_sglang_aborts_every_rid_the_aborted_one_starts() -> None:
    """docs/FINDINGS.md S2: SGLang's abort of rid "r1" takes "r10" with it; the adapter's
    rids ("<arrival>#<id>") are prefix-free, so aborting r1 leaves r10 alone."""
    v = load_sglang()
    s = start_scheduler(v, server_args(v, BASE)).scheduler
    params = v.SamplingParams(max_new_tokens=2, temperature=0.0)
    params.normalize(None)
    params.verify(TINY_VOCAB_SIZE)
    for rid in ("r1", "r10", "r2"):
        s.handle_generate_request(generate_request(v, rid, [5, 6, 7], params))
    s.abort_request(v.AbortReq(rid="r1"))
    assert [req.rid for req in s.waiting_queue] == ["r2"]
    engine = SGLangEngine(BASE)
    for rid in ("r1", "r10", "r2"):
        engine.add_request(Request(rid, [5, 6, 7], 2))
    engine.finish_requests(["r1"])
    assert engine.snapshot().waiting == ("r10", "r2")


def test_g2_the_eviction_order_sglang_hides_parts_block_ids_not_counts() -> None:
    """docs/FINDINGS.md G2, found by `check --engine sglang --seed 1`: r0's slots are
    cached, then r2's decodes evict some of them. SGLang evicts in its LRU order, which
    its Rust tree does not expose; the adapter lists the evictable tail by block id. Both
    engines hold safety and agree on every count; with block ids they part on the free
    queue. The adapter's snapshot says the order is not observed, so SG-EVICT-ORDER holds
    SGLang only to evicting evictable blocks, and the sglang profile passes on both."""
    trace = Trace.load(FINDINGS / "sglang-evict-order-not-observable.json")
    replay(trace, SGLangEngine, "safety")
    replay(trace, reference_engine, "sglang")
    assert diff_trace(trace, reference_engine, SGLangEngine, "safety").passed
    by_ids = diff_trace(
        trace, reference_engine, SGLangEngine, "safety", DiffOptions(compare_block_ids=True)
    )
    assert by_ids.divergence is not None and by_ids.divergence.field == "free_block_ids"
    replay(trace, SGLangEngine, "sglang")
    policy = SGLangEngine(trace.config).snapshot().sglang
    assert policy is not None and not policy.eviction_order_observed


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_suite_passes_on_the_default_configs(overlap: bool) -> None:
    """The safety core and the sglang profile hold on SGLang in each loop."""
    configs = sglang_default_configs().map(lambda c: replace(c, async_scheduling=overlap))
    result = run_suite(SGLangEngine, "sglang", SuiteSettings(examples=15, seed=20261201), configs)
    assert result.passed, result.error or result.other_error
    assert result.stats.steps > 100


def test_s4_sglang_runs_out_of_memory_in_a_prefill_when_aggressive() -> None:
    """docs/FINDINGS.md S4, found by `check --long --profile sglang --seed 11` on the
    reference: with schedule_conservativeness 0.1 the admitted requests' decodes and a
    chunked prefill outgrow the pool, and SGLang raises in the prefill's allocation at
    the trace's last step. The reference cuts the chunk to what the pool holds there
    (tests/test_sglang_reference.py), so the lockstep diff reports SGLang's crash, at
    that event, as the right engine's failure."""
    trace = Trace.load(FINDINGS / "sglang-prefill-out-of-memory-when-aggressive.json")
    reached: list[int] = []
    with pytest.raises(RuntimeError, match="Prefill out of memory"):
        replay(trace, SGLangEngine, "sglang", on_event=lambda index, _: reached.append(index))
    assert reached[-1] == len(trace.events) - 1
    result = diff_trace(trace, reference_engine, SGLangEngine, "sglang")
    assert result.side == "right" and result.divergence is None
    assert "Prefill out of memory" in str(result.error)


def test_sglang_demotes_a_stop_past_a_clipped_max_new_tokens_of_0() -> None:
    """docs/SPEC.md STOP, "A stop past the length cap", found by this file's suite test
    (seed 20261201): r20's max_new_tokens is clipped to 0 and its one sampled token is a
    stop; SGLang reports a length finish with nothing delivered, as the reference does
    (tests/test_request_outputs.py), and both pass the trace."""
    trace = Trace.load(FINDINGS / "sglang-stop-demoted-to-length-at-zero-budget.json")
    replay(trace, SGLangEngine, "sglang")
    assert diff_trace(trace, reference_engine, SGLangEngine, "safety").passed
