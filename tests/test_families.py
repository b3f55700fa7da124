"""Policy families: the config knobs each family owns, the profiles that pin a family's
decisions, and how a run picks the family its engines follow (docs/SPEC.md, "Two
families")."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner
from hypothesis import given, settings

from schedspec.cli.main import main
from schedspec.engines.profiles import (
    PROBE_CONFIG,
    ProfileError,
    choose_profile,
    claimed_profiles,
    default_profile,
    probe_config,
)
from schedspec.engines.registry import run_family
from schedspec.properties.strategies.configs import family_configs, sglang_configs
from schedspec.reference import Scheduler
from schedspec.spec import ConfigError, SchedulerConfig, SGLangState, State
from schedspec.spec.invariants import (
    CATALOGUE,
    FAMILY_PROFILES,
    InvariantInfo,
    Profile,
    family_of,
    in_profile,
)
from schedspec.traces.trace import VERSION, Trace, TraceError

SGLANG = SchedulerConfig(
    family="sglang",
    block_size=1,
    num_blocks=64,
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=32,
)


class TestConfigKnobs:
    def test_sglang_family_takes_its_own_knobs(self) -> None:
        config = replace(SGLANG, schedule_conservativeness=0.1, enable_mixed_chunk=True)
        assert (config.family, config.schedule_conservativeness) == ("sglang", 0.1)
        assert config.enable_mixed_chunk and config.lookahead_tokens == 0

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("watermark", 0.1),
            ("long_prefill_token_threshold", 4),
            ("policy", "priority"),
            ("num_speculative_tokens", 2),
            ("num_lookahead_tokens", 1),
        ],
    )
    def test_sglang_refuses_a_vllm_knob_naming_it(self, field: str, value: object) -> None:
        with pytest.raises(ConfigError, match="is not a knob of family 'sglang'") as err:
            replace(SGLANG, **cast("dict[str, Any]", {field: value}))
        assert err.value.field == field

    @pytest.mark.parametrize(
        ("field", "value"), [("schedule_conservativeness", 0.5), ("enable_mixed_chunk", True)]
    )
    def test_vllm_refuses_an_sglang_knob_naming_it(self, field: str, value: object) -> None:
        with pytest.raises(ConfigError, match="is not a knob of family 'vllm'") as err:
            replace(PROBE_CONFIG, **cast("dict[str, Any]", {field: value}))
        assert err.value.field == field

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("family", "trt", r"must be one of \('vllm', 'sglang'\), got 'trt'"),
            ("schedule_conservativeness", 0.0, r"must be in \(0, 100\], got 0.0"),
            ("schedule_conservativeness", 101, r"must be in \(0, 100\], got 101"),
            ("schedule_conservativeness", True, "must be a float, got True"),
            ("schedule_conservativeness", "1", "must be a float, got '1'"),
            ("enable_mixed_chunk", 1, "must be a bool, got 1"),
        ],
    )
    def test_bad_values_name_the_field_and_bound(
        self, field: str, value: object, message: str
    ) -> None:
        with pytest.raises(ConfigError, match=message) as err:
            replace(SGLANG, **cast("dict[str, Any]", {field: value}))
        assert err.value.field == field

    @settings(max_examples=50, deadline=None)
    @given(sglang_configs())
    def test_the_suite_draws_valid_sglang_configs(self, config: SchedulerConfig) -> None:
        assert config.family == "sglang" and config.watermark == 0.0
        assert config.num_speculative_tokens == 0 and config.policy == "fcfs"
        assert not config.enable_mixed_chunk or config.enable_chunked_prefill


class TestProfiles:
    def test_a_family_profile_is_safety_plus_its_own(self) -> None:
        sglang_only = InvariantInfo("X", "schedule", "sglang", "x")
        vllm_only = InvariantInfo("Y", "schedule", "vllm-v1", "y")
        safety = InvariantInfo("Z", "state", "safety", "z")
        assert [in_profile(sglang_only, p) for p in ("safety", "vllm-v1", "sglang")] == [
            False, False, True,
        ]  # fmt: skip
        assert [in_profile(vllm_only, p) for p in ("safety", "vllm-v1", "sglang")] == [
            False, True, False,
        ]  # fmt: skip
        assert all(in_profile(safety, p) for p in ("safety", "vllm-v1", "sglang"))

    def test_every_catalogued_invariant_names_a_known_profile(self) -> None:
        assert {i.profile for i in CATALOGUE.values()} <= {"safety", *FAMILY_PROFILES.values()}

    def test_the_family_of_a_profile(self) -> None:
        assert [family_of(p) for p in ("safety", "vllm-v1", "sglang")] == [None, "vllm", "sglang"]

    def test_an_engine_claims_at_most_one_family_profile(self) -> None:
        class Greedy:
            profiles = frozenset({"safety", "vllm-v1", "sglang"})

        with pytest.raises(ProfileError, match="at most one family's policy") as err:
            claimed_profiles(Greedy())
        assert err.value.field == "profiles"

    def test_the_default_is_the_family_profile_claimed(self) -> None:
        sglang: frozenset[Profile] = frozenset({"safety", "sglang"})
        assert default_profile(sglang) == "sglang"
        assert default_profile(frozenset({"safety"})) == "safety"
        assert choose_profile([sglang], None) == "sglang"
        # Two engines of different families share only safety.
        assert choose_profile([sglang, frozenset({"safety", "vllm-v1"})], None) == "safety"

    def test_a_config_shows_the_fields_of_its_family(self) -> None:
        assert "family" not in PROBE_CONFIG.own_fields()
        assert "schedule_conservativeness" not in PROBE_CONFIG.own_fields()
        shown = SGLANG.own_fields()
        assert shown["family"] == "sglang" and "enable_mixed_chunk" in shown
        assert "watermark" not in shown and "num_speculative_tokens" not in shown

    def test_the_probe_config_takes_the_family(self) -> None:
        assert probe_config("vllm") is PROBE_CONFIG
        sglang = probe_config("sglang")
        assert sglang.family == "sglang" and sglang.max_model_len == 8


class TestRunFamily:
    def test_a_family_profile_picks_the_family(self) -> None:
        assert run_family(["my_module:factory"], "sglang") == "sglang"
        assert run_family(["reference"], "vllm-v1") == "vllm"

    def test_without_one_the_engines_default_family(self) -> None:
        assert run_family(["reference"]) == "vllm"
        assert run_family(["my_module:factory"], "safety") == "vllm"

    def test_an_engine_that_does_not_follow_the_family_is_refused(self) -> None:
        with pytest.raises(ProfileError, match="engine 'vllm' follows family 'vllm', not") as err:
            run_family(["vllm"], "sglang")
        assert err.value.field == "profile"

    @settings(max_examples=20, deadline=None)
    @given(family_configs("sglang"), family_configs("vllm"))
    def test_each_family_draws_its_own_configs(
        self, sglang: SchedulerConfig, vllm: SchedulerConfig
    ) -> None:
        assert (sglang.family, vllm.family) == ("sglang", "vllm")


class TestEnginesRefuseAnotherFamily:
    def test_the_reference_names_the_field(self) -> None:
        with pytest.raises(ConfigError, match="follows family 'vllm', not 'sglang'") as err:
            Scheduler(SGLANG)
        assert err.value.field == "family"

    def test_gpu_impl_names_the_field(self) -> None:
        pytest.importorskip("torch")
        from schedspec.gpu_impl.engine import BatchedScheduler

        with pytest.raises(ConfigError, match="gpu_impl follows family 'vllm'"):
            BatchedScheduler(SGLANG)


class TestStateAndTraces:
    def test_the_state_carries_sglang_policy_state_only_when_given(self) -> None:
        state = Scheduler(PROBE_CONFIG).snapshot()
        assert isinstance(state, State) and state.sglang is None
        extra = SGLangState(
            new_token_ratio=0.7, batch_is_full=False, chunked_request_id=None, last_batch_kind=None
        )
        assert replace(state, sglang=extra).sglang == extra

    def test_a_trace_keeps_the_family(self, tmp_path: Path) -> None:
        path = tmp_path / "t.json"
        Trace(config=replace(SGLANG, schedule_conservativeness=0.3), events=()).save(path)
        document = json.loads(path.read_text())
        assert document["version"] == VERSION
        loaded = Trace.load(path)
        assert loaded.config.family == "sglang"
        assert loaded.config.schedule_conservativeness == 0.3

    @pytest.mark.parametrize("version", [1, 2])
    def test_an_older_trace_cannot_name_a_family(self, tmp_path: Path, version: int) -> None:
        path = tmp_path / "t.json"
        Trace(config=PROBE_CONFIG, events=()).save(path)
        document = json.loads(path.read_text())
        document["version"] = version
        for field in ("async_scheduling", "pad_spec_decode"):
            if version == 1:
                del document["config"][field]
        path.write_text(json.dumps(document))
        with pytest.raises(TraceError, match=f"config.family: not a field of version {version}"):
            Trace.load(path)


class TestCommands:
    @pytest.mark.parametrize(
        "args",
        [
            ["check", "--engine", "gpu", "--profile", "sglang"],
            ["diff", "--left", "reference", "--right", "gpu", "--profile", "sglang"],
        ],
    )
    def test_a_profile_of_a_family_the_engine_does_not_follow_is_a_usage_error(
        self, args: list[str]
    ) -> None:
        result = CliRunner().invoke(main, [*args, "--examples", "1"])
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--profile'" in result.output
        assert "follows family 'vllm', not 'sglang'" in result.output

    def test_the_reference_runs_in_sglang_family_under_its_profile(self) -> None:
        result = CliRunner().invoke(
            main, ["check", "--engine", "reference", "--profile", "sglang", "--examples", "20"]
        )
        assert result.exit_code == 0, result.output
        assert "checking reference against profile sglang" in result.output
        assert "SG-ADMISSION" in result.output and "GREEDY-BUDGET" not in result.output
