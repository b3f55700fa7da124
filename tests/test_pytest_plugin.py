"""The pytest plugin, run inside pytester: the added item, its absence, and the fixture.

The plugin is found through the installed `pytest11` entry point, as it would
be in an engine's repository; nothing here registers it by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# An engine repository's adapter module: one engine that meets the spec, one
# that miscounts its total whenever it batches two requests.
ENGINES = """
import dataclasses

from schedspec.adapters.reference import ReferenceEngine, reference_engine


class MiscountingEngine(ReferenceEngine):
    def schedule(self):
        output = super().schedule()
        if len(output.num_scheduled_tokens) < 2:
            return output
        return dataclasses.replace(
            output, total_num_scheduled_tokens=output.total_num_scheduled_tokens + 1
        )


good = reference_engine
broken = MiscountingEngine
"""

# Few examples: the planted bug is found within them on this seed.
FAST = ("--schedspec-examples", "20", "--schedspec-seed", "1", "-p", "no:cacheprovider")


@pytest.fixture
def engines(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(engine_repo=ENGINES)
    pytester.syspathinsert()
    return pytester


def test_option_adds_a_passing_item_for_a_good_engine(engines: pytest.Pytester) -> None:
    result = engines.runpytest("--schedspec-engine", "engine_repo:good", "-v", *FAST)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*collected 1 item*", "schedspec[[]engine_repo:good:vllm-v1[]] PASSED*"]
    )


def test_item_fails_naming_the_invariant_and_the_trace(engines: pytest.Pytester) -> None:
    result = engines.runpytest("--schedspec-engine", "engine_repo:broken", *FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*schedspec: engine_repo:broken broke profile vllm-v1 (seed 1)",
            "VIOLATION after event *",
            "  [[]BUDGET[]] total_num_scheduled_tokens is not the sum of the entries*",
            "*scheduled: r0=1 r1=1 (total 3)*",
            f"trace written to {engines.path / 'schedspec-failure-1.json'}",
            "replay it: schedspec replay * --engine engine_repo:broken --profile vllm-v1",
        ]
    )
    assert (engines.path / "schedspec-failure-1.json").exists()


def test_profile_option_is_used(engines: pytest.Pytester) -> None:
    result = engines.runpytest(
        "--schedspec-engine", "engine_repo:good", "--schedspec-profile", "safety", "-v", *FAST
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["schedspec[[]engine_repo:good:safety[]] PASSED*"])


def test_without_the_option_nothing_is_added(engines: pytest.Pytester) -> None:
    engines.makepyfile(test_own="def test_own():\n    pass\n")
    result = engines.runpytest("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*schedspec[[]*")


def test_bad_engine_is_a_usage_error(engines: pytest.Pytester) -> None:
    result = engines.runpytest("--schedspec-engine", "engine_repo:nothing_here")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--schedspec-engine: engine: * has no callable 'nothing_here'"])


@pytest.mark.parametrize(
    ("options", "error"),
    [
        # An adapter without profiles: the engine option's fault, naming the attribute.
        (
            ["--schedspec-engine", "tests.broken_engines:profileless"],
            "*--schedspec-engine: profiles: the adapter ProfilelessEngine has no `profiles`*",
        ),
        (
            [
                "--schedspec-engine",
                "tests.broken_engines:safety_only",
                "--schedspec-profile",
                "vllm-v1",
            ],
            "*--schedspec-profile: profile: the engine claims [[]'safety'[]], not 'vllm-v1'; "
            "an adapter claims it by setting its `profiles` attribute*",
        ),
    ],
)
def test_an_engine_that_cannot_be_checked_is_a_usage_error(
    engines: pytest.Pytester, options: list[str], error: str
) -> None:
    engines.syspathinsert(str(Path(__file__).resolve().parent.parent))  # tests.broken_engines
    result = engines.runpytest(*options, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([error])


def test_the_engine_option_names_the_engines(engines: pytest.Pytester) -> None:
    result = engines.runpytest("--help")
    shown = " ".join(result.stdout.str().split())
    assert "'reference', 'gpu', 'vllm', 'sglang', or module:factory" in shown


def test_fixture_runs_the_suite_in_a_test_of_ones_own(engines: pytest.Pytester) -> None:
    engines.makepyfile(
        test_engine_repo="""
        import engine_repo


        def test_good(schedspec_suite):
            result = schedspec_suite(engine_repo.good, examples=5)
            assert result.passed and result.profile == "vllm-v1"


        def test_broken(schedspec_suite):
            schedspec_suite("engine_repo:broken", "safety", examples=20, seed=1)
        """
    )
    result = engines.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*schedspec: engine_repo:broken broke profile safety (seed 1)",
            "*[[]BUDGET[]]*",
            "trace written to *schedspec-failure-1.json",
        ]
    )


def test_trace_dir_option_sends_every_trace_there(engines: pytest.Pytester) -> None:
    """The added item's trace and the fixture's both land in --schedspec-trace-dir
    (created), where a CI artifact glob finds them; without it the fixture's goes to the
    test's tmp_path (the test above)."""
    engines.makepyfile(
        test_engine_repo="""
        def test_broken(schedspec_suite):
            schedspec_suite("engine_repo:broken", "safety", examples=20, seed=2)
        """
    )
    traces = engines.path / "ci" / "traces"
    result = engines.runpytest(
        "--schedspec-engine", "engine_repo:broken", "--schedspec-trace-dir", str(traces), *FAST
    )
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([f"trace written to {traces / 'schedspec-failure-2.json'}"])
    result.stdout.fnmatch_lines([f"trace written to {traces / 'schedspec-failure-1.json'}"])
    assert sorted(p.name for p in traces.iterdir()) == [
        "schedspec-failure-1.json",
        "schedspec-failure-2.json",
    ]
    assert not list(engines.path.glob("schedspec-failure-*.json"))


def test_a_trace_dir_that_cannot_be_written_is_a_usage_error(engines: pytest.Pytester) -> None:
    (engines.path / "a-file").write_text("")
    result = engines.runpytest(
        "--schedspec-engine", "engine_repo:good", "--schedspec-trace-dir", "a-file/traces", *FAST
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--schedspec-trace-dir: a-file/traces: cannot write files here*"])
