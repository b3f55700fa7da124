"""`schedspec run` end to end, through click's test runner."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from schedspec.cli.main import main


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, ["run", *args])


def _json_run(*args: str) -> dict[str, Any]:
    result = _run("--json", *args)
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.output)
    return document


class TestDefaultRun:
    def test_prints_timeline_and_summary(self) -> None:
        result = _run()
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        iters = [line for line in lines if line.startswith("Iter ")]
        assert iters and iters[0].startswith("Iter 1: ")
        assert any("preempted: " in line for line in iters)
        assert any(" cached]" in line for line in iters)  # a prefix-cache hit
        assert any("prefill" in line and "spec 1+2" in line for line in iters)  # mixed batch
        assert "Steps: " in result.output
        assert "Prefix-cache hit rate: n/a" not in result.output
        assert "Draft acceptance rate: n/a" not in result.output

    def test_is_deterministic_given_the_seed(self) -> None:
        assert _run().output == _run("--seed", "0").output
        assert _run("--seed", "1").output != _run().output

    def test_quiet_prints_the_summary_only(self) -> None:
        result = _run("--quiet")
        assert result.exit_code == 0
        assert "Iter " not in result.output
        assert result.output.startswith("Steps: ")


class TestJson:
    def test_summary_invariants(self) -> None:
        doc = _json_run()
        steps, summary = doc["steps"], doc["summary"]
        assert doc["config"]["num_speculative_tokens"] > 0
        # Every request finished, none aborted.
        assert sum(summary["finished"].values()) == summary["num_requests"] == 14
        assert set(summary["finished"]) <= {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"}
        # Token accounting adds up, step by step and overall.
        for step in steps:
            assert 0 < step["total_scheduled"] <= step["token_budget"]
            assert step["total_scheduled"] == sum(e["num_scheduled"] for e in step["entries"])
        assert summary["tokens_scheduled"] == sum(s["total_scheduled"] for s in steps)
        assert summary["tokens_scheduled"] == (
            summary["prefill_tokens"] + summary["decode_tokens"] + summary["draft_tokens"]
        )
        entries = [e for s in steps for e in s["entries"]]
        assert summary["draft_tokens"] == sum(e["num_drafts"] for e in entries)
        assert summary["decode_tokens"] == sum(e["kind"] != "prefill" for e in entries)
        assert summary["steps"] == len(steps)
        # What the default config must show.
        assert summary["preemptions"] == sum(len(s["preempted"]) for s in steps) > 0
        assert summary["prefix_cache_hits"] > 0
        assert 0 < summary["draft_acceptance_rate"] <= 1
        # NO-LEAK: all blocks free at the end.
        assert summary["final_kv_usage"] == 0 == steps[-1]["kv_usage"]

    def test_quiet_json_has_no_steps(self) -> None:
        assert set(_json_run("--quiet")) == {"config", "summary"}


class TestFlags:
    @pytest.mark.parametrize(
        ("args", "field", "bound"),
        [
            (["--block-size", "0"], "block_size", ">= 1"),
            (["--watermark", "1.5"], "watermark", "[0, 1)"),
            (["--num-blocks", "10"], "num_blocks", "max_model_len"),
            (["--max-num-seqs", "0"], "max_num_seqs", ">= 1"),
            (["--long-prefill-token-threshold", "-1"], "long_prefill_token_threshold", ">= 0"),
            (["--no-enable-chunked-prefill"], "max_num_batched_tokens", "chunked prefill"),
        ],
    )
    def test_bad_value_is_a_usage_error(self, args: list[str], field: str, bound: str) -> None:
        result = _run(*args)
        assert result.exit_code == 2, result.output
        assert field in result.output and bound in result.output
        assert "--" + field.replace("_", "-") in result.output
        assert "Traceback" not in result.output

    def test_max_steps_bounds_the_run(self) -> None:
        result = _run("--max-steps", "5")
        assert result.exit_code == 1
        assert "--max-steps 5" in result.output

    def test_caching_off_reports_na(self) -> None:
        result = _run("--quiet", "--no-enable-prefix-caching")
        assert result.exit_code == 0
        assert "Prefix-cache hit rate: n/a" in result.output

    def test_no_speculation_decodes_one_token(self) -> None:
        doc = _json_run("--num-speculative-tokens", "0")
        kinds = {e["kind"] for s in doc["steps"] for e in s["entries"]}
        assert kinds == {"prefill", "decode"}
        assert doc["summary"]["draft_acceptance_rate"] is None

    @pytest.mark.parametrize(
        "args",
        [
            ["--max-model-len", "2", "--num-blocks", "1", "--block-size", "2"],
            ["--max-model-len", "64", "--num-blocks", "4", "--block-size", "16"],
            ["--policy", "priority", "--max-num-seqs", "3", "--watermark", "0"],
            ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "1024"],
            ["--max-num-batched-tokens", "1", "--max-num-seqs", "1"],
        ],
    )
    def test_any_valid_config_drains(self, args: list[str]) -> None:
        summary = _json_run("--quiet", *args)["summary"]
        assert sum(summary["finished"].values()) == 14
        assert summary["final_kv_usage"] == 0
