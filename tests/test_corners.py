"""Named corners: each counter counts what its name says, on real reference transitions, and
`schedspec check` prints them (and --json reports them)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedspec.cli.main import main
from schedspec.engines.events import AddRequest, Step
from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError
from schedspec.properties.corners import (
    CORNER_NAMES,
    CORNERS,
    corners_for,
    count_abort_in_flight,
    count_drafts,
    count_reached,
    count_schedule,
    count_update,
    format_corners,
)
from schedspec.spec.invariants import ScheduleTransition
from tests.broken_engines import fresh_victim
from tests.invariant_builders import (
    Driver,
    fcfs_preemption,
    preemption_step,
    served_victim_with_a_chunk_in_flight,
    served_victim_with_a_decode_in_flight,
    sglang_waiting_prefix_refresh,
    tokens,
)
from tests.sched_helpers import make_config


def test_a_preemption_is_counted_and_an_fcfs_one_has_no_priority_victim() -> None:
    counts: dict[str, int] = {}
    count_schedule(counts, fcfs_preemption())
    assert counts["preemption"] == 1
    assert "priority-victim-ahead" not in counts


def test_a_priority_victim_ahead_of_the_request_served() -> None:
    # A (priority 1, the least urgent) is admitted first, so it runs ahead of B. Once
    # the 4 blocks are taken, B's next decode needs a block and takes A's: the victim
    # ran ahead of the request being served (vLLM #49097's corner).
    driver = Driver(num_blocks=4, max_model_len=16, policy="priority")
    driver.add("A", 6, priority=1)
    driver.step()
    driver.add("B", 8, priority=0)
    driver.step()
    t = driver.schedule()
    assert t.pre.running == ("A", "B") and t.output.preempted_req_ids == {"A"}
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    assert counts["priority-victim-ahead"] == 1


def test_a_victim_behind_the_request_served_is_not_that_corner() -> None:
    # Running (B, A), A the least urgent: B's block comes from A, behind it.
    t = preemption_step("priority", (1, 0, 0)).schedule()
    assert t.pre.running == ("B", "A") and t.output.preempted_req_ids == {"A"}
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    assert counts["preemption"] == 1 and "priority-victim-ahead" not in counts


def test_a_step_that_fills_the_cache_without_preempting() -> None:
    # 8 blocks of 4; A's 20-token and B's 12-token prompts take all 8.
    driver = Driver(num_blocks=8, max_model_len=32)
    driver.add("A", 20)
    driver.add("B", 12)
    t = driver.schedule()
    assert not t.post.kv.free_block_ids and not t.output.preempted_req_ids
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    assert counts["kv-exact-fit"] == 1
    assert counts["admission-exact-fit"] == 1  # no watermark: none spare
    assert "budget-exact-fit" not in counts  # 32 of 512 tokens


def test_a_step_that_uses_the_whole_budget() -> None:
    driver = Driver(max_num_batched_tokens=16, max_num_seqs=4)
    driver.add("A", 20)
    counts: dict[str, int] = {}
    count_schedule(counts, driver.schedule())
    assert counts["budget-exact-fit"] == 1


def test_a_prefix_hit_on_a_free_block_and_a_shared_hash() -> None:
    # A (8 tokens: two full blocks) runs one step and finishes; its cached blocks go to
    # the back of the free queue. B, the same prompt, hits the first block (free, so
    # taken out of the queue) and never the last token's: it computes the second block
    # again, and that hash is now held by two blocks.
    driver = Driver(enable_prefix_caching=True)
    driver.add("A", prompt=tokens(100, 8), max_tokens=1)
    counts: dict[str, int] = {}
    first, _ = driver.step()
    count_schedule(counts, first)
    assert "prefix-hit" not in counts and "shared-hash" not in counts
    driver.add("B", prompt=tokens(100, 8))
    t = driver.schedule()
    assert t.output.scheduled_new_reqs[0].num_computed_tokens == 4
    count_schedule(counts, t)
    assert counts["prefix-hit"] == counts["hit-on-free-block"] == counts["shared-hash"] == 1


def test_a_resumed_request_with_outputs() -> None:
    driver = preemption_step()
    preempting = driver.schedule()
    driver.update(preempting)
    driver.abort("A", "C")
    counts: dict[str, int] = {}
    count_schedule(counts, driver.schedule())
    assert counts["resumed-with-outputs"] == 1


def test_a_stop_inside_accepted_drafts_and_drafts_on_a_prefill() -> None:
    driver = Driver(num_speculative_tokens=2, max_num_batched_tokens=8, max_num_seqs=4)
    driver.add("A", 2, eos_token_id=5)
    driver.add("B", 12)
    driver.step()
    counts: dict[str, int] = {}
    proposal = driver.propose({"A": [5, 6], "B": [21, 22]})
    count_drafts(counts, proposal)
    assert counts["drafts-on-prefill"] == 1  # B is mid-prefill
    scheduled = driver.schedule()
    count_schedule(counts, scheduled)
    assert counts["drafts-scheduled"] == 1
    count_update(counts, driver.update(scheduled, {"A": [5, 6, 7]}))  # EOS, then more
    assert counts["stop-inside-drafts"] == 1


def _repeated_longest_prompt(max_model_len: int) -> int:
    """Under padding with one draft and blocks of a token: A's prompt runs, then B, the
    same prompt, is admitted with all but its last token cached (a one-token admission).
    Returns the tokens scheduled for B, and counts the corner on that admission."""
    driver = Driver(
        block_size=1,
        num_blocks=32,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        max_model_len=max_model_len,
        num_speculative_tokens=1,
        pad_spec_decode=True,
        enable_prefix_caching=True,
    )
    prompt = tokens(100, 6)
    driver.add("A", prompt=prompt, max_tokens=1)
    driver.step()
    driver.add("B", prompt=prompt, max_tokens=1)
    t = driver.schedule()
    assert t.computed_before["B"] == 5
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    assert counts.get("padding-near-max-model-len", 0) == (max_model_len <= 8)
    return t.output.num_scheduled_tokens["B"]


def test_padding_near_max_model_len() -> None:
    """vllm#53962's corner: B has 5 tokens computed and 1 to go. Padded (1 + 1) with
    its sampled token it ends at 8 tokens: past a context of 7, so it runs unpadded;
    exactly on a context of 8, where it is padded and fits (the boundary vLLM missed by
    one); the corner counts both. In a context of 9 it is padded and not the corner."""
    assert _repeated_longest_prompt(7) == 1
    assert _repeated_longest_prompt(8) == 2
    assert _repeated_longest_prompt(9) == 2


def test_two_victims_in_one_step() -> None:
    """4 one-token blocks: A (2 tokens), B and C (1 each) fill them at the first step;
    A's decode then needs a block and takes B's and C's (fcfs: the newest first)."""
    driver = Driver(block_size=1, num_blocks=4, max_model_len=4, max_num_batched_tokens=32)
    driver.add("A", 2, max_tokens=2)
    driver.add("B", 1, max_tokens=3)
    driver.add("C", 1, max_tokens=3)
    driver.step()
    t = driver.schedule()
    assert t.output.preempted_req_ids == {"B", "C"}
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    assert counts["two-victims"] == counts["preemption"] == 1


# Async, 3 blocks of 4: A (4 tokens) and B's first chunk (4 of 8) fill two; before that
# step lands, A's decode takes the last block and B, the newest, is preempted with its
# chunk still in flight.
VICTIM_IN_FLIGHT: dict[str, Any] = {
    "block_size": 4,
    "num_blocks": 3,
    "max_model_len": 12,
    "max_num_batched_tokens": 8,
    "max_num_seqs": 2,
    "enable_chunked_prefill": True,
    "watermark": 0.0,
    "async_scheduling": True,
}


def _victim_with_a_chunk_in_flight(caching: bool) -> dict[str, int]:
    """VICTIM_IN_FLIGHT, B's block registered as it is scheduled when caching."""
    driver = Driver(**VICTIM_IN_FLIGHT, enable_prefix_caching=caching)
    driver.add("A", 4, max_tokens=10)
    driver.add("B", 8, max_tokens=1)
    driver.schedule()
    t = driver.schedule()
    assert t.output.preempted_req_ids == {"B"}
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    return counts


def test_a_step_that_fails_at_a_corner_counts_that_corner() -> None:
    """The planted bug (tests.broken_engines:fresh_victim) breaks PREEMPT-RESET exactly when
    a victim's step is in flight: the run's corner table must show that corner reached,
    not 0, though the step that reached it is the one that failed."""
    config = make_config(**VICTIM_IN_FLIGHT)
    checked = CheckedEngine(fresh_victim(config), config, "safety")
    checked.apply(AddRequest("A", tokens(0, 4), max_tokens=10))
    checked.apply(AddRequest("B", tokens(10, 8), max_tokens=1))
    checked.apply(Step())
    with pytest.raises(InvariantViolationError) as failure:
        checked.apply(Step())
    violation = failure.value.violations[0]
    assert violation.invariant == "PREEMPT-RESET" and violation.request_id == "B"
    assert violation.message == "not reset: num_stale_output_tokens"
    assert (violation.expected, violation.actual) == (4, 0)
    assert checked.stats.corners["preempted-with-output-in-flight"] == 1
    assert checked.stats.corners["preemption"] == 1


def test_a_corner_count_that_cannot_read_a_failing_step_is_skipped() -> None:
    """A failing step may be inconsistent (here a victim the state does not know): its
    corners are counted as far as they can be read, and a passing step's counter still
    raises, since there such a state is schedspec's own bug."""
    t = fcfs_preemption()
    broken = dataclasses.replace(t, pre=dataclasses.replace(t.pre, running=("X",)))

    def count_needing_the_victim(counts: MutableMapping[str, int], t: ScheduleTransition) -> None:
        counts["preemption"] = counts.get("preemption", 0) + 1
        _ = t.pre.requests["X"]

    counts: dict[str, int] = {}
    count_reached(count_needing_the_victim, True, counts, broken)
    assert counts == {"preemption": 1}
    with pytest.raises(KeyError):
        count_reached(count_needing_the_victim, False, counts, broken)


def test_a_victim_whose_cached_block_holds_kv_in_flight() -> None:
    counts = _victim_with_a_chunk_in_flight(caching=True)
    assert counts["victim-kv-in-flight-cached"] == 1
    # Without prefix caching the same victim's blocks carry no registration.
    counts = _victim_with_a_chunk_in_flight(caching=False)
    assert counts["preempted-with-output-in-flight"] == 1
    assert "victim-kv-in-flight-cached" not in counts


def test_a_served_victim_whose_service_registered_kv_in_flight() -> None:
    # V, served first and then preempted, had block 1 filled by a landing while the
    # decode in flight still wrote its last position: the step's service registered it.
    counts: dict[str, int] = {}
    count_schedule(counts, served_victim_with_a_decode_in_flight())
    assert counts["victim-served-registers-in-flight"] == 1
    # A served victim whose registrations all predate the step (a prefill chunk in
    # flight, registered when scheduled) is the older corner only.
    counts = {}
    count_schedule(counts, served_victim_with_a_chunk_in_flight())
    assert counts["victim-kv-in-flight-cached"] == 1
    assert "victim-served-registers-in-flight" not in counts


def test_a_chunk_cut_to_the_room_the_reservations_leave() -> None:
    """Mixed chunks, a 7-token budget over 60 one-token slots: d (1 token, 10 to decode)
    runs beside a's 52-token prompt. Each mixed step d takes a slot that its reservation
    (0.21 of what it has left) did not count, so the room shrinks: at a's ninth chunk it
    is 1 slot, below the budget left (6), the rest of the prompt (4) and the 3 free
    slots, and the chunk is cut to it. The step before, the room still covered the
    budget: not the corner."""
    driver = Driver(
        family="sglang",
        block_size=1,
        num_blocks=60,
        max_num_batched_tokens=7,
        max_num_seqs=2,
        max_model_len=59,
        enable_chunked_prefill=True,
        enable_mixed_chunk=True,
        schedule_conservativeness=0.3,
    )
    driver.add("d", 1, max_tokens=10)
    driver.add("a", 52, max_tokens=1)
    for _ in range(9):  # d's prefill, then eight of a's chunks
        before = driver.schedule()
        driver.update(before)
    counts: dict[str, int] = {}
    count_schedule(counts, before)
    assert before.output.num_scheduled_tokens["a"] == 6 and "sg-chunk-room-cut" not in counts
    t = driver.schedule()
    assert t.output.num_scheduled_tokens["a"] == 1
    count_schedule(counts, t)
    assert counts["sg-chunk-room-cut"] == 1


def test_a_refusal_for_a_readmission_s_whole_budget() -> None:
    """34 one-token slots, three seats, a tenth's conservativeness: a (5 tokens, 6 to
    decode) and c (6, 14) run, b (4, 14) joins them and d (1, 6) waits. The three
    overcommit the pool; d, let in when a finishes, is retracted with 5 outputs at step
    12, c with 13 at step 15 (b has as many and a shorter prompt). When b finishes both
    come back in one pass with all 34 slots free: d (its 6 known tokens) is re-admitted
    and reserves 6 + a page + its whole 6 new tokens, leaving 21, and c's future (19
    known tokens, 1 to decode, a page) is 21: refused. Had d reserved only the 1 token it
    has left, c would have fitted: the corner."""
    driver = Driver(
        family="sglang",
        block_size=1,
        num_blocks=34,
        max_num_batched_tokens=64,
        max_num_seqs=3,
        max_model_len=30,
        enable_chunked_prefill=True,
        schedule_conservativeness=0.1,
    )
    driver.add("a", 5, max_tokens=6)
    driver.add("c", 6, max_tokens=14)
    counts: dict[str, int] = {}
    for step in range(16):
        if step == 1:
            driver.add("b", 4, max_tokens=14)
            driver.add("d", 1, max_tokens=6)
        t = driver.schedule()
        count_schedule(counts, t)
        driver.update(t)
    assert "sg-readmit-whole-budget" not in counts
    t = driver.schedule()
    assert t.pre.waiting == ("d", "c") and dict(t.output.num_scheduled_tokens) == {"d": 6}
    assert len(t.pre.requests["d"].output_token_ids) == 5
    count_schedule(counts, t)
    assert counts["sg-readmit-whole-budget"] == 1


def test_a_chunk_after_unaligned_admissions() -> None:
    """Pages of 4, a chunk budget of 12: s1 and s2 (one token each) are admitted first and
    each pays a whole page of the budget, so the 30-token prompt behind them gets a chunk
    of 4, the 12 less 8 (paid raw, the budget would have left it 10, a chunk of 8): the
    corner. The next pass, which only chunks on, is not."""
    driver = Driver(
        family="sglang",
        block_size=4,
        num_blocks=32,
        max_num_batched_tokens=12,
        max_num_seqs=4,
        max_model_len=64,
        enable_chunked_prefill=True,
    )
    driver.add("s1", 1, max_tokens=2)
    driver.add("s2", 1, max_tokens=2)
    driver.add("long", 30, max_tokens=2)
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"s1": 1, "s2": 1, "long": 4}
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    assert counts["sg-chunk-after-unaligned"] == 1
    driver.update(t)
    count_schedule(counts, driver.schedule())
    assert counts["sg-chunk-after-unaligned"] == 1


def test_a_prefix_refresh_is_counted_where_two_first_pages_are_judged() -> None:
    """The worked example's refresh (SG-EVICT-ORDER): c and d wait, starting with a's and
    b's cached first pages. The same step is no corner where the state says no refresh
    ran (a pass count of 33), nor with d not in the queue (one first page has no order to
    judge)."""
    t = sglang_waiting_prefix_refresh()
    counts: dict[str, int] = {}
    count_schedule(counts, t)
    assert counts["sg-prefix-refresh"] == 1
    assert t.pre.sglang is not None and t.post.sglang is not None
    later = dataclasses.replace(
        t,
        pre=dataclasses.replace(t.pre, sglang=dataclasses.replace(t.pre.sglang, prefill_passes=33)),
        post=dataclasses.replace(
            t.post, sglang=dataclasses.replace(t.post.sglang, prefill_passes=34)
        ),
    )
    alone = dataclasses.replace(
        t,
        pre=dataclasses.replace(t.pre, waiting=("c",)),
        post=dataclasses.replace(t.post, waiting=("c",)),
    )
    for step in (later, alone):
        counts = {}
        count_schedule(counts, step)
        assert "sg-prefix-refresh" not in counts


def test_an_abort_mid_prefill_is_counted_and_one_after_it_is_not() -> None:
    driver = Driver(
        family="sglang",
        block_size=1,
        num_blocks=64,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        max_model_len=64,
    )
    driver.add("a", 20, max_tokens=2)
    driver.add("b", 2, max_tokens=2)
    driver.step()
    counts: dict[str, int] = {}
    count_abort_in_flight(counts, [], ("b",), driver.state)  # b waits: not mid-prefill
    assert counts == {}
    count_abort_in_flight(counts, [], ("a",), driver.state)  # a is chunked
    assert counts == {"abort-mid-prefill": 1}


def test_the_table_names_every_corner_and_the_ones_never_reached() -> None:
    lines = format_corners({"preemption": 3})
    assert lines[0].split() == ["corner", "reached", "what"]
    # The KV connector's corners and the hybrid KV cache's only where the run reached one
    # of them.
    plain = [c.name for c in CORNERS if not c.needs_connector and not c.needs_hybrid]
    assert [line.split()[0] for line in lines[1:-1]] == plain
    assert lines[-1].startswith(f"corners reached: 1/{len(plain)} (never: ")
    with_loads = format_corners({"preemption": 3, "load-failed": 1})
    loads = [c.name for c in CORNERS if not c.needs_hybrid]
    assert [line.split()[0] for line in with_loads[1:-1]] == loads
    everything = format_corners({"preemption": 3, "load-failed": 1, "hybrid-preemption": 1})
    assert [line.split()[0] for line in everything[1:-1]] == list(CORNER_NAMES)


def test_each_family_profile_lists_its_own_corners() -> None:
    reached = {"load-failed": 1, "window-frees-a-block": 1}
    vllm = [line.split()[0] for line in format_corners(reached, "vllm-v1")[1:-1]]
    sglang = [line.split()[0] for line in format_corners(reached, "sglang")[1:-1]]
    assert "drafts-scheduled" in vllm and "drafts-scheduled" not in sglang
    assert "sg-latch-closed" in sglang and "sg-latch-closed" not in vllm
    assert {"preemption", "abort-in-flight"} <= set(vllm) & set(sglang)
    assert set(vllm) | set(sglang) == set(CORNER_NAMES)


def test_check_prints_the_corners_and_json_reports_them(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        main, ["check", "--examples", "20", "--seed", "1", "--json", str(report)]
    )
    assert result.exit_code == 0, result.output
    printed = {
        line.split()[0]: int(line.split()[1])
        for line in result.stdout.splitlines()
        if line.split() and line.split()[0] in CORNER_NAMES
    }
    assert set(printed) == {
        c.name for c in corners_for("vllm-v1") if not c.needs_connector and not c.needs_hybrid
    }
    assert "corners reached: " in result.stdout
    assert json.loads(report.read_text())["corners"] == printed
    assert printed["preemption"] > 0
