"""Print the mutants' kill-rate table at the end of any pytest run that ran some: from the
rows the tests put on their reports, so that it prints whichever process ran them (under
pytest-xdist, a worker; the table prints in the process that reports)."""

from __future__ import annotations

import pytest

from tests.mutants.mutation import KILL_ROW, KillRow, kill_table

# Rows seen in this run's reports, by mutant id (the kill-rate test repeats them all).
ROWS: dict[str, KillRow] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, values in report.user_properties:
        if name == KILL_ROW:
            row = KillRow.from_values(values)  # type: ignore[arg-type]
            ROWS[row.mutant_id] = row


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ROWS:
        return
    terminalreporter.section("mutants: kill rate of the CI profile")
    for line in kill_table(list(ROWS.values())).splitlines():
        terminalreporter.write_line(line)
