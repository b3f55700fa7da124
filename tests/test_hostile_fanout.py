"""Hostile fan-outs: --workers, --instances and --duration past their named bounds
(campaign/bounds.py, cli/options.MAX_DURATION_SECONDS) are usage errors naming the option
and the bound, before anything is forked, started or allocated."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedspec.adapters.gpu import DEVICE_ENV
from schedspec.campaign import bounds
from schedspec.campaign.bounds import (
    MAX_CLUSTER_WORKERS,
    MAX_SWARM_INSTANCES,
    WORKER_MEMORY_BYTES,
    local_workers_bound,
)
from schedspec.properties.run_plan import RunPlanError
from tests.hostile import assert_refused, probe


@pytest.mark.parametrize(
    ("args", "flag", "phrase"),
    [
        (["check", "--workers", "1000000000", "--duration", "5s"], "--workers", "per core"),
        (["check", "--workers", str(10**30)], "--workers", "a 31-digit number"),
        (["diff", "--right", "reference", "--workers", "100000"], "--workers", "per core"),
        (
            ["check", "--workers", "5000", "--ray", "127.0.0.1:1"],
            "--workers",
            f"at most {MAX_CLUSTER_WORKERS:,} (tasks at a time on a Ray cluster)",
        ),
        (["check", "--engine", "gpu", "--instances", "100000000"], "--instances", "65,536"),
        (["check", "--engine", "gpu", "--instances", str(10**30)], "--instances", "digit"),
        (["check", "--duration", "8d"], "--duration", "at most 7d"),
        (["check", "--duration", "0s"], "--duration", "more than 0 s"),
    ],
)
def test_a_fan_out_past_its_bound_is_a_usage_error(args: list[str], flag: str, phrase: str) -> None:
    result = probe(*args)
    assert_refused(result, 2, f"Invalid value for '{flag}'", phrase)
    assert "checking" not in result.stdout and "swarm:" not in result.stdout


def test_the_workers_bound_follows_cores_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "usable_cores", lambda: 16)
    monkeypatch.setattr(bounds, "machine_memory", lambda: 2**40)
    assert local_workers_bound().most == 64  # 4 per core
    monkeypatch.setattr(bounds, "usable_cores", lambda: 1)
    assert local_workers_bound().most == 8  # never below MIN_WORKERS_BOUND
    monkeypatch.setattr(bounds, "machine_memory", lambda: 3 * WORKER_MEMORY_BYTES)
    bound = local_workers_bound()
    assert (bound.most, bound.field) == (3, "workers") and "MiB" in bound.reason


def test_a_bound_names_its_field_and_takes_its_limit() -> None:
    bound = local_workers_bound()
    bound.check(bound.most)  # the bound itself is allowed
    with pytest.raises(RunPlanError, match="at most") as caught:
        bound.check(bound.most + 1)
    assert caught.value.field == "workers"
    assert MAX_SWARM_INSTANCES == 65_536  # stated in docs/CI.md's exit-code section


def test_swarm_mode_refuses_a_strategy_of_non_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As one-process check does (exit 2 naming --configs), not exit 6."""
    pytest.importorskip("torch")
    monkeypatch.setenv(DEVICE_ENV, "cpu")  # chunks on workers run on the CPU only
    configs = "tests.test_hostile_fanout:integer_configs"
    for workers in ("1", "2"):
        result = probe(
            "check", "--engine", "gpu", "--instances", "2", "--workers", workers,
            "--configs", configs, "--seed", "1",
        )  # fmt: skip
        assert_refused(result, 2, "Invalid value for '--configs'", "not a SchedulerConfig")


def integer_configs() -> object:
    """A --configs strategy of ints."""
    from hypothesis import strategies as st

    return st.integers(0, 3)


def test_the_closing_line_says_what_actually_ran(tmp_path: Path) -> None:
    """--workers 8 for 3 examples starts a process a chunk: 3, and says so."""
    args = ["--workers", "8", "--examples", "3", "--seed", "1", "--trace-dir", str(tmp_path)]
    result = probe("check", *args)
    assert_refused(result, 0, "on 8 local processes (3 workers used: one a chunk): 3 chunks")


def test_swarm_mode_on_workers_refuses_a_strategy_that_goes_bad_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the driver's vetting draws, a worker's bad draw is still a usage error."""
    pytest.importorskip("torch")
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    configs = "tests.test_hostile_fanout:configs_bad_in_workers"
    args = ["--instances", "2", "--workers", "2", "--configs", configs, "--seed", "1"]
    result = probe("check", "--engine", "gpu", *args)
    assert_refused(result, 2, "Invalid value for '--configs'", "planted: bad in a worker")


_LOADED_IN = os.getpid()


def configs_bad_in_workers() -> object:
    """The suite's configs in the process that loads it; in a forked worker, a raise."""
    from schedspec.properties.strategies.configs import configs

    def planted(config: object) -> object:
        if os.getpid() != _LOADED_IN:
            raise RuntimeError("planted: bad in a worker")
        return config

    return configs().map(planted)
