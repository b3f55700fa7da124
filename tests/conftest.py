"""Hypothesis profiles: a quick one by default (CI), a long one behind SCHEDSPEC_LONG=1.
vLLM's per-user cache replaced by a fresh folder of the session's own. And the seed a
command picks when given none drawn the same way in every run of a test."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import tempfile
import zlib
from collections.abc import MutableMapping

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("long" if os.environ.get("SCHEDSPEC_LONG") == "1" else "ci")

VLLM_CACHE_PREFIX = "schedspec-tests-vllm-cache-"


def use_fresh_vllm_cache(environ: MutableMapping[str, str]) -> str:
    """Point environ's VLLM_CACHE_ROOT at a new empty folder, whatever it named before;
    return the folder."""
    root = tempfile.mkdtemp(prefix=VLLM_CACHE_PREFIX)
    environ["VLLM_CACHE_ROOT"] = root
    return root


# vLLM caches per user (~/.cache/vllm, or VLLM_CACHE_ROOT) what it learns by importing a
# model's code in a subprocess; a warm cache once hid a package missing from the venv
# (einops) from every vLLM test. This module is imported before any test module, so
# before anything imports vLLM, which reads the variable; subprocesses inherit it.
SESSION_VLLM_CACHE_ROOT = use_fresh_vllm_cache(os.environ)
atexit.register(shutil.rmtree, SESSION_VLLM_CACHE_ROOT, True)

# A test run a non-interactive shell started in the background (`pytest &`, a CI lane)
# inherits SIGINT ignored, and so would every command a test starts: the tests of Ctrl-C
# then hang on a run no signal ends. Python's own handler put back here is reset to the
# default in each child at exec, as a terminal's foreground run has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def repeatable_command_seeds(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`schedspec check` or `diff` run without --seed picks a seed at random (and prints
    it; properties/run_plan.py draws it, for the pytest plugin too). Run in a test, it
    picks from a generator seeded by the test's id instead: CI then searches the same
    examples every time, and a test of a passing engine cannot turn red on a seed no
    rerun draws again (one did: a CACHE-COMPUTED false alarm, now
    tests/regression_traces/hit-on-kv-of-an-ended-request-in-flight.json)."""
    from schedspec.properties import run_plan

    generator = random.Random(zlib.crc32(request.node.nodeid.encode()))
    monkeypatch.setattr(run_plan, "random", generator)


# pytest-xdist spreads the tests over workers (pyproject.toml's addopts). Tests that must
# not run beside each other, or that share work within one process, form a group, which
# one worker runs in turn (--dist loadgroup):
# - ray: the campaigns on local Ray clusters (one cluster at a time on the machine);
# - mutants: each mutant runs once per process and its outcome serves every test that
#   asks (tests/mutants/mutation.py), the kill-rate test and table included.
XDIST_GROUPS = {"test_campaigns_ray.py": "ray", "mutants": "mutants"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path
        group = XDIST_GROUPS.get(path.name) or XDIST_GROUPS.get(path.parent.name)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
