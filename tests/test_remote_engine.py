"""An engine in another interpreter (schedspec/engines/remote/): the same protocol over a
pipe, the same failure and exit-code contract as in this process, the same steps for a
seed, and no process left behind.

"Another interpreter" is this venv's own Python in a process of its own (the pipe, the
handshake and the reaping are the same whichever venv it is); the last test crosses to
SCHEDSPEC_SGLANG_VENV where CI names one. Engines with habits the pipe must carry are
in tests/remote_engines.py, those that fail in tests/fault_engines.py.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from click.testing import CliRunner, Result

import schedspec
from schedspec.cli.main import main
from schedspec.engines import registry
from schedspec.engines.boundary import guarded
from schedspec.engines.errors import EngineExitError, engine_call_of
from schedspec.engines.protocol import EngineAdapter
from schedspec.engines.remote import wire
from schedspec.engines.remote.engine import RemoteEngineFactory
from schedspec.engines.remote.errors import (
    EngineProcessExitError,
    ForeignError,
    RemoteSetupError,
)
from schedspec.engines.watchdog import StepTimeoutError, Watchdog
from schedspec.properties.suite import SuiteSettings, run_suite
from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestError,
    SchedulerConfig,
    SchedulerOutput,
)
from tests.sglang_required import SGLANG_VENV_VARIABLE

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent
QUICK = ("--seed", "3", "--examples", "4", "--max-steps", "12")
CONFIG = SchedulerConfig(
    block_size=2,
    num_blocks=8,
    max_num_batched_tokens=8,
    max_num_seqs=2,
    max_model_len=16,
    num_speculative_tokens=1,
)


@pytest.fixture
def factory() -> Iterator[RemoteEngineFactory]:
    with RemoteEngineFactory("reference", PYTHON) as made:
        yield made


def remote(engine: str) -> RemoteEngineFactory:
    return RemoteEngineFactory(engine, PYTHON)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def gone(pid: int) -> bool:
    """The process ended and was reaped: no such process, not even a zombie."""
    return not Path(f"/proc/{pid}").exists()


def drive(engine: EngineAdapter) -> list[object]:
    """Every protocol call once or more, and what each returned."""
    seen: list[object] = [engine.profiles]
    engine.add_request(Request("a", (1, 2, 3), 3))
    engine.add_request(Request("b", (4, 5), 2))
    for _ in range(3):
        output = engine.schedule()
        sampled = {rid: [7] for rid in output.num_scheduled_tokens}
        seen += [output, engine.update_from_output(output, ModelRunnerOutput(sampled))]
        engine.update_draft_token_ids({"a": (9,)})
        seen.append(engine.snapshot())
    engine.finish_requests(iter(["a", "nobody"]))  # an iterator does not pickle
    seen.append(engine.snapshot())
    return seen


# --------------------------------------------------------------------- the protocol


def test_every_call_round_trips_as_it_does_in_this_process(
    factory: RemoteEngineFactory,
) -> None:
    assert drive(factory(CONFIG)) == drive(registry.load_engine_factory("reference")(CONFIG))


def test_an_output_handed_back_is_the_object_the_engine_returned() -> None:
    """gpu_impl's adapter checks identity: update_from_output gets the very object."""
    with remote("tests.remote_engines:identity_checking") as factory:
        engine = factory(CONFIG)
        engine.add_request(Request("a", (1, 2), 2))
        first, second = engine.schedule(), engine.schedule()  # two in flight
        engine.update_from_output(first, ModelRunnerOutput({"a": [3]}))
        # An equal copy is not the engine's object: refused there, as in-process.
        copy = SchedulerOutput(**vars(second))
        with pytest.raises(AssertionError, match="did not return"):
            engine.update_from_output(copy, ModelRunnerOutput({}))


def test_what_the_engine_prints_does_not_reach_the_pipe() -> None:
    with remote("tests.remote_engines:noisy") as factory:
        result = run_suite(factory, "vllm-v1", SuiteSettings(examples=3, seed=1))
    assert result.passed, result.other_error


def test_a_dropped_engine_is_dropped_in_its_process_too(factory: RemoteEngineFactory) -> None:
    engine = factory(CONFIG)
    del engine
    gc.collect()
    assert factory.process._dropped == [0]  # told on the next call
    kept = factory(CONFIG)
    assert factory.process._dropped == []
    kept.snapshot()


# ----------------------------------------------------------------------- failures


def test_what_the_engine_raises_is_raised_here_attributed_to_the_call() -> None:
    with remote("tests.fault_engines:crashes_in_snapshot") as factory:
        engine = guarded(factory)(CONFIG)
        engine.snapshot(), engine.snapshot()
        with pytest.raises(KeyError, match="a block table went missing") as caught:
            engine.snapshot()
    assert engine_call_of(caught.value) == "snapshot()"
    (note,) = caught.value.__notes__
    assert "raised in the engine's process (pid" in note
    assert "fault_engines.py" in note and "in snapshot" in note


def test_a_refusal_stays_a_refusal_of_its_own_type(factory: RemoteEngineFactory) -> None:
    engine = factory(CONFIG)
    engine.add_request(Request("a", (1,), 1))
    with pytest.raises(RequestError, match="duplicate request id") as caught:
        engine.add_request(Request("a", (1,), 1))
    assert caught.value.field == "request_id"


def test_a_refusal_of_a_type_only_the_engine_has_is_still_a_value_error() -> None:
    with remote("tests.remote_engines:foreign_refusal") as factory:
        engine = factory(CONFIG)
        with pytest.raises(ValueError, match="no room for 'foreign'") as caught:
            engine.add_request(Request("foreign", (1,), 1))
        assert isinstance(caught.value, ForeignError)
        assert type(caught.value).__name__ == "QueueFullError"
        # And the suite takes it for a refusal: DOOR judges it, nothing crashes.
        result = run_suite(factory, "safety", SuiteSettings(examples=3, seed=2))
    assert result.passed, result.other_error


def test_an_exit_the_door_traps_there_is_engine_exit_error_here() -> None:
    with remote("tests.fault_engines:exits_in_schedule") as factory:
        engine = guarded(factory)(CONFIG)
        engine.schedule(), engine.schedule()
        with pytest.raises(EngineExitError) as caught:
            engine.schedule()
        assert (caught.value.call, caught.value.status) == ("schedule()", 0)
        assert factory.process.running  # trapped: the process lives on


@pytest.mark.parametrize(
    ("engine", "status", "call"),
    [
        ("tests.fault_engines:kills_its_process", -signal.SIGKILL, "schedule()"),
        ("tests.remote_engines:exits_from_native_code", 7, "update_from_output()"),
    ],
)
def test_a_process_that_ends_under_a_call_is_an_engine_that_ended_it(
    engine: str, status: int, call: str
) -> None:
    with remote(engine) as factory:
        built = guarded(factory)(CONFIG)
        built.add_request(Request("a", (1,), 9))
        pid = factory.process.popen.pid
        with pytest.raises(EngineProcessExitError) as caught:
            for _ in range(3):
                built.update_from_output(built.schedule(), ModelRunnerOutput({"a": [1]}))
        assert isinstance(caught.value, EngineExitError)  # exit 4, as in-process
        assert (caught.value.call, caught.value.status) == (call, status)
        assert f"(pid {pid}, {PYTHON})" in str(caught.value)
        assert gone(pid)
        with pytest.raises(EngineProcessExitError):  # the engine's process is gone
            built.snapshot()
        factory(CONFIG).snapshot()  # the next engine gets a new process


def test_a_hung_engine_is_the_watchdogs_and_its_process_is_killed() -> None:
    with remote("tests.fault_engines:hangs_in_update") as factory, Watchdog(0.5) as watchdog:
        engine = guarded(factory, watchdog)(CONFIG)
        engine.add_request(Request("a", (1,), 9))
        pid = factory.process.popen.pid
        with pytest.raises(StepTimeoutError) as caught:
            for _ in range(3):
                engine.update_from_output(engine.schedule(), ModelRunnerOutput({"a": [1]}))
    assert caught.value.call == "update_from_output()"
    (stack,) = caught.value.__notes__
    assert "was stuck here" in stack and "fault_engines.py" in stack
    assert gone(pid)


def test_ctrl_c_in_a_call_stops_the_process() -> None:
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    with remote("tests.fault_engines:hangs_in_update") as factory:
        engine = factory(CONFIG)
        engine.add_request(Request("a", (1,), 9))
        pid = factory.process.popen.pid
        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            with pytest.raises(KeyboardInterrupt):
                for _ in range(3):
                    engine.update_from_output(engine.schedule(), ModelRunnerOutput({"a": [1]}))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    assert gone(pid)


def test_the_process_is_reaped_when_the_factory_and_its_engines_go() -> None:
    factory = remote("reference")
    engine = factory(CONFIG)
    pid = factory.process.popen.pid
    del factory
    gc.collect()
    assert not gone(pid)  # an engine still needs it
    engine.snapshot()
    del engine
    gc.collect()
    assert gone(pid)


# ------------------------------------------------------------------- refused setups


def test_an_interpreter_that_is_not_there_is_a_usage_error_naming_the_flag() -> None:
    result = invoke("diff", "--right", "reference", "--right-python", "/no/such/python")
    assert result.exit_code == 2
    assert "Invalid value for '--right-python': /no/such/python: No such file" in result.output


def test_an_interpreter_without_schedspec_is_a_usage_error_saying_so(tmp_path: Path) -> None:
    """This Python with neither site-packages (-S) nor the working directory (-I) on
    its path: a Python without schedspec."""
    bare = tmp_path / "python"
    base = getattr(sys, "_base_executable", sys.executable)  # a venv's: the Python it is of
    bare.write_text(f'#!/bin/sh\nexec {base} -I -S "$@"\n')
    bare.chmod(0o755)
    result = invoke("diff", "--left-python", str(bare), "--right", "reference")
    assert result.exit_code == 2
    assert "Invalid value for '--left-python'" in result.output
    assert "No module named 'schedspec'" in result.output
    assert "-m pip install -e" in result.output


def test_an_engine_whose_dependency_is_missing_there_blames_the_interpreter() -> None:
    missing = [e for e in ("sglang", "vllm") if registry.ENGINES[e].needs[0].missing()]
    if not missing:
        pytest.skip("every engine's dependency is installed in this venv")
    result = invoke("diff", "--right", missing[0], "--right-python", PYTHON, *QUICK)
    assert result.exit_code == 2
    assert "Invalid value for '--right-python'" in result.output
    assert f"engine {missing[0]!r} needs" in result.output


def test_an_engine_name_that_does_not_resolve_there_blames_the_engine_flag() -> None:
    result = invoke("check", "--engine", "nosuch:thing", "--python", PYTHON, *QUICK)
    assert result.exit_code == 2
    assert "Invalid value for '--engine'" in result.output and "'nosuch'" in result.output


@pytest.mark.parametrize("what", ["protocol", "version"])
def test_another_schedspec_there_is_refused(monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """The child runs the real schedspec; this process pretends to be another."""
    if what == "protocol":
        monkeypatch.setattr(wire, "PROTOCOL", wire.PROTOCOL + 1)
    else:
        monkeypatch.setattr(schedspec, "__version__", "0.0.0-other")
    with pytest.raises(RemoteSetupError, match="runs another schedspec: it runs schedspec"):
        remote("reference")
    result = invoke("diff", "--right", "reference", "--right-python", PYTHON, *QUICK)
    assert result.exit_code == 2
    assert "Invalid value for '--right-python'" in result.output


# ------------------------------------------------------------------ the commands


def counts(output: str) -> str:
    """The line of a run's counts, its timing left out."""
    (line,) = re.findall(r"^examples: .*steps checked: \d+  events: \d+", output, re.M)
    return str(line)


def test_a_diff_checks_the_same_steps_with_either_side_over_the_pipe(tmp_path: Path) -> None:
    victim = ("--right", "tests.diff_engines:victim", "--seed", "8", "--max-steps", "20")
    pair = ("diff", *victim, "--examples", "30", "--trace-dir", str(tmp_path), "--no-shrink")
    here = invoke(*pair)
    assert here.exit_code == 3, here.output
    for side in ("--left-python", "--right-python"):
        there = invoke(*pair, side, PYTHON)
        assert there.exit_code == 3, there.output
        assert counts(there.output) == counts(here.output)
        assert f"{side} {PYTHON} --profile" in there.output  # the replay command keeps it


def test_a_crash_over_the_pipe_exits_4_with_the_engines_traceback() -> None:
    engine = "tests.fault_engines:crashes_in_snapshot"
    result = invoke("diff", "--right", engine, "--right-python", PYTHON, *QUICK)
    assert result.exit_code == 4, result.output
    assert "raised in the engine's process" in result.output
    assert "planted: a block table went missing" in result.output


def marked(mark: str) -> list[int]:
    """The processes alive (a zombie has no environment left) whose environment holds
    `mark`: those a run started, whoever their parent is now."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def wait_until(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done()


@pytest.mark.parametrize(
    ("engine", "stop", "exit_code"),
    [
        ("tests.fault_engines:crashes_in_snapshot", None, 4),  # the run ends on its own
        ("tests.fault_engines:slow", signal.SIGINT, 130),  # Ctrl-C
        ("tests.fault_engines:slow", signal.SIGTERM, 143),  # a CI runner cancelling
        ("tests.fault_engines:slow", signal.SIGKILL, -signal.SIGKILL),  # no clean-up at all
    ],
)
def test_no_process_is_left_when_a_run_ends(
    tmp_path: Path, engine: str, stop: signal.Signals | None, exit_code: int
) -> None:
    """A real run, as a user starts it; its processes found by a mark in their
    environment, which the engine's process inherits."""
    mark = f"SCHEDSPEC_TEST_RUN={uuid.uuid4()}"
    name, value = mark.split("=")
    run = subprocess.Popen(
        [PYTHON, "-m", "schedspec", "diff", "--right", engine, "--right-python", PYTHON, *QUICK],
        cwd=tmp_path,
        env={**os.environ, name: value, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
    )
    try:
        if stop is not None:
            assert wait_until(lambda: len(marked(mark)) == 2, 60)  # the run and its engine's
            run.send_signal(stop)
        assert run.wait(60) == exit_code
        # Without clean-up, the engine's process sees its parent gone and ends itself.
        assert wait_until(lambda: not marked(mark), 5), marked(mark)
    finally:
        run.kill()
        run.wait()


def test_a_hang_over_the_pipe_exits_5() -> None:
    engine = "tests.fault_engines:hangs_in_update"
    result = invoke("check", "--engine", engine, "--python", PYTHON, "--step-timeout", "0.5")
    assert result.exit_code == 5, result.output
    assert "was stuck here" in result.output


def test_workers_carry_the_interpreter(tmp_path: Path) -> None:
    args = ("diff", "--right", "reference", "--right-python", PYTHON, *QUICK)
    result = invoke(*args, "--workers", "2", "--trace-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output


def test_diff_replay_and_replay_take_the_interpreter(tmp_path: Path) -> None:
    check = ("check", "--engine", "tests.broken_engines:wrong_total", "--python", PYTHON)
    found = invoke(*check, "--seed", "1", "--no-shrink", "--trace-dir", str(tmp_path))
    assert found.exit_code == 1, found.output
    (replay,) = re.findall(r"^replay it: schedspec (replay .*)$", found.output, re.M)
    assert f"--python {PYTHON}" in replay
    assert invoke(*replay.split()).exit_code == 1
    (trace,) = tmp_path.glob("*.json")
    args = ("diff-replay", str(trace), "--right", "tests.broken_engines:wrong_total")
    assert invoke(*args, "--right-python", PYTHON).exit_code == 1


def test_swarm_mode_refuses_an_interpreter() -> None:
    result = invoke("check", "--engine", "gpu", "--instances", "2", "--python", PYTHON)
    assert result.exit_code == 2
    assert "--python: not used in swarm mode" in result.output


def test_another_venv(tmp_path: Path) -> None:
    """Across venvs for real: the reference in CI's SGLang venv, diffed against this one's."""
    venv = os.environ.get(SGLANG_VENV_VARIABLE)
    python = Path(venv or "", "bin", "python")
    if venv is None or not python.exists() or Path(sys.prefix).resolve() == Path(venv).resolve():
        pytest.skip(f"{SGLANG_VENV_VARIABLE} names no other venv")
    args = ("diff", "--right", "reference", *QUICK, "--trace-dir", str(tmp_path))
    here, there = invoke(*args), invoke(*args, "--right-python", str(python))
    assert (here.exit_code, there.exit_code) == (0, 0), there.output
    assert counts(there.output) == counts(here.output)
