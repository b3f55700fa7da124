"""Engines by name (engines/registry.py), the profiles an engine claims
(engines/profiles.py) and optional dependencies (engines/dependencies.py)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.engines.dependencies import (
    CROSSHAIR,
    TORCH,
    VLLM,
    MissingDependencyError,
    OptionalDependency,
    require,
)
from schedspec.engines.profiles import (
    PROBE_CONFIG,
    ProfileError,
    choose_profile,
    claimed_profiles,
    probe_profiles,
)
from schedspec.engines.registry import (
    ENGINE_FORMS,
    ENGINES,
    NamedEngine,
    default_configs,
    load_config_strategy,
    load_engine_factory,
    named_engine,
)
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile
from tests.broken_engines import profileless, safety_only

PRESENT = OptionalDependency("json", "json", "it ships with Python")
BOTH: frozenset[Profile] = frozenset({"safety", "vllm-v1"})
SAFETY: frozenset[Profile] = frozenset({"safety"})


class TestNames:
    def test_the_forms_list_every_registered_name(self) -> None:
        assert ENGINE_FORMS == "'reference', 'gpu', 'vllm', 'sglang', or module:factory"
        assert list(ENGINES) == ["reference", "gpu", "vllm", "sglang"]

    def test_a_name_or_its_factory_path_is_the_registered_engine(self) -> None:
        vllm = ENGINES["vllm"]
        assert named_engine("vllm") is vllm
        assert named_engine("schedspec.adapters.vllm.engine:VllmEngine") is vllm
        assert named_engine("tests.broken_engines:wrong_total") is None

    def test_reference_loads_without_any_optional_dependency(self) -> None:
        assert load_engine_factory("reference") is reference_engine
        assert ENGINES["reference"].needs == ()

    def test_module_factory_still_loads(self) -> None:
        assert load_engine_factory("tests.broken_engines:safety_only") is safety_only

    @pytest.mark.parametrize(
        ("name", "message"),
        [
            (
                "nope",
                "engine: expected 'reference', 'gpu', 'vllm', 'sglang', or module:factory, "
                "got 'nope'",
            ),
            ("no_such_module_x:f", "engine: cannot import 'no_such_module_x'"),
            ("tests.broken_engines:NOT_A_FACTORY", "has no callable 'NOT_A_FACTORY'"),
        ],
    )
    def test_a_bad_name_is_refused_naming_the_forms(self, name: str, message: str) -> None:
        with pytest.raises(ValueError, match="engine: ") as caught:
            load_engine_factory(name)
        assert message in str(caught.value)


class TestDefaultConfigs:
    def test_vllm_runs_on_its_own_configs_the_reference_and_gpu_on_the_suites(self) -> None:
        vllm = "schedspec.properties.strategies.engine_configs:vllm_default_configs"
        assert default_configs(("vllm",)) == vllm
        assert default_configs(("reference", "vllm")) == vllm  # a diff against it
        # gpu_impl runs the suite's own, both releases' knobs included.
        assert default_configs(("gpu",)) is None
        assert default_configs(("reference", "gpu")) is None
        assert default_configs(("reference",)) is None
        assert default_configs(("tests.broken_engines:wrong_total",)) is None

    @given(data=st.data())
    def test_vllms_default_configs_pad_exactly_when_they_speculate(
        self, data: st.DataObject
    ) -> None:
        name = default_configs(("vllm",))
        assert name is not None
        config = data.draw(load_config_strategy(name))
        assert isinstance(config, SchedulerConfig)
        assert config.pad_spec_decode == (config.num_speculative_tokens > 0)

    def test_engines_with_different_defaults_need_a_choice(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        other = NamedEngine("other", "tests.broken_engines:safety_only", configs="x:y")
        monkeypatch.setitem(ENGINES, "other", other)
        with pytest.raises(ValueError, match=r"configs: the engines run on different default"):
            default_configs(("vllm", "other"))


class TestDependencies:
    @pytest.mark.parametrize(
        ("dependency", "names"),
        [
            (TORCH, ["pip install 'torch", "schedspec install torch-cpu"]),
            (VLLM, ["schedspec install vllm"]),
            (CROSSHAIR, ["pip install 'crosshair-tool"]),
        ],
    )
    def test_a_missing_one_names_what_brings_it(
        self, dependency: OptionalDependency, names: list[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, dependency.module, None)  # `import` of it fails
        assert dependency.missing()
        with pytest.raises(MissingDependencyError) as caught:
            require("--flag", PRESENT, dependency)  # the first one missing is named
        message = str(caught.value)
        assert message.startswith(f"--flag needs {dependency.name}, which is not installed here: ")
        assert all(name in message for name in names)

    def test_present_ones_pass(self) -> None:
        require("nothing", PRESENT)

    def test_a_missing_engine_dependency_is_a_value_error_before_any_import(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "torch", None)
        with pytest.raises(ValueError, match=r"engine 'gpu' needs torch.*install torch-cpu"):
            load_engine_factory("gpu")
        monkeypatch.setitem(sys.modules, "vllm", None)
        with pytest.raises(ValueError, match=r"engine 'vllm' needs vLLM.*schedspec install vllm"):
            load_engine_factory("schedspec.adapters.vllm.engine:VllmEngine")


class TestProfiles:
    def test_the_default_is_vllm_v1_when_every_engine_claims_it(self) -> None:
        assert choose_profile([BOTH], None) == "vllm-v1"
        assert choose_profile([BOTH, SAFETY], None, ("left", "right")) == "safety"
        assert choose_profile([BOTH], "safety") == "safety"

    def test_a_profile_not_claimed_is_refused_naming_the_side(self) -> None:
        with pytest.raises(ProfileError, match=r"^profile: the engine claims \['safety'\], not "):
            choose_profile([SAFETY], "vllm-v1")
        with pytest.raises(ProfileError, match=r"^profile: the right engine claims") as caught:
            choose_profile([BOTH, SAFETY], "vllm-v1", ("left", "right"))
        assert caught.value.field == "profile"

    def test_an_adapter_without_profiles_is_refused_naming_the_attribute(self) -> None:
        with pytest.raises(ProfileError) as caught:
            claimed_profiles(profileless(PROBE_CONFIG))
        assert caught.value.field == "profiles"
        assert "ProfilelessEngine has no `profiles` attribute" in str(caught.value)
        assert "profiles = frozenset({'safety'})" in str(caught.value)

    def test_profiles_outside_the_catalogue_are_refused(self) -> None:
        class Typo:
            profiles = frozenset({"vllm"})

        with pytest.raises(ProfileError, match=r"claims frozenset\(\{'vllm'\}\): expected a non"):
            claimed_profiles(Typo())

    def test_an_adapter_claiming_no_profile_is_refused(self) -> None:
        """An empty claim used to reach the run and fail it as an engine error (exit 4)."""

        class Modest:
            profiles: frozenset[str] = frozenset()

        with pytest.raises(ProfileError, match="expected a non-empty set") as caught:
            claimed_profiles(Modest())
        assert caught.value.field == "profiles"

    def test_probing_builds_the_engine_at_the_probe_config(self) -> None:
        assert probe_profiles(safety_only) == frozenset({"safety"})
        assert probe_profiles(reference_engine) == frozenset({"safety", "vllm-v1"})
