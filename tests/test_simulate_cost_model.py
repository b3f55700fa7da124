"""The step-time cost model: the roofline formula with worked numbers, and its
validation naming the field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from schedspec.simulate.cost_model import CostModel, CostModelError, StepWork

# Round numbers so each term of the formula is visible in the expected value.
TOY = CostModel(
    weight_bytes=100,
    hbm_bandwidth=10,
    flops_per_token=5,
    peak_flops=10,
    kv_bytes_per_token=2,
    step_overhead_s=1,
)


class TestStepTime:
    def test_memory_bound_step_pays_the_weight_floor(self) -> None:
        # 1 overhead + max(100/10 = 10, (3+1)*5/10 = 2) + 5*2/10 = 1
        assert TOY.step_time(StepWork(3, 1, 5)) == pytest.approx(12.0)

    def test_compute_bound_step_pays_the_flops(self) -> None:
        # 1 + max(10, 30*5/10 = 15) + 40*2/10 = 8
        assert TOY.step_time(StepWork(30, 0, 40)) == pytest.approx(24.0)

    def test_async_scheduling_overlaps_the_cpu_share_with_the_gpu(self) -> None:
        # GPU 10 + 1 = 11 against overhead 1: the longer, not the sum (12).
        assert TOY.step_time(StepWork(3, 1, 5), overlapped=True) == pytest.approx(11.0)
        heavy_cpu = CostModel(**{**TOY.__dict__, "step_overhead_s": 20})
        assert heavy_cpu.step_time(StepWork(3, 1, 5), overlapped=True) == pytest.approx(20.0)
        assert heavy_cpu.step_time(StepWork(3, 1, 5)) == pytest.approx(31.0)

    def test_prefill_and_decode_tokens_cost_the_same_flops(self) -> None:
        assert TOY.step_time(StepWork(20, 10, 0)) == TOY.step_time(StepWork(10, 20, 0))

    def test_defaults_are_llama2_7b_on_h100(self) -> None:
        model = CostModel()
        # 13.48 GB / 3.35 TB/s = 4.024 ms floor, + 32,000 KV tokens * 0.5 MiB / 3.35 TB/s.
        decode = model.step_time(StepWork(0, 32, 32_000))
        assert decode == pytest.approx(13.48e9 / 3.35e12 + 32_000 * 524_288 / 3.35e12)
        assert decode * 1000 == pytest.approx(9.032, abs=1e-3)
        # A 4096-token prefill is compute bound: 4096 * 13.48 GFLOP / 989 TFLOP/s = 55.8 ms.
        prefill = model.step_time(StepWork(4096, 0, 4096))
        assert prefill * 1000 == pytest.approx(55.83 + 0.641, abs=0.01)

    def test_default_num_blocks_fill_memory_the_weights_leave(self) -> None:
        # (80 GB * 0.9 - 13.48 GB) / (524,288 B * 16) = 6976.1
        assert CostModel().default_num_blocks(16) == 6976

    def test_an_absurd_kv_size_is_refused_before_building_a_huge_pool(self) -> None:
        with pytest.raises(CostModelError, match="set num_blocks yourself") as err:
            CostModel(kv_bytes_per_token=1e-3).default_num_blocks(16)
        assert err.value.field == "kv_bytes_per_token"

    def test_weights_too_big_for_memory_name_the_field(self) -> None:
        with pytest.raises(CostModelError, match="weight_bytes") as err:
            CostModel(weight_bytes=90e9).default_num_blocks(16)
        assert err.value.field == "weight_bytes"


class TestValidation:
    @pytest.mark.parametrize(
        ("field", "value", "bound"),
        [
            ("hbm_bandwidth", 0, "> 0"),
            ("peak_flops", -1.0, "> 0"),
            ("kv_bytes_per_token", math.nan, "finite"),
            ("weight_bytes", True, "a number"),
            ("flops_per_token", "7e9", "a number"),
            ("step_overhead_s", -0.001, ">= 0"),
            ("gpu_memory_utilization", 1.5, "<= 1"),
        ],
    )
    def test_bad_field_names_itself_and_the_bound(
        self, field: str, value: object, bound: str
    ) -> None:
        with pytest.raises(CostModelError, match=bound) as err:
            CostModel(**{field: value})  # type: ignore[arg-type]
        assert err.value.field == field

    def test_zero_overhead_is_allowed(self) -> None:
        assert CostModel(step_overhead_s=0).step_overhead_s == 0

    def test_with_fields_names_unknown_and_bad_fields(self) -> None:
        with pytest.raises(CostModelError, match="--cost: unknown cost-model field") as err:
            CostModel().with_fields({"bandwidth": 1}, "--cost")
        assert err.value.field == "bandwidth"
        with pytest.raises(CostModelError, match="--cost: must be > 0") as err:
            CostModel().with_fields({"peak_flops": 0}, "--cost")
        assert err.value.field == "peak_flops"
        assert CostModel().with_fields({"peak_flops": 500e12}, "--cost").peak_flops == 500e12


class TestFromJson:
    def test_fields_replace_the_defaults(self, tmp_path: Path) -> None:
        path = tmp_path / "a100.json"
        path.write_text(json.dumps({"hbm_bandwidth": 2.039e12, "peak_flops": 312e12}))
        model = CostModel.from_json(path)
        assert (model.hbm_bandwidth, model.peak_flops) == (2.039e12, 312e12)
        assert model.weight_bytes == CostModel().weight_bytes

    @pytest.mark.parametrize(
        ("text", "field", "message"),
        [
            ("[1, 2]", "cost_json", "expected a JSON object"),
            ("{not json", "cost_json", "Expecting property name"),
            ('{"peak_flops": -3}', "peak_flops", "must be > 0"),
            ('{"flops": 3}', "flops", "unknown cost-model field"),
        ],
    )
    def test_bad_file_names_the_field(
        self, tmp_path: Path, text: str, field: str, message: str
    ) -> None:
        path = tmp_path / "cost.json"
        path.write_text(text)
        with pytest.raises(CostModelError, match=message) as err:
            CostModel.from_json(path)
        assert err.value.field == field
        assert str(path) in str(err.value)
