"""Engines that fail the harness in every way an engine can, loaded by name
(`tests.fault_engines:hangs_in_update`) as a user's adapter would be.

Each is the reference with one fault, on the third call of one adapter method (so the
run has started: engines built, probed, stepped) unless it says otherwise:
- hanging: a busy loop the watchdog must interrupt;
- crashing: an exception in a call, or while being built;
- exiting: sys.exit or os._exit inside a call, or while being built; killing its own
  process (only a worker of `--workers` can survive that to report it);
- interrupting: Ctrl-C or SIGTERM arriving inside a call (or inside a finalizer the call
  runs, where Python swallows the KeyboardInterrupt);
- leaking: blocks never freed (an invariant breaks);
- lying: returns of the wrong type, or States and outputs the harness cannot read.
tests/fault_modules/ holds engine modules that fail at import.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping

from schedspec.adapters.reference import ReferenceEngine
from schedspec.spec import (
    ModelRunnerOutput,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from tests.broken_engines import WrongTotalEngine

FAULTY_CALL = 3  # the call (1-based) of the faulty method that misbehaves


class _CountedEngine(ReferenceEngine):
    """Counts calls per method; fault(name) is true on the faulty call of `name`."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.calls: dict[str, int] = {}

    def fault(self, method: str) -> bool:
        self.calls[method] = self.calls.get(method, 0) + 1
        return self.calls[method] == FAULTY_CALL


# ------------------------------------------------------------------ hanging


class HangsInUpdate(_CountedEngine):
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        if self.fault("update_from_output"):
            while True:  # no sleep: only a signal gets it out
                pass
        return super().update_from_output(scheduler_output, model_runner_output)


def hangs_in_update(config: SchedulerConfig) -> HangsInUpdate:
    return HangsInUpdate(config)


# ----------------------------------------------------------------- crashing


class CrashesInSnapshot(_CountedEngine):
    def snapshot(self) -> State:
        if self.fault("snapshot"):
            raise KeyError("planted: a block table went missing")
        return super().snapshot()


def crashes_in_snapshot(config: SchedulerConfig) -> CrashesInSnapshot:
    return CrashesInSnapshot(config)


class CrashesOnAbort(_CountedEngine):
    def finish_requests(self, request_ids: Iterable[str] | str) -> None:
        raise ZeroDivisionError("planted: abort divides by zero")


def crashes_on_abort(config: SchedulerConfig) -> CrashesOnAbort:
    return CrashesOnAbort(config)


def crashes_when_built(config: SchedulerConfig) -> ReferenceEngine:
    raise MemoryError("planted: cannot allocate the KV pool")


# ------------------------------------------------------------------ exiting


class ExitsInSchedule(_CountedEngine):
    """sys.exit(0): before the door trapped it, the run ended with exit 0, unchecked."""

    def schedule(self) -> SchedulerOutput:
        if self.fault("schedule"):
            sys.exit(0)
        return super().schedule()


def exits_in_schedule(config: SchedulerConfig) -> ExitsInSchedule:
    return ExitsInSchedule(config)


class UnderscoreExitsInSchedule(_CountedEngine):
    def schedule(self) -> SchedulerOutput:
        if self.fault("schedule"):
            os._exit(0)
        return super().schedule()


def underscore_exits_in_schedule(config: SchedulerConfig) -> UnderscoreExitsInSchedule:
    return UnderscoreExitsInSchedule(config)


def exits_when_built(config: SchedulerConfig) -> ReferenceEngine:
    sys.exit(3)


class KillsItsProcess(_CountedEngine):
    """SIGKILL to its own process: nothing in the process survives; a worker's parent
    reports it."""

    def schedule(self) -> SchedulerOutput:
        if self.fault("schedule"):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().schedule()


def kills_its_process(config: SchedulerConfig) -> KillsItsProcess:
    return KillsItsProcess(config)


# ------------------------------------------------------------- interrupting


# A file a test names for its --workers run: the first worker to press Ctrl-C creates it.
ONE_CTRL_C_MARKER = "SCHEDSPEC_TEST_ONE_CTRL_C"


def ctrl_c() -> None:
    """What Ctrl-C at the terminal does to this process: SIGINT where it is handled; a
    --workers process ignores it (the terminal's SIGINT reaches its parent, the driver,
    which stops the campaign), so there the parent gets it.

    A terminal sends one SIGINT, however many workers run. Where the test names a marker
    file, only the worker that creates it sends one: a second, from another worker, could
    land while the driver's clean-up runs a finalizer, where Python can only report the
    KeyboardInterrupt as unraisable (a failed test, not a stopped campaign)."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    marker = os.environ.get(ONE_CTRL_C_MARKER)
    if ignored and marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # another worker already pressed it
    os.kill(os.getppid() if ignored else os.getpid(), signal.SIGINT)
    if ignored:
        _wait_for_the_driver()


# Under --step-timeout 1 the wait must end well before the watchdog calls the call hung.
DRIVER_WAIT_S = 0.5


def _wait_for_the_driver() -> None:
    """Hold the call while the driver takes the SIGINT. Returning at once let this worker
    finish the campaign's last chunk first: under load the driver could then report a
    finished campaign (exit 0) before its handler ran. Held here, the driver is still
    waiting on this chunk when the signal lands, and on taking it stops this worker."""
    deadline = time.monotonic() + DRIVER_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.01)


class CtrlCInSchedule(_CountedEngine):
    """Ctrl-C while the engine runs: SIGINT, whose KeyboardInterrupt is raised where it
    is. (An engine raising KeyboardInterrupt itself is its own error:
    tests/test_hostile_blame.py.)"""

    def schedule(self) -> SchedulerOutput:
        if self.fault("schedule"):
            ctrl_c()
        return super().schedule()


def ctrl_c_in_schedule(config: SchedulerConfig) -> CtrlCInSchedule:
    return CtrlCInSchedule(config)


class PressesCtrlCWhenCollected:
    """Presses Ctrl-C (ctrl_c) from its finalizer: the handler's KeyboardInterrupt is
    raised inside __del__, where Python reports it as unraisable and goes on."""

    def __del__(self) -> None:
        ctrl_c()
        time.sleep(0.05)  # the handler runs here, inside the finalizer


class CtrlCInAFinalizer(_CountedEngine):
    """Ctrl-C while the engine runs a finalizer: the handler's KeyboardInterrupt is
    raised inside it, where Python only reports it as unraisable, and the call returns."""

    def schedule(self) -> SchedulerOutput:
        if self.fault("schedule"):
            PressesCtrlCWhenCollected()  # collected at once: its __del__ runs here
        return super().schedule()


def ctrl_c_in_a_finalizer(config: SchedulerConfig) -> CtrlCInAFinalizer:
    return CtrlCInAFinalizer(config)


class TerminatedInSchedule(_CountedEngine):
    """A CI runner cancelling the job: SIGTERM arrives while the engine runs."""

    def schedule(self) -> SchedulerOutput:
        if self.fault("schedule"):
            os.kill(os.getpid(), signal.SIGTERM)
        return super().schedule()


def terminated_in_schedule(config: SchedulerConfig) -> TerminatedInSchedule:
    return TerminatedInSchedule(config)


# ------------------------------------------------------------------ leaking


class LeaksOnAbort(ReferenceEngine):
    """Forgets an aborted request without freeing its blocks."""

    def finish_requests(self, request_ids: Iterable[str] | str) -> None:
        for rid in [request_ids] if isinstance(request_ids, str) else list(request_ids):
            request = self.requests.pop(rid, None)
            if request is not None:
                self.waiting.remove({rid})
                self.running = [r for r in self.running if r.request_id != rid]
                self.finished_req_ids.add(rid)


def leaks_on_abort(config: SchedulerConfig) -> LeaksOnAbort:
    return LeaksOnAbort(config)


# -------------------------------------------------------------------- lying


class ScheduleReturnsADict(_CountedEngine):
    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        if self.fault("schedule"):
            return dict(output.num_scheduled_tokens)  # type: ignore[return-value]
        return output


def schedule_returns_a_dict(config: SchedulerConfig) -> ScheduleReturnsADict:
    return ScheduleReturnsADict(config)


class UpdateReturnsAList(_CountedEngine):
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        reported = super().update_from_output(scheduler_output, model_runner_output)
        if self.fault("update_from_output"):
            return list(reported.values())  # type: ignore[return-value]
        return reported


def update_returns_a_list(config: SchedulerConfig) -> UpdateReturnsAList:
    return UpdateReturnsAList(config)


class SnapshotBlockOutOfRange(_CountedEngine):
    """Maps a block id past the pool into a request's table (an adapter's off-by-one)."""

    def snapshot(self) -> State:
        state = super().snapshot()
        if self.fault("snapshot") and state.requests:
            rid = next(iter(state.requests))
            request = state.requests[rid]
            bad = dataclasses.replace(request, block_ids=(*request.block_ids, 10**6))
            return dataclasses.replace(state, requests={**state.requests, rid: bad})
        return state


def snapshot_block_out_of_range(config: SchedulerConfig) -> SnapshotBlockOutOfRange:
    return SnapshotBlockOutOfRange(config)


class SnapshotCountsAsText(_CountedEngine):
    """Reports num_computed_tokens as a string (an adapter that forgot to convert)."""

    def snapshot(self) -> State:
        state = super().snapshot()
        if self.calls.get("snapshot", 0) >= FAULTY_CALL and state.requests:
            requests = {
                rid: dataclasses.replace(r, num_computed_tokens=str(r.num_computed_tokens))  # type: ignore[arg-type]
                for rid, r in state.requests.items()
            }
            state = dataclasses.replace(state, requests=requests)
        self.fault("snapshot")
        return state


def snapshot_counts_as_text(config: SchedulerConfig) -> SnapshotCountsAsText:
    return SnapshotCountsAsText(config)


class SchedulesAGhost(_CountedEngine):
    """Schedules a request id it never had."""

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        if self.fault("schedule"):
            counts: Mapping[str, int] = {**output.num_scheduled_tokens, "ghost": 1}
            return dataclasses.replace(
                output,
                num_scheduled_tokens=counts,
                total_num_scheduled_tokens=output.total_num_scheduled_tokens + 1,
            )
        return output


def schedules_a_ghost(config: SchedulerConfig) -> SchedulesAGhost:
    return SchedulesAGhost(config)


class InterruptedWhileShrinking(WrongTotalEngine):
    """Miscounts its total when it batches two requests (BUDGET breaks at once), and
    gets SIGINT (Ctrl-C) once the process has made INTERRUPT_AFTER
    schedule() calls: by then the search has failed and Hypothesis is shrinking."""

    INTERRUPT_AFTER = 150
    calls = 0  # over every instance in the process: reset by the test

    def schedule(self) -> SchedulerOutput:
        InterruptedWhileShrinking.calls += 1
        if InterruptedWhileShrinking.calls == self.INTERRUPT_AFTER:
            ctrl_c()
        return super().schedule()


def interrupted_while_shrinking(config: SchedulerConfig) -> InterruptedWhileShrinking:
    return InterruptedWhileShrinking(config)


class Slow(ReferenceEngine):
    """A correct engine that takes its time: a run on it is still going when a test
    signals it."""

    def schedule(self) -> SchedulerOutput:
        time.sleep(0.05)
        return super().schedule()


def slow(config: SchedulerConfig) -> Slow:
    return Slow(config)


# The file whose absence makes kills_its_process_once kill: the first schedule() called
# anywhere in the run creates it and kills its own process; every later call is correct.
KILL_ONCE_ENV = "SCHEDSPEC_TEST_KILL_ONCE"


class KillsItsProcessOnce(ReferenceEngine):
    """The reference, except that the first schedule() of a whole run (across
    processes: a marker file named by $SCHEDSPEC_TEST_KILL_ONCE) SIGKILLs its own
    process: the worker running that chunk is lost, and only that chunk."""

    def schedule(self) -> SchedulerOutput:
        try:
            with open(os.environ[KILL_ONCE_ENV], "x"):
                pass
        except FileExistsError:
            return super().schedule()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: SIGKILL ends the process")


def kills_its_process_once(config: SchedulerConfig) -> KillsItsProcessOnce:
    return KillsItsProcessOnce(config)
