"""`schedspec conform` and kit.conformance.conform: each promise of the adapter protocol
checked on an adapter hand-broken to break it, the method at fault named."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from schedspec.adapters.kit.conformance import ConformanceError, conform
from schedspec.adapters.reference import reference_engine
from schedspec.cli.main import main
from schedspec.engines.protocol import EngineFactory
from tests import broken_adapters as broken
from tests.capability_engines import DraftsWithoutMethod

# Every check of the script, in its order.
CHECKS = [
    "load",
    "fresh snapshot",
    "refusals",
    "add a request",
    "schedule and land",
    "block hashes",
    "aborts",
]


def test_the_reference_keeps_its_protocol_in_both_families() -> None:
    assert conform(reference_engine) == CHECKS
    assert conform(reference_engine, "sglang") == CHECKS


@pytest.mark.parametrize(
    ("factory", "check", "method", "says"),
    [
        (broken.SnapshotNotState, "fresh snapshot", "snapshot", "is a dict, not a State"),
        (broken.ReservedBlockShown, "fresh snapshot", "snapshot", "kv.num_blocks is 33"),
        (broken.AcceptsEverything, "refusals", "add_request", "accepted an empty prompt"),
        (broken.RefusesWithTypeError, "refusals", "add_request", "with TypeError, not a"),
        (broken.RekeyedRequests, "add a request", "snapshot", "keyed ['req-a']"),
        (broken.ForgetsMaxTokens, "add a request", "snapshot", "has max_tokens 16"),
        (broken.RunningListedAsWaiting, "schedule and land", "snapshot", "status RUNNING"),
        (broken.UntranslatedHashes, "schedule and land", "snapshot", "HashTranslator"),
        (broken.SchedulesAStranger, "schedule and land", "schedule", "names 'ghost'"),
        (broken.SchedulesNothing, "schedule and land", "schedule", "scheduled nothing"),
        (broken.ReportsStrangers, "schedule and land", "update_from_output", "returned"),
        (broken.AbortRaisesOnUnknownIds, "aborts", "finish_requests", "raised KeyError"),
        (DraftsWithoutMethod, "load", "capabilities", "update_draft_token_ids"),
    ],
)
def test_each_broken_promise_is_found_and_its_method_named(
    factory: EngineFactory, check: str, method: str, says: str
) -> None:
    with pytest.raises(ConformanceError) as found:
        conform(factory)
    assert (found.value.check, found.value.method) == (check, method)
    assert says in found.value.message
    # The checks before it passed, in order.
    assert found.value.passed == tuple(CHECKS[: CHECKS.index(check)])


def test_an_adapter_without_profiles_is_named_at_load() -> None:
    with pytest.raises(ConformanceError) as found:
        conform(lambda config: object())  # type: ignore[arg-type,return-value]
    assert (found.value.check, found.value.method) == ("load", "profiles")


def test_the_command_prints_each_check_and_names_the_method_at_fault() -> None:
    passing = CliRunner().invoke(main, ["conform", "--engine", "reference"])
    assert passing.exit_code == 0, passing.output
    assert "ok      block hashes" in passing.output and "PASSED" in passing.output
    failing = CliRunner().invoke(
        main, ["conform", "--engine", "tests.broken_adapters:UntranslatedHashes"]
    )
    assert failing.exit_code == 1, failing.output
    assert "ok      add a request" in failing.output
    assert "FAILED  schedule and land: the adapter's snapshot: block" in failing.output
    assert "FAILED: fix the adapter's snapshot first" in failing.output
