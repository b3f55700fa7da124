"""The exit-code contract, per command: every cell docs/CI.md's table marks is produced by
a run of that command, and the table agrees with schedspec/cli/exit_codes.py.

A harness error (6) and an interrupt (130) are planted by replacing one function of
schedspec's own with one that raises; the rest come from real inputs and engines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from schedspec.cli.exit_codes import EXIT_CODES
from schedspec.cli.main import COMMANDS, main
from schedspec.engines.events import AddRequest, Step
from schedspec.spec import SchedulerConfig
from schedspec.traces.trace import Trace

# The exit-code table (the README links it as "Put it in CI").
CI_DOC = Path(__file__).resolve().parent.parent / "docs" / "CI.md"
FAULTS = "tests.fault_engines"
QUICK = ("--seed", "1", "--examples", "3", "--max-steps", "10")
FINDS = ("--seed", "1", "--examples", "20")  # finds docs/CHECK.md's planted BUDGET bug
# Functions of schedspec's own that every run of a command goes through: replaced by
# one that raises, they stand for a bug in schedspec (or a Ctrl-C arriving there).
CHECKS = "schedspec.properties.checked_engine.CheckedEngine._run"
INNER = {
    "check": CHECKS,
    "diff": CHECKS,
    "replay": CHECKS,
    "diff-replay": CHECKS,
    "simulate": "schedspec.simulate.simulator.scheduled_entries",
    "run": "schedspec.cli.run.record_step",
    "prove": "schedspec.cli.prove.prove",
    "install": "schedspec.cli.setup.install.script_path",
    "conform": "schedspec.adapters.kit.conformance.conform",
    "export-test": "schedspec.export.test_file.body_lines",
}


@dataclass(frozen=True)
class Scenario:
    args: tuple[str, ...]  # after the command name; {trace} stands for a small trace file
    plant: type[BaseException] | None = None  # raised from INNER[command]
    says: str = ""


SIM = ("--num-requests", "8", "--no-plots", "--out", "{out}")
SCENARIOS: dict[tuple[str, int], Scenario] = {
    ("conform", 0): Scenario(("--engine", "reference"), says="PASSED"),
    ("conform", 1): Scenario(
        ("--engine", "tests.broken_adapters:UntranslatedHashes"), says="fix the adapter's snapshot"
    ),
    ("conform", 2): Scenario(("--engine", "no_such_module:Engine"), says="no_such_module"),
    ("check", 0): Scenario(QUICK, says="PASSED"),
    ("check", 1): Scenario(("--engine", "tests.broken_engines:wrong_total", *FINDS), says="BUDGET"),
    ("check", 2): Scenario(
        ("--examples", "0"),
    ),
    ("check", 4): Scenario(("--engine", f"{FAULTS}:crashes_in_snapshot", *QUICK)),
    ("check", 5): Scenario(
        ("--engine", f"{FAULTS}:hangs_in_update", *QUICK, "--step-timeout", "0.5")
    ),
    ("diff", 0): Scenario(("--right", "reference", *QUICK), says="PASSED"),
    ("diff", 1): Scenario(("--right", "tests.broken_engines:wrong_total", *FINDS)),
    ("diff", 2): Scenario(("--left", "no:such", "--right", "reference"), says="--left"),
    ("diff", 3): Scenario(
        ("--right", "tests.diff_engines:short_prefill", "--seed", "1", "--examples", "20"),
        says="diverged",
    ),
    ("diff", 4): Scenario(("--right", f"{FAULTS}:crashes_in_snapshot", *QUICK)),
    ("diff", 5): Scenario(
        ("--right", f"{FAULTS}:hangs_in_update", *QUICK, "--step-timeout", "0.5")
    ),
    ("replay", 0): Scenario(("{trace}",), says="PASSED"),
    ("replay", 1): Scenario(("{trace}", "--engine", "tests.broken_engines:wrong_total")),
    ("replay", 2): Scenario(("{trace}", "--profile", "everything")),
    ("replay", 4): Scenario(("{trace}", "--engine", f"{FAULTS}:crashes_in_snapshot")),
    ("replay", 5): Scenario(
        ("{trace}", "--engine", f"{FAULTS}:hangs_in_update", "--step-timeout", "0.5")
    ),
    ("diff-replay", 0): Scenario(("{trace}", "--right", "reference"), says="PASSED"),
    ("diff-replay", 1): Scenario(("{trace}", "--right", "tests.broken_engines:wrong_total")),
    ("diff-replay", 2): Scenario(("{trace}",), says="--right"),
    ("diff-replay", 3): Scenario(("{trace}", "--right", "tests.diff_engines:short_prefill")),
    ("diff-replay", 4): Scenario(("{trace}", "--right", f"{FAULTS}:crashes_in_snapshot")),
    ("diff-replay", 5): Scenario(
        ("{trace}", "--right", f"{FAULTS}:hangs_in_update", "--step-timeout", "0.5")
    ),
    ("simulate", 0): Scenario(SIM, says="Wrote"),
    ("simulate", 1): Scenario((*SIM, "--max-steps", "2"), says="max_steps=2"),
    ("simulate", 2): Scenario((*SIM, "--num-requests", "1000000000"), says="num_requests"),
    ("simulate", 4): Scenario((*SIM, "--engine", f"{FAULTS}:crashes_when_built")),
    ("simulate", 5): Scenario(
        (*SIM, "--engine", f"{FAULTS}:hangs_in_update", "--step-timeout", "0.5")
    ),
    ("export-test", 0): Scenario(("{trace}", "--for", "vllm"), says="def test_t("),
    ("export-test", 2): Scenario(("{trace}", "--for", "sglang"), says="config.family"),
    ("run", 0): Scenario(("--quiet",), says="Steps:"),
    ("run", 1): Scenario(("--quiet", "--max-steps", "3"), says="--max-steps 3"),
    ("run", 2): Scenario(("--watermark", "1.5"), says="watermark"),
    ("prove", 0): Scenario(("--only", "BUDGET", "--max-n", "1", "--trace-dir", "{out}")),
    ("install", 0): Scenario(("--where", "vllm"), says="install_vllm.sh"),
    # The script cannot create its venv under a file: it fails at its first step.
    ("install", 1): Scenario(("torch-cpu", "/dev/null/venv")),
    ("install", 2): Scenario(("sglang", "{out}", "--version", "0.5.23"), says="--version"),
    ("prove", 1): Scenario(
        (
            "--only",
            "SEQS",
            "--max-n",
            "0",
            "--variant",
            "max-num-seqs-off-by-one",
            "--jobs",
            "1",
            "--trace-dir",
            "{out}",
        )
    ),
    ("prove", 2): Scenario(
        (
            "--max-n",
            "99",
        ),
        says="--max-n",
    ),
    ("prove", 3): Scenario(
        ("--only", "BUDGET", "--max-n", "1", "--timeout", "0.000001", "--trace-dir", "{out}")
    ),
}
for command in INNER:
    SCENARIOS[(command, 6)] = Scenario(SCENARIOS[(command, 0)].args, RuntimeError, "HARNESS ERROR")
    SCENARIOS[(command, 130)] = Scenario(
        SCENARIOS[(command, 0)].args, KeyboardInterrupt, "interrupted"
    )


def readme_contract() -> dict[str, set[int]]:
    """command -> the exit codes docs/CI.md's exit-code table marks for it."""
    text = CI_DOC.read_text()
    header = re.search(r"^\| exit \| outcome \| meaning \|(.*)\|$", text, flags=re.MULTILINE)
    assert header is not None, "docs/CI.md has no exit-code table"
    commands = [cell.strip(" `") for cell in header.group(1).split("|")]
    contract: dict[str, set[int]] = {c: set() for c in commands}
    rows = text[header.end() :].split("\n\n", 1)[0].splitlines()[2:]
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        code = 130 if cells[0] == "128 + N" else int(cells[0])
        for command, mark in zip(commands, cells[3:], strict=True):
            if mark == "x":
                contract[command].add(code)
    return contract


def test_the_readme_table_is_the_contract() -> None:
    contract = readme_contract()
    assert set(contract) == set(COMMANDS)
    marked = set().union(*contract.values())
    assert marked == set(EXIT_CODES.values())
    assert {code for (_, code) in SCENARIOS} <= marked
    assert {(c, code) for c, codes in contract.items() for code in codes} == set(SCENARIOS)


CELLS = sorted(SCENARIOS)


@pytest.mark.parametrize(("command", "code"), CELLS, ids=[f"{c}-{n}" for c, n in CELLS])
def test_exit_code(
    command: str, code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # traces written to the working directory land here
    scenario = SCENARIOS[(command, code)]
    if scenario.plant is not None:
        monkeypatch.setattr(INNER[command], _raising(scenario.plant))
    trace = _small_trace(tmp_path / "t.json")
    args = [a.format(trace=trace, out=tmp_path / "out") for a in scenario.args]
    report = tmp_path / "report.json"
    reporting = command in ("check", "diff") and code != 2
    result = CliRunner().invoke(main, [command, *args, *(["--json", str(report)] * reporting)])
    assert result.exit_code == code, result.output
    assert scenario.says.lower() in result.output.lower()
    if code != 6:
        assert "HARNESS ERROR" not in result.output
    if reporting:
        written: dict[str, Any] = json.loads(report.read_text())
        assert written["exit_code"] == code


def _raising(kind: type[BaseException]) -> Callable[..., Any]:
    def planted(*args: object, **kwargs: object) -> Any:
        raise kind("planted in schedspec's own code") if kind is RuntimeError else kind()

    return planted


def _small_trace(path: Path) -> Path:
    """Two requests batched in one step (wrong_total miscounts it, short_prefill admits
    one token less), then decode steps: the faulty engines' third calls happen."""
    config = SchedulerConfig(
        block_size=4, num_blocks=16, max_num_batched_tokens=32, max_num_seqs=2, max_model_len=32
    )
    prompts = (AddRequest("a", tuple(range(1, 20)), 4), AddRequest("b", (1, 2), 4))
    events = (*prompts, Step(), Step(), Step(), Step())
    Trace(config, events).save(path)
    return path


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "86401", "1e9"])
@pytest.mark.parametrize("command", ["check", "replay", "diff", "diff-replay", "simulate"])
def test_a_step_timeout_that_is_no_time_limit_is_a_usage_error(
    command: str, value: str, tmp_path: Path
) -> None:
    """`--step-timeout inf` or `nan` used to reach the watchdog and be blamed on the engine."""
    trace = str(_small_trace(tmp_path / "t.json"))
    before = {"replay": [trace], "diff": ["--right", "reference"], "diff-replay": [trace]}
    args = [command, *before.get(command, []), "--step-timeout", value]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--step-timeout'" in result.output
    assert "must be in [0, 86400] seconds (0: no limit)" in result.output


def test_a_reader_that_went_away_exits_as_sigpipe_would(tmp_path: Path) -> None:
    """`schedspec ... | head`: once the reader has gone, writing the report fails; the
    command exits 141 (128 + SIGPIPE, as a shell reports a process SIGPIPE ended),
    with no traceback and no harness error."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a line
    trace = _small_trace(tmp_path / "t.json")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "schedspec", "replay", str(trace)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 128 + signal.SIGPIPE == 141, done.stderr
    assert "Traceback" not in done.stderr and "HARNESS ERROR" not in done.stderr
