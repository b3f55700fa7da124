"""The probe that scripts/install_vllm.sh trusts (schedspec.properties.probe, on the plan
adapters/vllm/probe.py declares): it builds and steps a real VllmEngine for every config
family, with empty caches, quietly; and it names what fails."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedspec.adapters.reference import ReferenceEngine
from schedspec.adapters.vllm.config import unsupported_reason
from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.adapters.vllm.probe import CACHE_VARIABLES, FAMILIES, PLAN, Family
from schedspec.adapters.vllm.releases import current_release, describe_installed
from schedspec.adapters.vllm.runtime import VLLM_LOGGING_VARIABLES
from schedspec.properties import probe as runner
from schedspec.properties.probe import ProbeError, empty_caches, step_family
from schedspec.spec import RequestOutput, SchedulerOutput
from tests.vllm_required import require_vllm

REPO = Path(__file__).resolve().parent.parent


def test_the_families_are_every_drafter_policy_caching_and_mode_combination() -> None:
    combinations = {(f.drafter, f.policy, f.prefix_caching, f.async_scheduling) for f in FAMILIES}
    assert len(FAMILIES) == len(combinations) == 24
    assert combinations == set(
        itertools.product(
            ("none", "ngram", "eagle"), ("fcfs", "priority"), (False, True), (False, True)
        )
    )
    # Each one is a config the adapter runs as stated (nothing made expressible).
    assert [unsupported_reason(f.config()) for f in FAMILIES] == [None] * 24


def test_each_drafter_is_the_config_the_adapter_maps_to_it() -> None:
    none, ngram, eagle = (Family(d, "priority", True).config() for d in ("none", "ngram", "eagle"))
    assert (none.num_speculative_tokens, none.lookahead_tokens) == (0, 0)
    # vLLM's n-gram drafter reserves no lookahead slots; its EAGLE drafter one per draft.
    assert (ngram.num_speculative_tokens, ngram.lookahead_tokens) == (2, 0)
    assert (eagle.num_speculative_tokens, eagle.lookahead_tokens) == (2, 2)
    assert (eagle.policy, eagle.enable_prefix_caching) == ("priority", True)
    # vLLM pads whenever it speculates.
    assert (none.pad_spec_decode, ngram.pad_spec_decode, eagle.pad_spec_decode) == (
        False,
        True,
        True,
    )


def test_each_family_has_the_installed_releases_knobs() -> None:
    release = current_release()
    configs = [f.config() for f in FAMILIES]
    assert all(release.knobs(c) == c for c in configs)
    # Cache-aware admission where the release has it and prefix caching is on.
    windows = {c.cache_aware_admission_window for c in configs if c.enable_prefix_caching}
    assert windows == ({4} if release.cache_aware_admission else {0})


def test_the_plan_is_the_vllm_engine_on_its_families_and_caches() -> None:
    # Named for the release installed ("vLLM 0.34.0"), so its lines say which one.
    assert PLAN.engine == describe_installed()
    assert (PLAN.build, PLAN.built) == (VllmEngine, "VllmEngines")
    assert (PLAN.families, PLAN.cache_variables) == (FAMILIES, CACHE_VARIABLES)
    assert runner.PLANS["vllm"] is PLAN


def test_step_family_runs_the_requests_to_the_end() -> None:
    # The reference makes vLLM's decisions, so it takes the steps vLLM takes: 42 and 41
    # prompt tokens over a 64-token budget are two steps of prefill (one with a 32-token
    # prefix-cache hit), then decodes, fewer of them with accepted drafts. Async
    # scheduling schedules two steps more: the one scheduled while the last step that
    # samples is in flight, and the one after that, which finds nothing more to do.
    steps = {str(f): step_family(ReferenceEngine, f) for f in FAMILIES}
    assert steps["drafter=none, policy=fcfs, prefix caching off, sync"] == 4
    assert steps["drafter=none, policy=fcfs, prefix caching off, async"] == 6
    assert steps["drafter=none, policy=fcfs, prefix caching on, sync"] == 3
    assert steps["drafter=eagle, policy=priority, prefix caching on, sync"] == 2
    assert steps["drafter=eagle, policy=priority, prefix caching on, async"] == 4
    assert sorted(steps.values()) == [2] * 4 + [3] * 6 + [4] * 6 + [5] * 6 + [6] * 2


class _NeverSchedules(ReferenceEngine):
    def schedule(self) -> SchedulerOutput:
        return SchedulerOutput((), (), {}, 0, {}, frozenset(), frozenset())

    def update_from_output(self, *args: object) -> dict[str, RequestOutput]:
        return {}  # nothing was scheduled


def test_requests_left_unfinished_are_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="drafter=none, policy=fcfs, prefix caching off, sync: "):
        step_family(_NeverSchedules, FAMILIES[0])


def test_a_failing_family_is_named_and_the_probe_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def eagle_breaks(build: object, family: Family) -> int:
        if family.drafter == "eagle":
            raise ValueError("Model architectures ['EagleLlamaForCausalLM'] failed")
        return 3

    monkeypatch.setattr(runner, "step_family", eagle_breaks)
    assert runner.main(["vllm"]) == 1
    printed = capsys.readouterr()
    assert (
        "ProbeError: drafter=eagle, policy=fcfs, prefix caching off, sync: ValueError: "
        "Model architectures ['EagleLlamaForCausalLM'] failed"
    ) in printed.err
    assert printed.out.startswith(f"{describe_installed()} probe: FAILED")


@pytest.mark.parametrize("argv", [[], ["vllm", "sglang"], ["nope"]])
def test_a_command_line_naming_no_engine_is_refused_with_the_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main(argv) == 2
    printed = capsys.readouterr()
    assert (printed.out, printed.err) == (
        "",
        "usage: python -m schedspec.properties.probe {vllm,sglang}\n",
    )


def test_empty_caches_gives_each_variable_a_new_empty_folder_then_restores_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/home/someone/.cache/vllm")
    monkeypatch.delenv("HF_HOME", raising=False)
    with empty_caches(CACHE_VARIABLES, "schedspec-test-") as root:
        folders = [Path(os.environ[name]) for name in CACHE_VARIABLES]
        assert len(set(folders)) == len(CACHE_VARIABLES)
        for folder in folders:
            assert folder.parent == Path(root)
            assert folder.is_dir()
            assert list(folder.iterdir()) == []
    assert os.environ["VLLM_CACHE_ROOT"] == "/home/someone/.cache/vllm"
    assert "HF_HOME" not in os.environ
    assert not Path(root).exists()


def test_the_probe_passes_here_quietly_and_leaves_the_users_caches_alone(tmp_path: Path) -> None:
    require_vllm("the vLLM probe")
    user = tmp_path / "user"  # where the user's caches would be: the probe must not use them
    env = {name: value for name, value in os.environ.items() if name not in VLLM_LOGGING_VARIABLES}
    env |= {name: str(user / name.lower()) for name in CACHE_VARIABLES}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "-m", "schedspec.properties.probe", "vllm"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(
        f"{describe_installed()} probe: built and stepped 24 VllmEngines"
    )
    # Not a line of vLLM's config warnings, nor torch's "Triton not available".
    assert result.stderr == ""
    assert not user.exists()
