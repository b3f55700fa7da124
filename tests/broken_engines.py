"""Engines with planted bugs, loaded by name (`tests.broken_engines:wrong_total`) as a
user's adapter would be."""

from __future__ import annotations

import dataclasses
import signal

from schedspec.adapters.reference import ReferenceEngine
from schedspec.spec import SchedulerConfig, SchedulerOutput
from schedspec.spec.invariants import Profile


class WrongTotalEngine(ReferenceEngine):
    """Miscounts its total when it batches two or more requests: BUDGET catches it.

    Only batched steps go wrong so that the counterexample has to be searched
    for and shrunk, as a real bug's would (a bug on every step is found at once).
    """

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        if len(output.num_scheduled_tokens) < 2:
            return output
        return dataclasses.replace(
            output, total_num_scheduled_tokens=output.total_num_scheduled_tokens + 1
        )


def wrong_total(config: SchedulerConfig) -> WrongTotalEngine:
    return WrongTotalEngine(config)


class CrashingEngine(ReferenceEngine):
    """Raises on its third schedule(): a crash, not a violation."""

    calls = 0

    def schedule(self) -> SchedulerOutput:
        self.calls += 1
        if self.calls == 3:
            raise self.planted()
        return super().schedule()

    def planted(self) -> BaseException:
        return RuntimeError("planted crash in schedule()")


def crashing(config: SchedulerConfig) -> CrashingEngine:
    return CrashingEngine(config)


class SafetyOnlyEngine(ReferenceEngine):
    """Claims only the safety profile, as an engine with its own policy would."""

    profiles: frozenset[Profile] = frozenset({"safety"})


def safety_only(config: SchedulerConfig) -> SafetyOnlyEngine:
    return SafetyOnlyEngine(config)


class ProfilelessEngine:
    """An adapter that forgot to declare its profiles (everything else delegated)."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.engine = ReferenceEngine(config)

    def __getattr__(self, name: str) -> object:
        if name == "profiles":
            raise AttributeError(name)
        return getattr(self.engine, name)


def profileless(config: SchedulerConfig) -> ProfilelessEngine:
    return ProfilelessEngine(config)


NOT_A_FACTORY = 42


class FlakyEngine(ReferenceEngine):
    """Raises once, on the process's 40th schedule() across every engine built: an error
    that a replay of the same example does not repeat (Hypothesis' FlakyFailure)."""

    calls_in_process = 0

    def schedule(self) -> SchedulerOutput:
        FlakyEngine.calls_in_process += 1
        if FlakyEngine.calls_in_process == 40:
            raise RuntimeError("planted one-off crash in schedule()")
        return super().schedule()


def flaky(config: SchedulerConfig) -> FlakyEngine:
    return FlakyEngine(config)


class InterruptingEngine(CrashingEngine):
    """Raises KeyboardInterrupt from its third schedule(): the engine's error, not Ctrl-C."""

    def planted(self) -> BaseException:
        return KeyboardInterrupt()


def interrupting(config: SchedulerConfig) -> InterruptingEngine:
    return InterruptingEngine(config)


class HangsWhenBuilt(ReferenceEngine):
    """Never returns from __init__: the build limit (watchdog.BUILD_TIMEOUT) reports it."""

    def __init__(self, config: SchedulerConfig) -> None:
        while True:  # no sleep: only a signal gets it out
            pass


def hangs_when_built(config: SchedulerConfig) -> HangsWhenBuilt:
    return HangsWhenBuilt(config)


class OwnsSigalrm(ReferenceEngine):
    """Installs a SIGALRM handler of its own when built, then hangs in its third
    schedule(): the watchdog takes SIGALRM back for each call."""

    calls = 0

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        signal.signal(signal.SIGALRM, lambda signum, frame: None)

    def schedule(self) -> SchedulerOutput:
        self.calls += 1
        if self.calls == 3:
            while True:
                pass
        return super().schedule()


def owns_sigalrm(config: SchedulerConfig) -> OwnsSigalrm:
    return OwnsSigalrm(config)


class FreshVictimEngine(ReferenceEngine):
    """Forgets that a victim's step is still in flight (vLLM #41190's class): under async
    scheduling a request preempted with output in flight is not marked stale, so that
    output would move the counters the preemption just reset. PREEMPT-RESET catches it,
    exactly at the corner preempted-with-output-in-flight."""

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        for request_id in output.preempted_req_ids:
            self.requests[request_id].num_stale_output_tokens = 0
        return output


def fresh_victim(config: SchedulerConfig) -> FreshVictimEngine:
    return FreshVictimEngine(config)
