"""Engines that test the pipe to an engine's process (tests/test_remote_engine.py), loaded
by name in that process as a user's adapter would be: each is the reference with one
habit the pipe must carry as it is."""

from __future__ import annotations

import ctypes
import os
import sys

from schedspec.adapters.reference import ReferenceEngine
from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
)


class IdentityChecking(ReferenceEngine):
    """Refuses an output it did not return itself (as gpu_impl's adapter does): the
    pipe must hand back the very object, not an equal copy."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.returned: list[SchedulerOutput] = []

    def schedule(self) -> SchedulerOutput:
        output = super().schedule()
        self.returned.append(output)
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        if not any(scheduler_output is output for output in self.returned):
            raise AssertionError("handed an output this engine did not return")
        return super().update_from_output(scheduler_output, model_runner_output)


def identity_checking(config: SchedulerConfig) -> IdentityChecking:
    return IdentityChecking(config)


class Noisy(ReferenceEngine):
    """Prints on every step, from Python and straight to file descriptor 1 (as native
    code would): the pipe must not read it as a reply."""

    def schedule(self) -> SchedulerOutput:
        print("noisy: a step", flush=True)
        sys.stdout.buffer.write(b"\x00\x00\x00\x00\x00\x00\x00\x09garbage!!\n")
        sys.stdout.flush()
        os.write(1, b"noisy: from fd 1\n")
        return super().schedule()


def noisy(config: SchedulerConfig) -> Noisy:
    return Noisy(config)


class ForeignRefusal(ReferenceEngine):
    """Refuses request 'foreign' with a ValueError of a type only its own process has."""

    def add_request(self, request: Request) -> None:
        if request.request_id == "foreign":

            class QueueFullError(ValueError):
                pass

            raise QueueFullError("planted: no room for 'foreign'")
        super().add_request(request)


def foreign_refusal(config: SchedulerConfig) -> ForeignRefusal:
    return ForeignRefusal(config)


class ExitsFromNativeCode(ReferenceEngine):
    """Ends its process from C (libc's _exit) in its first update_from_output: no door
    can trap that."""

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        ctypes.CDLL(None)._exit(7)
        raise AssertionError("unreachable: the process has ended")


def exits_from_native_code(config: SchedulerConfig) -> ExitsFromNativeCode:
    return ExitsFromNativeCode(config)
