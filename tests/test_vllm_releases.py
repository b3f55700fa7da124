"""The vLLM releases the adapter runs (adapters/vllm/releases.py): each one's knob values,
the configs whose knobs do not describe it (it runs them, claiming safety only), the
configs it draws, and an unsupported release refused with the range.

Only the tests marked by `installed_vllm()` need vLLM (`scripts/install_vllm.sh
VENV_DIR`); they check the installed release's rules against the reference.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.adapters.vllm import releases
from schedspec.adapters.vllm.config import avoid_known_corners, expressible, unsupported_reason
from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.adapters.vllm.releases import (
    ANY_RELEASE_VARIABLE,
    NEWEST,
    SUPPORTED,
    Release,
    UnsupportedVllmError,
    release_of,
)
from schedspec.engines.events import AddRequest, Step
from schedspec.properties import probe as runner
from schedspec.properties.differential import DiffOptions, diff_trace
from schedspec.properties.strategies.engine_configs import (
    vllm_cache_aware_configs,
    vllm_connector_configs,
    vllm_default_configs,
    vllm_long_prefill_rule_configs,
    vllm_release_neutral_configs,
)
from schedspec.traces.trace import Trace
from tests.sched_helpers import small_config as config

V033, V034 = SUPPORTED
UNSUPPORTED = (
    r"vLLM 0\.35\.0 is installed; schedspec supports 0\.33\.0 to 0\.34\.0 "
    r"\(schedspec install vllm --version"
)


def installed_vllm() -> Release:
    """The installed release, or a skip (a failure in CI) where vLLM is not installed."""
    from tests.vllm_required import require_vllm

    require_vllm("the tests of the installed vLLM release")
    return releases.current_release()


# ------------------------------------------------------------- the releases


def test_each_release_is_its_knob_values() -> None:
    assert [r.version for r in SUPPORTED] == ["0.33.0", "0.34.0"]
    assert NEWEST is V034
    assert (V033.long_prefill_needs_chunked_prefill, V033.cache_aware_admission) == (False, False)
    assert (V034.long_prefill_needs_chunked_prefill, V034.cache_aware_admission) == (True, True)
    reordering = config(cache_aware_admission_window=8, cache_aware_admission_threshold=0.25)
    assert V033.knobs(reordering) == config(long_prefill_needs_chunked_prefill=False)
    assert V034.knobs(reordering) == reordering


def test_a_supported_version_is_its_release_local_builds_too() -> None:
    assert release_of("0.33.0") is V033
    assert release_of("0.34.0+cpu") is V034


@pytest.mark.parametrize("version", ["0.35.0", "0.34.1", "0.34.0rc1", "0.32.0"])
def test_an_unsupported_version_is_refused_naming_it_and_the_range(version: str) -> None:
    with pytest.raises(UnsupportedVllmError) as caught:
        release_of(version)
    message = str(caught.value)
    assert message.startswith(f"vLLM {version} is installed; schedspec supports 0.33.0 to 0.34.0")
    assert ANY_RELEASE_VARIABLE in message


def test_asked_to_run_any_release_it_runs_the_nearest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ANY_RELEASE_VARIABLE, "1")
    assert release_of("0.35.0") is NEWEST
    assert release_of("0.32.0") is V033


def test_building_an_engine_on_an_unsupported_release_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused before vLLM is imported: no AttributeError from an API that moved."""
    monkeypatch.setattr(releases, "installed_version", lambda: "0.35.0")
    with pytest.raises(UnsupportedVllmError, match=UNSUPPORTED):
        VllmEngine(config())


def test_the_probe_fails_on_an_unsupported_release_with_the_range(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(releases, "installed_version", lambda: "0.35.0")
    assert runner.main(["vllm"]) == 1
    printed = capsys.readouterr()
    assert "UnsupportedVllmError: vLLM 0.35.0 is installed; schedspec supports" in printed.err
    assert "probe: FAILED" in printed.out


# --------------------------------------------- configs whose knobs describe it


def test_0_33_0_has_no_cache_aware_admission_and_the_older_long_prefill_rule() -> None:
    window = config(cache_aware_admission_window=4, enable_prefix_caching=True)
    assert "cache_aware_admission_window" in str(V033.mismatch(window))
    # A window acts only under fcfs with prefix caching: elsewhere 0.33.0 is described.
    assert V033.mismatch(replace(window, enable_prefix_caching=False)) is None
    capped = config(enable_chunked_prefill=False, long_prefill_token_threshold=8)
    assert "long_prefill_needs_chunked_prefill: True" in str(V033.mismatch(capped))
    assert V033.mismatch(replace(capped, long_prefill_needs_chunked_prefill=False)) is None
    # Where the rules agree (chunked prefill on, or no cap) either value is 0.33.0's.
    assert V033.mismatch(config(long_prefill_token_threshold=8)) is None
    assert V033.mismatch(replace(capped, long_prefill_token_threshold=0)) is None


def test_0_34_0_has_the_newer_long_prefill_rule_and_the_window() -> None:
    capped = config(
        enable_chunked_prefill=False,
        long_prefill_token_threshold=8,
        long_prefill_needs_chunked_prefill=False,
    )
    assert "long_prefill_needs_chunked_prefill: False" in str(V034.mismatch(capped))
    assert expressible(capped, V034).long_prefill_needs_chunked_prefill
    window = config(cache_aware_admission_window=4, cache_aware_admission_threshold=0.0)
    assert V034.mismatch(window) is None
    assert expressible(window, V033).cache_aware_admission_window == 0


def test_knobs_that_do_not_describe_a_release_are_no_refusal() -> None:
    """vLLM runs such a config by its own rules (a diff between releases compares
    exactly that): nothing about the knobs is refused."""
    capped = config(enable_chunked_prefill=False, long_prefill_token_threshold=8)
    for knobs in (capped, replace(capped, long_prefill_needs_chunked_prefill=False)):
        assert unsupported_reason(replace(knobs, cache_aware_admission_window=4)) is None


# ------------------------------------------------------------- what each draws


@pytest.mark.parametrize("release", SUPPORTED, ids=lambda r: r.version)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_default_configs_are_the_releases(release: Release, data: st.DataObject) -> None:
    drawn = data.draw(vllm_default_configs(release=release))
    assert unsupported_reason(drawn) is None
    assert release.mismatch(drawn) is None
    assert release.knobs(drawn) == drawn


@pytest.mark.parametrize("release", SUPPORTED, ids=lambda r: r.version)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_connector_configs_are_the_releases_outside_f5(
    release: Release, data: st.DataObject
) -> None:
    drawn = data.draw(vllm_connector_configs(release=release))
    assert unsupported_reason(drawn) is None
    assert release.refusal(drawn) is None  # no cap on 0.33.0
    assert release.knobs(drawn) == drawn
    assert not (drawn.kv_connector and drawn.async_scheduling)
    assert drawn.kv_load_failure_policy == "fail"  # F5: "recompute" is moved off


def test_the_connector_configs_draw_loads_and_0_34_0_draws_the_cap() -> None:
    assert find(vllm_connector_configs(release=V033), lambda c: c.kv_connector).kv_connector
    capped = find(
        vllm_connector_configs(release=V034),
        lambda c: c.kv_connector and c.max_num_inflight_kv_loads is not None,
    )
    assert capped.max_num_inflight_kv_loads is not None


def test_0_34_0_draws_cache_aware_admission_where_it_applies() -> None:
    found = find(
        vllm_default_configs(release=V034),
        lambda c: (
            c.cache_aware_admission_window > 1
            and c.policy == "fcfs"
            and c.enable_prefix_caching
            and c.cache_aware_admission_threshold not in (0.5, 0.0)
        ),
    )
    assert found.cache_aware_admission_window > 1


# Between two releases (scripts/cross_release_diff.py): one family where the knobs
# describe every release, and one for each rule that changed, where exactly one does.


@pytest.mark.parametrize("release", SUPPORTED, ids=lambda r: r.version)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_cross_release_families_part_only_where_they_say(
    release: Release, data: st.DataObject
) -> None:
    neutral = data.draw(vllm_release_neutral_configs(release), label="neutral")
    assert all(r.mismatch(neutral) is None for r in SUPPORTED)
    capped = data.draw(vllm_long_prefill_rule_configs(release), label="long-prefill")
    assert not capped.enable_chunked_prefill and capped.long_prefill_token_threshold > 0
    parted = [r for r in SUPPORTED if r.mismatch(capped) is not None]
    assert parted == [r for r in SUPPORTED if r != release]
    windowed = data.draw(vllm_cache_aware_configs(release), label="cache-aware")
    assert windowed.cache_aware_admission_window >= 2 and windowed.enable_prefix_caching
    assert [r for r in SUPPORTED if r.mismatch(windowed) is not None] == [V033]
    # Every family stays out of the known corners (F2, F3, G1), as the defaults do.
    for drawn in (neutral, capped, windowed):
        assert avoid_known_corners(drawn) == drawn
        assert unsupported_reason(drawn) is None


# ------------------------------------------------------- the installed release


def test_the_long_prefill_rule_is_the_installed_releases() -> None:
    """Chunked prefill off, a cap of 4, two 10-token prompts: 0.33.0 caps them (and so
    chunks them), 0.34.0 does not; the reference under the release's knob agrees."""
    release = installed_vllm()
    capped = release.knobs(config(enable_chunked_prefill=False, long_prefill_token_threshold=4))
    prompt = tuple(range(1, 11))
    events = (AddRequest("A", prompt, 2), AddRequest("B", prompt, 2), Step(), Step())
    result = diff_trace(
        Trace(capped, events), reference_engine, VllmEngine, "vllm-v1", DiffOptions(True)
    )
    assert result.passed, result.divergence or result.violation or result.error
    first = result.entries[2].outputs[1][0]
    chunk = 10 if release.long_prefill_needs_chunked_prefill else 4
    assert dict(first.num_scheduled_tokens) == {"A": chunk, "B": chunk}


def test_cache_aware_admission_is_the_installed_releases() -> None:
    """One seat, one block cached: C (whose prefix is cached) passes B (cold) under
    0.34.0's window, as in the reference; 0.33.0 has no window to give."""
    release = installed_vllm()
    reordering = config(
        max_num_seqs=1,
        enable_prefix_caching=True,
        cache_aware_admission_window=4,
        cache_aware_admission_threshold=0.0,
    )
    if not release.cache_aware_admission:
        # It runs the config without a window, and claims only what it keeps.
        assert VllmEngine(reordering).profiles == {"safety"}
        return
    events = (
        AddRequest("A", (1, 2, 3, 4, 5), 1),
        Step(),  # A's prefill and its one token: A finishes, its first block stays cached
        AddRequest("B", (50, 51, 52, 53, 54), 1),
        AddRequest("C", (1, 2, 3, 4, 9), 1),
        Step(),
        Step(),
    )
    result = diff_trace(
        Trace(reordering, events), reference_engine, VllmEngine, "vllm-v1", DiffOptions(True)
    )
    assert result.passed, result.divergence or result.violation or result.error
    admitted = result.entries[4].outputs[1][0].scheduled_new_reqs
    assert [d.request_id for d in admitted] == ["C"]


def test_an_engine_claims_vllm_v1_only_where_the_knobs_describe_its_release() -> None:
    """Chunked prefill off and a cap: the config's long-prefill rule is one release's.
    The installed vLLM runs it either way; it claims vllm-v1 only for its own rule, so
    a vllm-v1 check of the other rule is refused per config, and a safety check runs."""
    release = installed_vllm()
    capped = config(enable_chunked_prefill=False, long_prefill_token_threshold=4)
    own = replace(
        capped, long_prefill_needs_chunked_prefill=release.long_prefill_needs_chunked_prefill
    )
    other = replace(
        own, long_prefill_needs_chunked_prefill=not own.long_prefill_needs_chunked_prefill
    )
    assert VllmEngine(own).profiles == {"safety", "vllm-v1"}
    assert VllmEngine(other).profiles == {"safety"}
    prompt = tuple(range(1, 11))
    events = (AddRequest("A", prompt, 2), AddRequest("B", prompt, 2), Step(), Step())
    under_safety = diff_trace(
        Trace(other, events), reference_engine, VllmEngine, "safety", DiffOptions(True)
    )
    # The reference follows the config's rule, vLLM its own: they part at the first step.
    assert under_safety.divergence is not None
    assert under_safety.violation is None and under_safety.error is None
