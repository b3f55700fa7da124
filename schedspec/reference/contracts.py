"""CrossHair over the reference's arithmetic: every PEP 316 contract of
schedspec/reference/sizing.py checked over all paths.

CrossHair runs in a child process (it traces the interpreter while it
searches), with --report_all so that each confirmed condition is reported,
not only the broken ones: a run that prints nothing has checked nothing.
`schedspec prove --contracts` and tests/test_sizing_contracts.py both run it
through check_contracts. Needs the `formal` extra (crosshair-tool).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from schedspec.reference import sizing

SIZING = Path(sizing.__file__)
# A bound per condition; the arithmetic here is confirmed in well under a second.
PER_CONDITION_TIMEOUT_S = 20.0
CONFIRMED = "Confirmed over all paths."


@dataclass(frozen=True)
class ContractCheck:
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    @property
    def confirmed(self) -> int:
        return sum(line.endswith(CONFIRMED) for line in self.lines)

    @property
    def errors(self) -> list[str]:
        """CrossHair's counterexamples (and crashes of the checked code)."""
        return [line for line in self.lines if ": error: " in line]

    @property
    def unconfirmed(self) -> list[str]:
        """Conditions CrossHair neither confirmed nor refuted (e.g. out of time)."""
        return [line for line in self.lines if ": info: " in line and not line.endswith(CONFIRMED)]

    @property
    def failed(self) -> bool:
        return self.returncode != 0 or bool(self.errors)


def check_contracts(
    path: Path = SIZING, per_condition_timeout: float = PER_CONDITION_TIMEOUT_S
) -> ContractCheck:
    """Run `crosshair check --report_all` over the file; CrossHair must be installed."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "crosshair",
            "check",
            "--report_all",
            f"--per_condition_timeout={per_condition_timeout}",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return ContractCheck(done.returncode, done.stdout, done.stderr)
