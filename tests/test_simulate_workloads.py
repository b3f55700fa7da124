"""Workloads: length distributions, Poisson arrivals, shared-prefix groups, the
experiment's shape, and the JSONL loader's errors naming the line and field."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from pathlib import Path

import pytest

from schedspec.simulate.errors import SimulationInputError, TraceRecordError
from schedspec.simulate.trace_file import load_trace, write_trace
from schedspec.simulate.workloads import (
    LONG_PROMPT_ID,
    MAX_SIM_REQUESTS,
    NUM_DECODES,
    LengthDistribution,
    SyntheticWorkload,
    builtin_workload,
    long_prompt_among_decodes,
)


class TestLengthDistribution:
    def test_fixed_and_uniform(self) -> None:
        rng = random.Random(0)
        assert LengthDistribution.parse("fixed:7", "prompt_len").draw(rng) == 7
        uniform = LengthDistribution.parse("uniform:3:5", "prompt_len")
        assert {uniform.draw(rng) for _ in range(200)} == {3, 4, 5}

    def test_lognormal_has_its_median_and_cap(self) -> None:
        dist = LengthDistribution.parse("lognormal:100:0.5:300", "output_len")
        rng = random.Random(1)
        draws = [dist.draw(rng) for _ in range(4000)]
        assert 90 <= statistics.median(draws) <= 110
        assert max(draws) == 300 and min(draws) >= 1

    @pytest.mark.parametrize(
        "text",
        [
            "fixed:0",
            "fixed:2.5",
            "uniform:5:3",
            "uniform:0:3",
            "lognormal:100:0",
            "zipf:3",
            "fixed:x",
        ],
    )
    def test_bad_form_names_the_flag(self, text: str) -> None:
        with pytest.raises(SimulationInputError) as err:
            LengthDistribution.parse(text, "prompt_len")
        assert err.value.field == "prompt_len"
        assert text in str(err.value)


class TestSynthetic:
    def test_same_seed_same_workload(self) -> None:
        a = SyntheticWorkload(num_requests=30).generate(3, 4096)
        assert len(a) == 30
        assert list(a) == list(a) == list(SyntheticWorkload(num_requests=30).generate(3, 4096))
        assert list(a) != list(SyntheticWorkload(num_requests=30).generate(4, 4096))

    def test_poisson_arrivals_at_the_rate(self) -> None:
        requests = SyntheticWorkload(num_requests=3000, rate=10.0).generate(0, 4096)
        times = [r.arrival_time for r in requests]
        assert times == sorted(times)
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.05)
        # Exponential gaps: the standard deviation equals the mean.
        assert statistics.stdev(gaps) == pytest.approx(0.1, rel=0.1)

    def test_shared_prefix_groups(self) -> None:
        workload = SyntheticWorkload(
            num_requests=400, prefix_groups=3, prefix_len=64, prefix_share=0.5
        )
        requests = workload.generate(0, 4096)
        heads = [r.prompt_token_ids[:64] for r in requests]
        groups = {h for h in heads if heads.count(h) > 1}
        assert len(groups) == 3
        shared = sum(h in groups for h in heads)
        assert 160 <= shared <= 240  # half of 400, give or take

    def test_requests_fit_max_model_len(self) -> None:
        workload = SyntheticWorkload(
            num_requests=50,
            prompt_len=LengthDistribution("fixed", 900),
            output_len=LengthDistribution("fixed", 500),
        )
        # 900 own tokens, or 256 + 900 with a shared prefix, trimmed to leave one slot.
        lengths = set()
        for r in workload.generate(0, 1024):
            lengths.add(len(r.prompt_token_ids))
            assert r.max_tokens == min(500, 1024 - len(r.prompt_token_ids))
        assert lengths == {900, 1023}

    @pytest.mark.parametrize(
        ("field", "value"),
        [("num_requests", 0), ("rate", 0.0), ("prefix_share", 1.5), ("prefix_len", -1)],
    )
    def test_bad_field_names_itself(self, field: str, value: object) -> None:
        with pytest.raises(SimulationInputError) as err:
            SyntheticWorkload(**{field: value})  # type: ignore[arg-type]
        assert err.value.field == field


def test_long_prompt_among_decodes() -> None:
    requests = long_prompt_among_decodes(0, 4096)
    assert len(requests) == NUM_DECODES + 1
    long = requests[-1]
    assert long.request_id == LONG_PROMPT_ID and len(long.prompt_token_ids) == 3500
    assert all(r.arrival_time == 0.0 for r in requests[:-1]) and long.arrival_time > 0
    assert list(builtin_workload("long-prompt", 0, 4096)) == requests


def test_unknown_builtin_names_the_field() -> None:
    with pytest.raises(SimulationInputError, match="mixed, long-prompt") as err:
        builtin_workload("bursty", 0, 4096)
    assert err.value.field == "workload"


class TestJsonlTrace:
    def _write(self, tmp_path: Path, *records: object) -> Path:
        path = tmp_path / "trace.jsonl"
        path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records))
        return path

    def test_loads_counts_and_token_lists_sorted_by_arrival(self, tmp_path: Path) -> None:
        path = self._write(
            tmp_path,
            {"arrival_time": 1.5, "prompt_tokens": 12, "output_tokens": 4},
            "",
            {"arrival_time": 0.25, "prompt_tokens": [5, 6, 7], "output_tokens": 2, "priority": 1},
        )
        first, second = load_trace(path, seed=0, max_model_len=4096)
        assert (first.request_id, first.arrival_time, first.prompt_token_ids) == (
            "line3",
            0.0,  # the first arrival is the start
            (5, 6, 7),
        )
        assert second.arrival_time == 1.25
        assert (first.max_tokens, first.priority) == (2, 1)
        assert (second.request_id, len(second.prompt_token_ids), second.max_tokens) == (
            "line1",
            12,
            4,
        )
        assert second.source == f"{path} line 1"

    def test_round_trip(self, tmp_path: Path) -> None:
        requests = list(SyntheticWorkload(num_requests=20).generate(5, 4096))
        path = tmp_path / "out.jsonl"
        write_trace(path, requests)
        loaded = load_trace(path, seed=99, max_model_len=4096)
        start = requests[0].arrival_time  # the loaded trace starts at its first arrival
        assert [
            (r.request_id, r.arrival_time, r.prompt_token_ids, r.max_tokens) for r in loaded
        ] == [
            (r.request_id, r.arrival_time - start, r.prompt_token_ids, r.max_tokens)
            for r in requests
        ]

    @pytest.mark.parametrize(
        ("bad", "field", "message"),
        [
            ({"prompt_tokens": 3, "output_tokens": 2}, "arrival_time", "is missing"),
            ({"arrival_time": -1, "prompt_tokens": 3, "output_tokens": 2}, "arrival_time", ">= 0"),
            (
                {"arrival_time": "0", "prompt_tokens": 3, "output_tokens": 2},
                "arrival_time",
                "number",
            ),
            ({"arrival_time": 0, "prompt_tokens": 0, "output_tokens": 2}, "prompt_tokens", ">= 1"),
            ({"arrival_time": 0, "prompt_tokens": [], "output_tokens": 2}, "prompt_tokens", "list"),
            (
                {"arrival_time": 0, "prompt_tokens": [1, -2], "output_tokens": 2},
                "prompt_tokens",
                "ids >= 0",
            ),
            (
                {"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 0},
                "output_tokens",
                r"in \[1, 2\*\*63\)",
            ),
            (
                {"arrival_time": 0, "prompt_tokens": 4096, "output_tokens": 1},
                "prompt_tokens",
                r"shorter than max_model_len \(4096\)",
            ),
            (
                {"arrival_time": 0, "prompt_tokens": [1] * 4096, "output_tokens": 1},
                "prompt_tokens",
                "a list of 4096 token ids",
            ),
            (
                {"arrival_time": 10**400, "prompt_tokens": 3, "output_tokens": 1},
                "arrival_time",
                "finite",
            ),
            ("[" * 100 + "]" * 100, "record", "nests deeper than 32"),
            (
                '{"arrival_time": NaN, "prompt_tokens": 3, "output_tokens": 1}',
                "arrival_time",
                "NaN",
            ),  # the field, not the record (issue 33)
            (
                {"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 2.5},
                "output_tokens",
                "integer",
            ),
            (
                {"arrival_time": 0, "prompt_tokens": 3, "output_tokens": True},
                "output_tokens",
                "integer",
            ),
            (
                {"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 1, "priority": "hi"},
                "priority",
                "integer",
            ),
            (
                {"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 1, "input_len": 3},
                "input_len",
                "is not one of",
            ),
            (
                {"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 1, "request_id": "line1"},
                "request_id",
                "unique",
            ),
            ("[1, 2]", "record", "JSON object"),
            ("{oops", "record", "not JSON"),
        ],
    )
    def test_bad_record_names_its_line_and_field(
        self, tmp_path: Path, bad: object, field: str, message: str
    ) -> None:
        good = {"arrival_time": 0, "prompt_tokens": 3, "output_tokens": 1}
        path = self._write(tmp_path, good, bad)
        with pytest.raises(TraceRecordError, match=message) as err:
            load_trace(path, seed=0, max_model_len=4096)
        assert (err.value.field, err.value.line) == (field, 2)
        assert str(err.value).startswith(f"{path} line 2: ")

    def test_empty_or_missing_file(self, tmp_path: Path) -> None:
        empty = self._write(tmp_path, "")
        with pytest.raises(TraceRecordError, match="no records") as err:
            load_trace(empty, seed=0, max_model_len=4096)
        assert str(err.value) == f"{empty}: the trace has no records"
        with pytest.raises(TraceRecordError, match=r"absent\.jsonl: cannot be read"):
            load_trace(tmp_path / "absent.jsonl", seed=0, max_model_len=4096)


def test_a_large_workload_is_drawn_as_it_is_read() -> None:
    """A hundred thousand requests of up to 2500 prompt tokens: only those read are drawn."""
    workload = SyntheticWorkload(num_requests=MAX_SIM_REQUESTS).generate(0, 4096)
    assert len(workload) == MAX_SIM_REQUESTS
    first = list(itertools.islice(workload, 3))
    assert [r.request_id for r in first] == ["r0", "r1", "r2"]
    assert first == list(itertools.islice(workload, 3))  # drawn afresh: the same requests
