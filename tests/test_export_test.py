"""`schedspec export-test`: a trace as a standalone pytest file (schedspec/export/).

A worked example shows the file's shape event by event; each refusal names the trace's
field and exits 2; a long prompt stays within the line length; and the files written
for traces that pass (F1's padding, the probes' drains) pass on vLLM. The four findings'
files, failing on the bug and passing on the fix, are tests/test_export_test_findings.py's.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from schedspec.cli.main import main
from schedspec.engines.events import Abort, AddRequest, Drain, ProposeDrafts, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.export.lowering import ExportError
from schedspec.export.source import LINE_LENGTH
from schedspec.export.test_file import failed_at
from schedspec.export.writers import export_test
from schedspec.spec import RemoteKV, SchedulerConfig
from schedspec.spec.invariants import drain_step_bound
from schedspec.traces.trace import Trace
from tests.pytest_run import run_pytest, sglang_python

ROOT = Path(__file__).resolve().parent.parent
CONFIG = SchedulerConfig(
    block_size=2,
    num_blocks=8,
    max_num_batched_tokens=8,
    max_num_seqs=2,
    max_model_len=16,
    num_speculative_tokens=2,
    pad_spec_decode=True,
)
EXAMPLE = Trace(
    CONFIG,
    (
        AddRequest("r0", (1, 2, 3), 4, eos_token_id=5, stop_token_ids=(7,), priority=1),
        AddRequest("r1", (9,), 2),
        Step(),
        ProposeDrafts({"r0": 2, "r1": 0}),
        Step(StepDecisions(stops={"r0": 5}, accepted={"r0": 1}), aborts=("r1",)),
        Abort(("r0",)),
        Drain(),
    ),
    note="a worked example",
)


def imported(text: str) -> list[str]:
    """The modules a Python file imports."""
    found: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def test_a_worked_example_becomes_one_call_an_event() -> None:
    text = export_test(EXAMPLE, "example.json", "vllm", "issue 1")
    compile(text, "example.py", "exec")  # a Python file
    assert text.startswith('"""Regression test: issue 1.\n')
    assert "`schedspec export-test example.json --for vllm --finding 'issue 1'`" in text
    assert "    a worked example\n" in text  # the trace's note
    assert not [name for name in imported(text) if name.startswith("schedspec")]
    for constant in ("BLOCK_SIZE = 2", "NUM_BLOCKS = 8", "NUM_SPECULATIVE_TOKENS = 2"):
        assert f"\n{constant}" in text
    body = text[text.index("def test_example(") :].splitlines()
    assert body == [
        "def test_example(tmp_path: Path) -> None:",
        "    run = start(tmp_path)",
        '    add_request(run, "r0", [1, 2, 3], max_tokens=4, priority=1, eos_token_id=5, '
        "stop_token_ids=(7,))",
        '    add_request(run, "r1", [9], max_tokens=2)',
        "    step(run)",
        '    propose_drafts(run, {"r0": 2, "r1": 0})',
        '    step(run, accepted={"r0": 1}, stops={"r0": 5}, aborts=("r1",))',
        '    abort(run, ("r0",))',
        f"    drain(run, max_steps={drain_step_bound(CONFIG, 2)})",
    ]


@pytest.mark.parametrize(
    ("note", "index"),
    [
        ("after event 5 (Step):\n  [CACHE-CONTENT] block 4: ...", 5),
        ("admitted at #3; at #6 the next chunk cannot be allocated", 6),  # the last named
        ("after event 9 (Step)", None),  # past the trace's 7 events
        ("a worked example", None),
    ],
)
def test_the_event_the_note_names_is_marked(note: str, index: int | None) -> None:
    assert failed_at(note, len(EXAMPLE.events)) == index
    text = export_test(replace(EXAMPLE, note=note), "t.json", "vllm")
    body = text[text.index("def test_t(") :].splitlines()
    marks = [n for n, line in enumerate(body) if "schedspec saw the failure" in line]
    # Before the event's line: the body's first two lines are the def and start().
    assert marks == ([] if index is None else [index + 2])


def test_a_long_prompt_is_wrapped_within_the_line_length() -> None:
    trace = Trace(CONFIG, (AddRequest("r0", tuple(range(100, 115)), 1),))
    wide = replace(trace, config=replace(CONFIG, max_model_len=64, num_blocks=40))
    long = replace(wide, events=(AddRequest("r0", tuple(range(1000, 1040)), 1),))
    text = export_test(long, "t.json", "vllm")
    assert max(len(line) for line in text.splitlines()) <= LINE_LENGTH
    body = text[text.index("def test_t(") :]
    assert "    # fmt: off\n    add_request(\n" in body and body.endswith("    # fmt: on\n")
    compile(text, "t.py", "exec")


@pytest.mark.parametrize(
    ("trace", "engine", "field"),
    [
        (
            replace(EXAMPLE, config=replace(CONFIG, async_scheduling=True)),
            "vllm",
            "config.async_scheduling",
        ),
        (EXAMPLE, "sglang", "config.family"),
        (
            replace(EXAMPLE, config=replace(CONFIG, pad_spec_decode=False)),
            "vllm",
            "config.pad_spec_decode",
        ),
        (
            replace(EXAMPLE, events=(AddRequest("r0", (1,), 4, remote_kv=RemoteKV(1)),)),
            "vllm",
            "events[0].remote_kv",
        ),
    ],
    ids=["async", "family", "padding", "connector"],
)
def test_what_the_engine_file_cannot_express_is_refused_naming_the_field(
    trace: Trace, engine: str, field: str
) -> None:
    with pytest.raises(ExportError) as refused:
        export_test(trace, "t.json", engine)
    assert refused.value.field == field


def test_drafts_for_sglang_are_refused_naming_the_event() -> None:
    config = SchedulerConfig(
        family="sglang",
        block_size=2,
        num_blocks=16,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        max_model_len=16,
    )
    trace = Trace(config, (AddRequest("r0", (1, 2), 2), Step(StepDecisions(accepted={"r0": 0}))))
    with pytest.raises(ExportError) as refused:
        export_test(trace, "t.json", "sglang")
    assert refused.value.field == "events[1].accepted"


def test_the_command_writes_the_file_and_refuses_with_exit_2(tmp_path: Path) -> None:
    EXAMPLE.save(tmp_path / "ok.json")
    out = tmp_path / "test_ok.py"
    done = CliRunner().invoke(
        main, ["export-test", str(tmp_path / "ok.json"), "--for", "vllm", "-o", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert out.read_text() == export_test(EXAMPLE, str(tmp_path / "ok.json"), "vllm")
    replace(EXAMPLE, config=replace(CONFIG, async_scheduling=True)).save(tmp_path / "a.json")
    done = CliRunner().invoke(main, ["export-test", str(tmp_path / "a.json"), "--for", "vllm"])
    assert done.exit_code == 2
    assert "config.async_scheduling" in done.output
    done = CliRunner().invoke(
        main,
        ["export-test", str(tmp_path / "ok.json"), "--for", "vllm", "--engine-arg", "no-equals"],
    )
    assert done.exit_code == 2 and "NAME=VALUE" in done.output


def test_a_request_the_door_refuses_is_left_out_with_why() -> None:
    """The engine's front end refuses it before the scheduler sees it (the spec's DOOR)."""
    trace = replace(EXAMPLE, events=(AddRequest("r0", (), 4), AddRequest("r1", (1,), 4)))
    assert export_test(trace, "t.json", "vllm").splitlines()[-3:] == [
        "    # events[0]: request 'r0' left out, the front end refuses it: prompt_token_ids: "
        "request 'r0':",
        "    # the prompt must not be empty",
        '    add_request(run, "r1", [1], max_tokens=4)',
    ]


PASSING = {
    "vllm": (
        "vllm-spec-decode-padding.json",  # F1: drafts and padding, every invariant holds
        "probe-head-of-line-blocking.json",  # a drain
        "probe-priority-preempted-place.json",  # priority preemption, a drain
    ),
    "sglang": (
        "sglang-evict-order-not-observable.json",  # the radix cache evicts
        "sglang-stop-demoted-to-length-at-zero-budget.json",  # aborts, refused prompts, stops
    ),
}


# Drafts proposed, accepted and rejected, a forced stop, an abort in flight and one
# between steps, prefix hits and the long-prefill cap: `schedspec replay --engine vllm`
# passes it under vllm-v1, and so must its file.
DRAFTS = Trace(
    SchedulerConfig(
        block_size=2,
        num_blocks=24,
        max_num_batched_tokens=8,
        max_num_seqs=3,
        max_model_len=24,
        long_prefill_token_threshold=4,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        num_lookahead_tokens=0,
        pad_spec_decode=True,
    ),
    (
        AddRequest("r0", (1, 2, 3, 4, 5, 6, 7), 6, eos_token_id=3),
        AddRequest("r1", (1, 2, 3, 4, 9), 5),
        Step(),
        Step(),
        ProposeDrafts({"r0": 2, "r1": 1}),
        Step(StepDecisions(accepted={"r0": 1})),
        ProposeDrafts({"r0": 2, "r1": 2}),
        AddRequest("r2", (1, 2, 3, 4, 5, 6), 4),
        Step(StepDecisions(stops={"r1": 3}), aborts=("r2",)),
        ProposeDrafts({"r0": 2}),
        Step(),
        Abort(("r1",)),
        Drain(),
    ),
)
MADE_HERE = {"vllm": {"drafts.json": DRAFTS}, "sglang": {}}


def engine_python(engine: str) -> str:
    """The interpreter with the engine, or a skip (tests/test_export_test_findings.py)."""
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed: scripts/install_vllm.sh")
        return sys.executable
    return sglang_python("the exported SGLang tests of passing traces")


@pytest.mark.parametrize("engine", sorted(PASSING))
def test_files_for_passing_traces_pass_on_the_engine(engine: str, tmp_path: Path) -> None:
    python = engine_python(engine)
    traces = {name: Trace.load(ROOT / "docs" / "findings" / name) for name in PASSING[engine]}
    traces.update(MADE_HERE[engine])
    for name, trace in traces.items():
        test_file = tmp_path / ("test_" + name.removesuffix(".json").replace("-", "_") + ".py")
        test_file.write_text(export_test(trace, name, engine))
    done = run_pytest(python, tmp_path, ".")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(traces)} passed" in done.stdout
