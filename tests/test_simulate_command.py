"""`schedspec simulate` end to end, through click's test runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from schedspec.cli.main import main
from schedspec.cli.printing.progress import _Tally, simulation_progress

SMALL = ("--num-requests", "30", "--rate", "30")


def _run(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "out"), *args])


def _summary(tmp_path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((tmp_path / "out" / "summary.json").read_text())
    return document


def test_listed_by_the_cli() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert "simulate" in result.output


def test_experiment_prints_both_numbers_and_draws(tmp_path: Path) -> None:
    result = _run(tmp_path, "--experiment", "chunked-prefill", "--format", "png")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = {line.split()[0]: line for line in lines if "long prompt TTFT" in line}
    assert set(rows) == {"no-chunking", "chunked-512"}
    verdict = [line for line in lines if "chunked-512 vs no-chunking" in line]
    assert len(verdict) == 1
    ttft_ratio = float(verdict[0].split("TTFT x")[1].split(",")[0])
    tpot_ratio = float(verdict[0].split("worst TPOT x")[1])
    assert ttft_ratio > 1 > tpot_ratio
    pictures = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert pictures == [
        "gantt-chunked-512.png",
        "gantt-no-chunking.png",
        "kv-queue.png",
        "latency-cdf.png",
        "summary.json",
    ]


def test_compare_runs_every_preset_on_one_workload(tmp_path: Path) -> None:
    result = _run(tmp_path, "--compare", *SMALL, "--no-plots")
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    assert header == [
        "no-chunking",
        "chunked",
        "chunked-512",
        "no-prefix-cache",
        "spec-decode",
        "small-kv",
        # The reference follows SGLang's family too: its policy beside vLLM's.
        "sglang",
        "sglang-small-kv",
    ]
    runs = _summary(tmp_path)["runs"]
    arrivals = {tuple(r["arrival_time"] for r in run["requests"]) for run in runs}
    assert len(arrivals) == 1  # the same workload under every config
    by_name = {run["name"]: run for run in runs}
    assert by_name["no-prefix-cache"]["summary"]["prefix_cache_hit_rate"] is None
    assert by_name["chunked"]["summary"]["prefix_cache_hit_rate"] > 0
    assert by_name["no-chunking"]["config"]["enable_chunked_prefill"] is False
    assert by_name["sglang"]["config"]["family"] == "sglang"


def test_json_carries_per_request_metrics_and_is_seeded(tmp_path: Path) -> None:
    first = _run(tmp_path, *SMALL, "--json", "--no-plots", "--seed", "3")
    again = _run(tmp_path, *SMALL, "--json", "--no-plots", "--seed", "3")
    other = _run(tmp_path, *SMALL, "--json", "--no-plots", "--seed", "4")
    assert first.exit_code == 0, first.output
    document = json.loads(first.output)
    assert document == json.loads(again.output)
    assert document != json.loads(other.output)
    (run,) = document["runs"]
    assert run["name"] == "chunked" and len(run["requests"]) == 30
    assert set(run["requests"][0]) >= {
        "ttft",
        "tpot",
        "e2e",
        "num_preemptions",
        "recomputed_tokens",
    }
    assert set(run["summary"]["ttft_s"]) == {"p50", "p90", "p99", "max"}
    assert run["cost_model"]["peak_flops"] == 989e12


def test_config_and_cost_flags_reach_the_run(tmp_path: Path) -> None:
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"step_overhead_s": 0.002}))
    result = _run(
        tmp_path,
        *SMALL,
        "--no-plots",
        "--config",
        "tight:num_blocks=300,max_num_seqs=4",
        "--config",
        "chunked",
        "--set",
        "watermark=0.05",
        "--cost-json",
        str(cost),
        "--cost",
        "peak_flops=500e12",
    )
    assert result.exit_code == 0, result.output
    tight, chunked = _summary(tmp_path)["runs"]
    assert (tight["config"]["num_blocks"], tight["config"]["max_num_seqs"]) == (300, 4)
    assert tight["config"]["watermark"] == chunked["config"]["watermark"] == 0.05
    assert tight["cost_model"]["step_overhead_s"] == 0.002
    assert tight["cost_model"]["peak_flops"] == 500e12


def test_trace_workload(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"arrival_time": 0, "prompt_tokens": 100, "output_tokens": 5}\n'
        '{"arrival_time": 0.01, "prompt_tokens": 40, "output_tokens": 3, "request_id": "x"}\n'
    )
    result = _run(tmp_path, "--workload", str(trace), "--no-plots")
    assert result.exit_code == 0, result.output
    (run,) = _summary(tmp_path)["runs"]
    assert [r["request_id"] for r in run["requests"]] == ["line1", "x"]
    assert [r["num_output_tokens"] for r in run["requests"]] == [5, 3]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "max_num_seqs=0"], "max_num_seqs: config 'chunked': max_num_seqs: must be >= 1"),
        (["--config", "x:bogus=1"], "bogus: config 'x': unknown field"),
        (["--config", ":a=1"], "expected NAME[:field=value,...]"),
        (["--config", "a", "--config", "a"], "config names must be distinct"),
        (["--set", "max_num_seqs"], "set: expected field=value"),
        (["--cost", "peak_flops=-1"], "peak_flops: --cost: must be > 0"),
        (["--prompt-len", "uniform:5:2"], "prompt_len: expected fixed:N"),
        (["--rate", "0"], "rate: must be > 0"),
        (["--workload", "long-prompt", "--rate", "3"], "--rate shape(s) only the mixed workload"),
        (
            ["--engine", "nosuch"],
            "engine: expected 'reference', 'gpu', 'vllm', 'sglang', or module:factory",
        ),
        # --compare runs its own presets: a flag that also picks configs would be ignored.
        (
            ["--compare", "--experiment", "chunked-prefill"],
            "--experiment: --compare runs its own presets",
        ),
        (["--compare", "--config", "chunked"], "--config: --compare runs its own presets"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_field(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = _run(tmp_path, "--no-plots", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_bad_trace_record_names_line_and_field(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"arrival_time": 0, "prompt_tokens": 10, "output_tokens": 5}\n'
        '{"arrival_time": 1, "prompt_tokens": 10, "output_tokens": -5}\n'
    )
    result = _run(tmp_path, "--workload", str(trace), "--no-plots")
    assert result.exit_code == 2
    assert (
        f"{trace} line 2: field 'output_tokens' must be an integer in [1, 2**63), got -5"
        in result.output
    )


def test_progress_lines_off_a_terminal(tmp_path: Path) -> None:
    result = _run(tmp_path, *SMALL, "--no-plots", "--progress")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("simulating ")]
    assert lines[-1].startswith("simulating chunked: 30/30 requests (")
    assert 2 <= len(lines) <= 11


def test_progress_counts_over_configs() -> None:
    tally = _Tally()
    positions = [tally.position(name, n) for name, n in [("a", 3), ("a", 10), ("b", 0), ("b", 4)]]
    assert positions == [3, 10, 10, 14]
    with simulation_progress(20, forced=False, tty=False) as nothing:
        assert nothing is None  # off a terminal, without --progress: silent
    with simulation_progress(20, forced=False, tty=True) as bar:
        assert bar is not None


def test_a_prompt_too_long_for_the_configs_names_its_line(tmp_path: Path) -> None:
    """Refused as it is read, before a token of it is drawn: the bound is the smallest
    max_model_len of the configs simulated (the base config's 4096 here)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_time": 0, "prompt_tokens": 5000, "output_tokens": 5}\n')
    result = _run(tmp_path, "--workload", str(trace), "--no-plots")
    assert result.exit_code == 2
    assert (
        f"{trace} line 1: field 'prompt_tokens' must be >= 1 and shorter than max_model_len "
        "(4096), got 5000"
    ) in result.output


@pytest.mark.parametrize("scale", [1.0, 1e6], ids=["epoch-seconds", "epoch-microseconds"])
def test_absolute_arrival_times_count_from_the_first(tmp_path: Path, scale: float) -> None:
    """A trace stamped with epoch times simulates like one from 0: before, the clock sat
    at 1.7e9 s (1.7e15 in microseconds), where a step's milliseconds vanish in the
    float's rounding and every latency came out 0.0 ms."""
    start = 1_700_000_000.0 * scale
    trace = tmp_path / "epoch.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {"arrival_time": start + i * 0.5 * scale, "prompt_tokens": 40, "output_tokens": 8}
            )
            + "\n"
            for i in range(4)
        )
    )
    result = _run(tmp_path, "--workload", str(trace), "--no-plots", "--json")
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["runs"]
    arrivals = [r["arrival_time"] for r in run["requests"]]
    assert arrivals == [0.0, 0.5 * scale, 1.0 * scale, 1.5 * scale]
    assert all(r["ttft"] > 0 for r in run["requests"])


def test_an_engine_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(tmp_path)
    (tmp_path / "my_simulated_engine.py").write_text(
        "from schedspec.adapters.reference import ReferenceEngine as Engine\n"
    )
    result = _run(tmp_path, "--engine", "my_simulated_engine:Engine", *SMALL, "--no-plots")
    assert result.exit_code == 0, result.output


def test_the_same_run_draws_the_same_bytes(tmp_path: Path) -> None:
    """SVG ids were salted at random and stamped with the time: two runs differed."""
    args = ("--num-requests", "6", "--format", "svg", "--format", "png")
    first = CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "a"), *args])
    again = CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "b"), *args])
    assert first.exit_code == again.exit_code == 0, first.output
    drawn = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "kv-queue.svg" in drawn and "kv-queue.png" in drawn
    for name in drawn:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.parametrize(
    ("flags", "field", "bound"),
    [
        (["--num-requests", "100000000"], "num_requests", "in [1, 100000]"),
        (["--prefix-groups", "1000000"], "prefix_groups", "in [0, 1000]"),
        (["--prompt-len", "fixed:100000000"], "prompt_len", "lengths in [1, 16777216]"),
        (["--output-len", "lognormal:100:50"], "output_len", "0 < SIGMA <= 10"),
        (["--set", "num_blocks=1000000000"], "num_blocks", "<= 4194304"),
        (["--set", "num_speculative_tokens=100000000"], "num_speculative_tokens", "<= 256"),
    ],
)
def test_sizes_past_what_memory_allows_are_refused(
    tmp_path: Path, flags: list[str], field: str, bound: str
) -> None:
    result = _run(tmp_path, *flags, "--no-plots")
    assert result.exit_code == 2, result.output
    assert field in result.output and bound in result.output


def test_a_prompt_longer_than_the_model_is_cut_before_it_is_drawn(tmp_path: Path) -> None:
    """fixed:16000000 under max_model_len 64: each prompt is drawn 63 tokens long (it was
    drawn whole, 16 million tokens a request, then cut), leaving one output token."""
    result = _run(
        tmp_path,
        "--num-requests",
        "20",
        "--prompt-len",
        "fixed:16000000",
        "--set",
        "max_model_len=64,num_blocks=64",
        "--no-plots",
        "--json",
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["runs"]
    assert {r["num_output_tokens"] for r in run["requests"]} == {1}
