"""The step classification and the timeline line, on hand-made examples."""

from __future__ import annotations

import dataclasses

from schedspec.cli.printing.run_report import Scheduled, format_step, record_step
from schedspec.simulate.timeline import ScheduledEntry, classify
from schedspec.spec import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    RequestOutput,
    RequestStatus,
    SchedulerOutput,
)


class TestClassify:
    def test_first_prompt_chunk_is_prefill(self) -> None:
        # 1000-token prompt, nothing computed, 256 scheduled.
        entry = classify("A", 0, 256, 0, 1000)
        assert (entry.kind, entry.num_scheduled, str(entry)) == ("prefill", 256, "[A prefill 256]")

    def test_middle_and_last_prompt_chunks_are_prefill(self) -> None:
        assert classify("A", 256, 256, 0, 1000).kind == "prefill"
        # The last chunk reaches the end of the prompt: still a prefill.
        assert classify("A", 768, 232, 0, 1000).kind == "prefill"

    def test_prefill_after_prefix_hit(self) -> None:
        # 192 tokens hit the cache; the remaining 40 of a 232-token prompt run.
        assert str(classify("C", 192, 40, 0, 232)) == "[C prefill 40]"

    def test_decode(self) -> None:
        # 100 known tokens, all but the last computed: one token, no drafts.
        entry = classify("B", 99, 1, 0, 100)
        assert (entry.kind, str(entry)) == ("decode", "[B decode 1]")

    def test_spec_one_plus_k(self) -> None:
        entry = classify("B", 99, 5, 4, 100)
        assert (entry.kind, entry.num_drafts, str(entry)) == ("spec", 4, "[B spec 1+4]")

    def test_budget_cut_drafts_show_the_scheduled_count(self) -> None:
        # Two drafts proposed, only one fitted the budget.
        assert str(classify("B", 99, 2, 1, 100)) == "[B spec 1+1]"

    def test_resumed_recompute_is_prefill(self) -> None:
        # Preempted after 30 outputs of a 50-token prompt: 80 known, 0 computed.
        assert classify("E", 0, 80, 0, 80).kind == "prefill"
        # Resumed with a 48-token prefix hit, recomputing the rest.
        assert str(classify("E", 48, 32, 0, 80)) == "[E prefill 32]"

    def test_computing_only_the_last_known_token_is_a_decode(self) -> None:
        # Same work as a decode (one query token that samples), so named as one.
        assert classify("A", 999, 1, 0, 1000).kind == "decode"


def _output() -> SchedulerOutput:
    return SchedulerOutput(
        scheduled_new_reqs=(
            NewRequestData("D", tuple(range(250)), block_ids=(7,), num_computed_tokens=192),
        ),
        scheduled_cached_reqs=(
            CachedRequestData("B", False, (), num_computed_tokens=99, num_output_tokens=60),
            CachedRequestData("E", True, (3, 4), num_computed_tokens=0, num_output_tokens=9),
        ),
        num_scheduled_tokens={"B": 3, "E": 40, "D": 58},
        total_num_scheduled_tokens=101,
        scheduled_spec_decode_tokens={"B": (5, 6)},
        preempted_req_ids=frozenset({"F"}),
        finished_req_ids=frozenset(),
    )


def test_record_and_format_step() -> None:
    model_output = ModelRunnerOutput({"B": [11, 12], "D": [13]})
    reported = {
        "B": RequestOutput("B", (11, 12), None, 101),
        "D": RequestOutput("D", (13,), None, 250),
    }
    scheduled = Scheduled(7, _output(), {"B": 100, "E": 60, "D": 250}, {"B": 60, "E": 9, "D": 0})
    record = record_step(7, ["D"], scheduled, (scheduled, model_output, reported), 512, 0.875)
    assert record.entries[0] == ScheduledEntry("B", "spec", 3, 2, num_accepted=1)
    assert record.entries[1] == ScheduledEntry("E", "prefill", 40, 0)
    assert record.entries[2] == ScheduledEntry("D", "prefill", 58, 0, num_cached=192)
    assert (record.prefill_tokens, record.decode_tokens, record.draft_tokens) == (98, 1, 2)
    assert format_step(record) == (
        "Iter 7: [B spec 1+2] [E prefill 40] [D prefill 58 +192 cached] "
        "| 101/512 tokens, KV 88% | arrived: D | preempted: F"
    )


def test_an_async_iteration_shows_what_is_in_flight_and_what_landed() -> None:
    """Iteration 8 schedules B past its 2 in-flight output positions (60 delivered, 62
    in the runner's count) and lands iteration 7's step: B's output finished it, F's was
    stale (F was preempted since), E's was dropped (aborted since)."""
    output = dataclasses.replace(
        _output(),
        scheduled_cached_reqs=(
            CachedRequestData("B", False, (), num_computed_tokens=101, num_output_tokens=62),
        ),
        scheduled_new_reqs=(),
        num_scheduled_tokens={"B": 3},
        total_num_scheduled_tokens=3,
        preempted_req_ids=frozenset(),
    )
    eighth = Scheduled(8, output, {"B": 100}, {"B": 60})
    seventh = Scheduled(7, _output(), {"B": 98, "E": 60, "D": 250}, {"B": 58, "E": 9, "D": 0})
    model_output = ModelRunnerOutput({"B": [11, 12], "E": [5], "F": [6]})
    reported = {
        "B": RequestOutput("B", (11, 12), RequestStatus.FINISHED_STOPPED, 100),
        "F": RequestOutput("F", (6,), None, None),
    }
    record = record_step(8, [], eighth, (seventh, model_output, reported), 512, 0.5, True)
    assert record.entries == [ScheduledEntry("B", "spec", 3, 2, num_in_flight=2)]
    assert record.landing is not None and record.landing.drafts_accepted == 1
    assert format_step(record) == (
        "Iter 8: [B spec 1+2 +2 in flight] | 3/512 tokens, KV 50% | landed: iter 7 "
        "| finished: B | stale: F | dropped: E"
    )
