"""The run plan (properties/run_plan.py): what a user names, resolved into what runs.

Worked examples of a plan resolved for `check` (one engine) and for `diff` (a pair),
the steps the commands take one by one giving the same plan, and each refusal naming
the request's field at fault (which the command line turns into its flag, the pytest
plugin into its option)."""

from __future__ import annotations

import dataclasses
import socket
import sys

import pytest

from schedspec.adapters.reference import reference_engine
from schedspec.campaign.backend import open_backend, require_backend
from schedspec.campaign.chunk_work import NamedEngines
from schedspec.engines.dependencies import MissingDependencyError
from schedspec.engines.protocol import EngineFactory
from schedspec.properties.run_plan import (
    ENGINES_FIELD,
    BackendChoice,
    EngineNamed,
    RunPlanError,
    RunRequest,
    choose_run_profile,
    complete_plan,
    configs_of,
    engine_pair,
    load_engines,
    one_engine,
    resolve_plan,
    run_family_of,
)
from schedspec.properties.suite import SuiteSettings
from schedspec.spec import SchedulerConfig
from tests.broken_engines import safety_only
from tests.ray_required import require_ray

BROKEN = "tests.broken_engines"


def test_a_plan_for_check_takes_what_the_engine_claims() -> None:
    plan = resolve_plan(RunRequest(engines=one_engine("reference"), seed=3))
    assert plan.factories == (reference_engine,)
    # The reference follows vLLM's family by default, and claims its exact decisions.
    assert (plan.family, plan.profile) == ("vllm", "vllm-v1")
    assert (plan.configs, plan.config_strategy) == (None, None)  # the suite's own
    assert (plan.seed, plan.seed_drawn) == (3, False)
    assert plan.settings == dataclasses.replace(SuiteSettings.quick(), seed=3)
    recipe = NamedEngines.of_plan(plan, step_timeout=5.0)
    assert recipe == NamedEngines("check", ("reference",), "vllm-v1", None, 5.0)


def test_a_plan_for_diff_checks_the_profile_both_claim() -> None:
    request = RunRequest(
        engines=engine_pair("reference", f"{BROKEN}:safety_only"),
        configs="tests.test_configs_option:only_fcfs",
        seed=4,
        examples=7,
        max_steps=9,
        shrink=False,
    )
    plan = resolve_plan(request)
    assert plan.factories[1] is safety_only
    assert plan.profile == "safety"  # the left claims vllm-v1 too, the right only safety
    assert plan.configs == "tests.test_configs_option:only_fcfs"
    assert plan.config_strategy is not None
    settings = plan.settings
    assert (settings.examples, settings.rules_per_example, settings.shrink) == (7, 9, False)
    recipe = NamedEngines.of_plan(plan, compare_block_ids=True)
    assert (recipe.command, recipe.engines) == ("diff", request.names)
    assert recipe.compare_block_ids


def test_a_family_profile_picks_the_family_the_engines_run_in() -> None:
    plan = resolve_plan(RunRequest(engines=engine_pair("reference", "reference"), profile="sglang"))
    assert (plan.family, plan.profile) == ("sglang", "sglang")


def test_no_seed_given_draws_one_to_show_before_the_run() -> None:
    plan = resolve_plan(RunRequest(engines=one_engine("reference")))
    assert plan.seed_drawn and 0 <= plan.seed < 2**32
    assert plan.settings.seed == plan.seed


def test_the_long_profile_from_the_request_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    long_run = resolve_plan(RunRequest(engines=one_engine("reference"), long=True, seed=1))
    assert long_run.settings == dataclasses.replace(SuiteSettings.long(), seed=1)
    monkeypatch.setenv("SCHEDSPEC_LONG", "1")
    quick_run = resolve_plan(RunRequest(engines=one_engine("reference"), seed=1))
    assert quick_run.settings == long_run.settings


def test_the_steps_in_turn_give_the_plan_resolve_plan_gives() -> None:
    request = RunRequest(engines=one_engine(f"{BROKEN}:safety_only"), seed=5)
    factories = load_engines(request)
    chosen = choose_run_profile(request, factories)
    assert tuple(chosen)[:2] == ("vllm", "safety")
    assert complete_plan(request, factories, chosen) == resolve_plan(request)


def test_a_plan_is_frozen() -> None:
    plan = resolve_plan(RunRequest(engines=one_engine("reference"), seed=1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.profile = "safety"  # type: ignore[misc]


def test_the_backend_runs_in_parallel_with_workers_ray_or_a_time_budget() -> None:
    assert not BackendChoice().parallel
    assert not BackendChoice(workers=1).parallel
    assert BackendChoice(workers=2).parallel
    assert BackendChoice(ray="local").parallel
    assert BackendChoice(duration=5.0).parallel


# ----------------------------------------------------------------- refusals


def refusal(request: RunRequest, factories: tuple[EngineFactory, ...] | None = None) -> str:
    """The field a refusal to plan the request names, after checking its message."""
    with pytest.raises(RunPlanError) as caught:
        resolve_plan(request, factories)
    assert str(caught.value)
    return caught.value.field


@pytest.mark.parametrize(
    ("engines", "field"),
    [
        (one_engine(f"{BROKEN}:nothing_here"), "engine"),
        (one_engine(f"{BROKEN}:NOT_A_FACTORY"), "engine"),
        (one_engine("no-colon"), "engine"),
        (engine_pair("reference", "no_such_module:factory"), "right"),
        (engine_pair("no_such_module:factory", "reference"), "left"),
    ],
)
def test_an_engine_that_does_not_load_is_refused_on_its_field(
    engines: tuple[EngineNamed, ...], field: str
) -> None:
    assert refusal(RunRequest(engines=engines)) == field


def test_an_adapter_that_declares_no_profiles_is_refused_on_its_field() -> None:
    request = RunRequest(engines=engine_pair("reference", f"{BROKEN}:profileless"))
    with pytest.raises(RunPlanError, match="profiles: the adapter ProfilelessEngine") as caught:
        resolve_plan(request)
    assert caught.value.field == "right"


def test_a_profile_an_engine_does_not_claim_is_refused_on_profile() -> None:
    check = RunRequest(engines=one_engine(f"{BROKEN}:safety_only"), profile="vllm-v1")
    assert refusal(check) == "profile"
    pair = RunRequest(engines=engine_pair("reference", f"{BROKEN}:safety_only"), profile="vllm-v1")
    with pytest.raises(RunPlanError, match="the right engine claims") as caught:
        resolve_plan(pair)
    assert caught.value.field == "profile"


def test_a_family_a_registered_engine_does_not_follow_is_refused_on_profile() -> None:
    with pytest.raises(RunPlanError, match="engine 'gpu' follows family 'vllm'") as caught:
        run_family_of(RunRequest(engines=one_engine("gpu"), profile="sglang"))
    assert caught.value.field == "profile"


def test_engines_without_a_family_in_common_are_refused_on_no_one_field() -> None:
    with pytest.raises(RunPlanError, match="follow no policy family in common") as caught:
        run_family_of(RunRequest(engines=engine_pair("gpu", "sglang")))
    assert caught.value.field == ENGINES_FIELD


def test_configs_that_do_not_load_are_refused_on_configs() -> None:
    request = RunRequest(engines=one_engine("reference"), configs="nope")
    with pytest.raises(RunPlanError, match="expected 'module:strategy'") as caught:
        resolve_plan(request)
    assert (caught.value.field, caught.value.needs_choice) == ("configs", False)


def test_engines_with_different_default_configs_need_configs_given() -> None:
    with pytest.raises(RunPlanError, match="different default configs") as caught:
        configs_of(RunRequest(engines=engine_pair("vllm", "sglang")))
    assert (caught.value.field, caught.value.needs_choice) == ("configs", True)
    given = RunRequest(engines=engine_pair("vllm", "sglang"), configs="m:s")
    assert configs_of(given) == "m:s"


def test_an_engine_that_needs_a_missing_dependency_is_refused_on_its_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails here
    with pytest.raises(RunPlanError, match="engine 'gpu' needs torch") as caught:
        load_engines(RunRequest(engines=engine_pair("reference", "gpu")))
    assert caught.value.field == "right"
    assert isinstance(caught.value.__cause__, MissingDependencyError)


def test_an_engine_that_fails_to_build_is_its_own_failure_not_a_refusal() -> None:
    def broken(config: SchedulerConfig) -> object:
        raise RuntimeError("planted: the engine cannot be built")

    request = RunRequest(engines=one_engine("mine:broken"))
    with pytest.raises(RuntimeError, match="planted"):
        resolve_plan(request, (broken,))  # type: ignore[arg-type]


def test_a_backend_on_ray_needs_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    require_backend(BackendChoice(workers=2))  # forked workers need nothing
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match="--ray needs Ray"):
        require_backend(BackendChoice(ray="local"))


def test_a_cluster_address_that_does_not_answer_is_refused_on_ray() -> None:
    require_ray("opening a backend at a Ray address")
    with socket.socket() as probe:  # a port just freed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = open_backend(BackendChoice(ray=f"127.0.0.1:{port}"))
    with pytest.raises(RunPlanError, match="no Ray cluster answers") as caught, backend:
        pass
    assert caught.value.field == "ray"
