"""Print the mutants' kill-rate table at the end of any pytest run that ran some."""

from __future__ import annotations

import pytest

from tests.mutants.mutation import OUTCOMES, kill_table


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not OUTCOMES:
        return
    terminalreporter.section("mutants: kill rate of the CI profile")
    for line in kill_table(OUTCOMES.values()).splitlines():
        terminalreporter.write_line(line)
