"""simulate's SGLang family: its presets are the same deployment as SGLang runs it, an
engine of that family only runs them by default, and --compare on the reference puts
both families' policies on one workload."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.adapters.reference import reference_engine
from schedspec.cli.main import main
from schedspec.simulate.configs import (
    COMPARE_PRESETS,
    SGLANG_COMPARE_PRESETS,
    SGLANG_EXPERIMENT_PRESETS,
    default_presets,
    resolve_configs,
)
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.errors import SimulationInputError
from schedspec.simulate.experiment import trade_off
from schedspec.simulate.runs import run_configs
from schedspec.simulate.workloads import long_prompt_among_decodes


def test_sglangs_base_is_the_same_kv_memory_in_token_slots() -> None:
    cost = CostModel()
    vllm, sglang, small = resolve_configs(
        ["chunked", "sglang", "sglang-small-kv"], False, False, {}, cost
    )
    assert (vllm.config.block_size, vllm.config.num_blocks) == (16, 6976)
    assert sglang.config.family == "sglang"
    # 6976 blocks of 16 tokens: 111616 slots of page size 1, SGLang's default.
    assert (sglang.config.block_size, sglang.config.num_blocks) == (1, 111616)
    # The rest of the deployment is the same; vLLM's knobs at their defaults.
    for field in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
        assert getattr(sglang.config, field) == getattr(vllm.config, field)
    assert (vllm.config.watermark, sglang.config.watermark) == (0.01, 0.0)
    # small-kv is 8192 tokens in either family: 512 blocks of 16, or 8192 slots.
    assert (small.config.block_size, small.config.num_blocks) == (1, 8192)


def test_a_page_size_set_for_every_config_keeps_the_memory() -> None:
    (sglang,) = resolve_configs(["sglang"], False, False, {"block_size": 4}, CostModel())
    # --set block_size=4 sizes vLLM's base in blocks of 4 (27904 of them): the same
    # memory in pages of 4.
    base = CostModel().default_num_blocks(4)
    assert (sglang.config.block_size, sglang.config.num_blocks) == (4, base)


def test_a_vllm_only_preset_has_no_sglang_form() -> None:
    # spec-decode changes a knob SGLang's family does not have: sglang-spec-decode is
    # not a preset, so it starts from vLLM's base (and is vLLM's chunked config).
    (config,) = resolve_configs(["sglang-spec-decode"], False, False, {}, CostModel())
    assert config.config.family == "vllm"
    with pytest.raises(SimulationInputError, match="watermark"):
        resolve_configs(["sglang:watermark=0.1"], False, False, {}, CostModel())


@pytest.mark.parametrize(
    ("families", "compare", "experiment", "presets"),
    [
        (("vllm",), False, False, ["chunked"]),
        (("vllm",), True, False, list(COMPARE_PRESETS)),
        (("vllm", "sglang"), True, False, [*COMPARE_PRESETS, "sglang", "sglang-small-kv"]),
        (("vllm", "sglang"), False, True, ["no-chunking", "chunked-512"]),
        (("sglang",), False, False, ["sglang"]),
        (("sglang",), True, False, list(SGLANG_COMPARE_PRESETS)),
        (("sglang",), False, True, list(SGLANG_EXPERIMENT_PRESETS)),
    ],
)
def test_the_default_presets_follow_the_engines_families(
    families: tuple[str, ...], compare: bool, experiment: bool, presets: list[str]
) -> None:
    assert default_presets(compare, experiment, families) == presets  # type: ignore[arg-type]


def test_the_families_decide_differently_on_one_workload() -> None:
    """The long prompt among 16 decodes: vLLM runs the decodes first and chunks the
    prompt into what the budget leaves; SGLang's prefill first gives the prompt whole
    chunks and the decodes wait, so its TTFT is lower and the decodes' worst gap larger
    (on the default cost model: 53 ms against 62 ms, and 55 ms against 8 ms)."""
    cost = CostModel()
    configs = resolve_configs(
        ["chunked-512", "sglang-chunked-512"], False, False, {"num_blocks": 6976}, cost
    )
    workload = long_prompt_among_decodes(0, 4096)
    runs = {
        r.result.name: r for r in run_configs(configs, workload, reference_engine, cost, 0, 100_000)
    }
    vllm = trade_off("chunked-512", runs["chunked-512"].metrics)
    sglang = trade_off("sglang-chunked-512", runs["sglang-chunked-512"].metrics)
    assert sglang.long_ttft_s < vllm.long_ttft_s
    assert sglang.decodes_worst_gap_s > vllm.decodes_worst_gap_s


def test_compare_on_the_reference_runs_both_families(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["simulate", "--compare", "--no-plots", "--out", str(tmp_path), "--json",
         "--workload", "long-prompt"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert '"sglang-small-kv"' in result.output and '"spec-decode"' in result.output
