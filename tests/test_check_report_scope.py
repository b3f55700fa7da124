"""The check table lists the invariants that apply to the configs the run drew: hybrid KV
cache groups' checks only where a hybrid config was drawn, the single group's table
arithmetic only where a config without groups was."""

from __future__ import annotations

from schedspec.cli.printing.check_report import format_table
from schedspec.properties.checked_engine import CheckStats


def rows(stats: CheckStats) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in format_table(stats, "vllm-v1", [])[1:]}


def test_a_run_without_groups_lists_no_hybrid_check() -> None:
    listed = rows(CheckStats(kind_runs={("schedule", "vllm-v1", False): 3}))
    assert listed["ALLOC-EXACT"][2] == "3" and listed["BUDGET"][2] == "3"
    assert "WINDOW-FREED" not in listed and "HYBRID-HIT-LONGEST" not in listed


def test_a_run_on_hybrid_configs_only_lists_no_single_group_check() -> None:
    listed = rows(CheckStats(kind_runs={("schedule", "vllm-v1", True): 2}))
    assert listed["WINDOW-FREED"][2] == "2" and listed["BUDGET"][2] == "2"
    assert "ALLOC-EXACT" not in listed and "KV-COVER" not in listed


def test_a_run_on_both_lists_both_and_nothing_ran_lists_the_single_group() -> None:
    both = CheckStats(
        kind_runs={("schedule", "vllm-v1", True): 2, ("schedule", "vllm-v1", False): 1}
    )
    listed = rows(both)
    assert listed["WINDOW-FREED"][2] == "2" and listed["ALLOC-EXACT"][2] == "1"
    assert listed["BUDGET"][2] == "3"
    nothing = rows(CheckStats())
    assert "ALLOC-EXACT" in nothing and "WINDOW-FREED" not in nothing
