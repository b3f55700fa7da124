"""`schedspec prove`: the table, the exit status, counterexample state and trace, bad flags."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from schedspec.cli.main import main
from schedspec.cli.printing.prove_report import schedule_table
from schedspec.spec.formal.schedule_rows import SlotRow, SlotState
from schedspec.traces.trace import Trace


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["prove", *args])
    return result.exit_code, result.output


def test_proves_and_exits_zero() -> None:
    code, out = run("--max-n", "1", "--only", "BUDGET", "--only", "NO-EMPTY-STEP")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1].split() == ["invariant", "N", "result", "seconds"]
    rows = [line.split() for line in lines[2:6]]
    assert [r[:3] for r in rows] == [
        ["BUDGET", "all", "proved"],
        ["BUDGET", "1", "proved"],
        ["NO-EMPTY-STEP", "all", "proved"],
        ["NO-EMPTY-STEP", "1", "proved"],
    ]
    assert "2/2 invariants proved for all N; 2/2 monolithic cross-checks proved" in out


def test_broken_variant_prints_the_state_writes_a_trace_and_exits_one(tmp_path: Path) -> None:
    code, out = run(
        "--max-n",
        "0",
        "--only",
        "SEQS",
        "--variant",
        "max-num-seqs-off-by-one",
        # In a worker process: the Z3 model behind the state is found again here.
        "--jobs",
        "2",
        "--trace-dir",
        str(tmp_path),
    )
    assert code == 1, out
    assert "SEQS                      all  counterexample" in out
    assert "counterexample: SEQS glue max-num-seqs-off-by-one step admit" in out
    assert "  config: " in out and " max_num_seqs=" in out
    path = tmp_path / "schedspec-formal-SEQS-max-num-seqs-off-by-one.json"
    assert f"trace of a run that reaches it: {path}" in out
    trace = Trace.load(path)
    assert "max-num-seqs-off-by-one breaks SEQS" in trace.note


def test_a_counterexample_prints_as_a_schedule_table(tmp_path: Path) -> None:
    """The planted bad rule preempt-keeps-blocks: the counterexample is the step, a row per
    request, where the victim is PREEMPTED after schedule() and still holds blocks, and
    the invariant it breaks with its rule; not a dump of the model's variables."""
    code, out = run(
        "--max-n", "2", "--only", "PREEMPT-RESET", "--variant", "preempt-keeps-blocks",
        "--jobs", "1", "--trace-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 1, out
    lines = out.splitlines()
    start = lines.index("  counterexample: PREEMPT-RESET N=2 block_size=2 preempt-keeps-blocks")
    assert lines[start + 1] == "  the step, request by request:"
    header = [cell.split() for cell in lines[start + 2].split("|")]
    assert header == [
        ["request"],
        ["before", "computed", "tokens", "blocks", "in", "flight"],
        ["scheduled", "drafts", "decision"],
        ["after", "schedule()", "computed", "blocks"],
        ["after", "the", "output", "computed", "tokens", "blocks"],
    ]
    rows = [[c.split() for c in line.split("|")] for line in lines[start + 3 : start + 5]]
    assert [row[0] for row in rows] == [["s[0]"], ["s[1]"]]
    victims = [row[3] for row in rows if row[2][-1] == "preempted"]
    assert victims and all(after[:2] == ["PREEMPTED", "0"] for after in victims)
    assert any(int(blocks) > 0 for *_, blocks in victims)  # the bug: it kept its blocks
    assert lines[start + 5] == "  breaks PREEMPT-RESET (rule: docs/SPEC.md#preempt-reset)"
    assert lines[start + 6].startswith("  config: ")
    assert not any(" = " in line for line in lines[start:])  # no raw `name = value` dump


def test_schedule_table_worked_example() -> None:
    before = SlotState("RUNNING", 24, 23, 12, 2)
    rows = [
        SlotRow("s[0]", before, 0, 0, "preempted", SlotState("PREEMPTED", 0, 23, 12, 2), before),
        SlotRow("s[1]", SlotState("WAITING", 0, 5, 0, 0), 5, 0, "admitted",
                SlotState("RUNNING", 5, 5, 3, 5), SlotState("RUNNING", 5, 6, 3, 0)),
    ]  # fmt: skip
    assert schedule_table(rows) == [
        "the step, request by request:",
        "request | before   computed  tokens  blocks  in flight | scheduled  drafts  decision  "
        "| after schedule()  computed  blocks | after the output  computed  tokens  blocks",
        "s[0]    | RUNNING        24      23      12          2 |         0       0  preempted "
        "| PREEMPTED                0      12 | RUNNING                 24      23      12",
        "s[1]    | WAITING         0       5       0          0 |         5       0  admitted  "
        "| RUNNING                  5       3 | RUNNING                  5       6       3",
    ]
    assert schedule_table([]) == []


def test_processes_give_the_serial_table_in_the_same_order(tmp_path: Path) -> None:
    args = (
        "--trace-dir",
        str(tmp_path),
        "--max-n",
        "3",
        "--only",
        "SEQS",
        "--only",
        "ORDER",
        "--variant",
        "max-num-seqs-off-by-one",
    )

    def table(out: str) -> list[list[str]]:
        return [
            line.split()[:3]
            for line in out.splitlines()
            if line.split()[:1] in (["SEQS"], ["ORDER"])
        ]

    serial_code, serial = run(*args, "--jobs", "1")
    parallel_code, parallel = run(*args, "--jobs", "2")
    assert serial_code == parallel_code
    assert len(table(serial)) == 7
    assert table(serial) == table(parallel)


def test_unknown_invariant_is_a_usage_error_naming_the_flag() -> None:
    code, out = run("--only", "NOPE")
    assert code == 2
    assert "--only" in out and "NOPE" in out


def test_bad_numbers_name_the_flag_and_bound() -> None:
    code, out = run("--max-n", "-1")
    assert code == 2 and "--max-n" in out and "0<=x<=16" in out
    code, out = run("--timeout", "0")
    assert code == 2 and "--timeout" in out and "more than 0 and at most 86400 seconds" in out


def test_contracts_runs_crosshair_with_a_full_report() -> None:
    """Every contract of sizing.py is reported, one line each, then the count."""
    code, out = run("--contracts")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("CrossHair: the contracts of ") and "sizing.py" in lines[0]
    confirmed = [line for line in lines if line.endswith("info: Confirmed over all paths.")]
    assert len(confirmed) >= 20
    assert (
        lines[-1]
        == f"{len(confirmed)} conditions confirmed over all paths, 0 counterexamples, 0 undecided"
    )


def test_contracts_refuses_the_z3_flags() -> None:
    code, out = run("--contracts", "--only", "BUDGET", "--max-n", "2")
    assert code == 2
    assert "--max-n, --only: flags of the Z3 proofs, which --contracts does not run" in out


def test_determined_is_proved_for_all_n_and_one_slot() -> None:
    code, out = run("--max-n", "1", "--only", "DETERMINED", "--jobs", "1")
    assert code == 0, out
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith("DETERMINED")]
    assert rows == [["DETERMINED", "all", "proved"], ["DETERMINED", "1", "proved"]]


def test_determined_without_a_strengthening_fails_with_the_open_decision() -> None:
    code, out = run(
        "--max-n", "1", "--only", "DETERMINED", "--drop", "preempt-needed", "--jobs", "1"
    )
    assert code == 1, out
    assert "vllm-v1 profile without preempt-needed" in out
    assert "counterexample: DETERMINED lemma victims without preempt-needed" in out
    # The two engines' decisions on the one request: one serves it, one preempts it.
    assert " b[0].preempted=True" in out or " a[0].preempted=True" in out
    assert "cross-checks DISAGREE" not in out


def test_drop_needs_determined() -> None:
    code, out = run("--only", "BUDGET", "--drop", "preempt-needed")
    assert code == 2
    assert "--only DETERMINED" in out


def test_determined_has_its_own_cross_check_bound() -> None:
    code, out = run("--max-n", "0", "--determined-max-n", "0", "--only", "DETERMINED")
    assert code == 0, out
    rows = [line.split()[:3] for line in out.splitlines() if line.startswith("DETERMINED")]
    assert rows == [["DETERMINED", "all", "proved"]]
