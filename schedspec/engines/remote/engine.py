"""An engine in another interpreter as the harness sees every engine: an EngineFactory
whose engines are EngineAdapters.

RemoteEngineFactory(engine, python) starts one process of `python` serving `engine`
(process.py) and builds every engine in it: a process per engine would import the
engine again for every example (seconds, for vLLM). An engine the harness lets go of
is dropped there on the next call. When the process ends under a call (killed,
crashed, stopped after a hang), the next engine built starts a new one, so the
failure report's replay of the counterexample runs as it does in-process.

RemoteEngine forwards each protocol call as one round trip and returns what the
engine returned; the harness's door (engines/boundary.py) checks the types, times
the call and attributes what it raises, as for an engine in this process. A
schedule() output handed back to update_from_output goes by reference
(wire.OutputRef): the engine gets the very object it returned, as in-process.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from schedspec.engines.capabilities import Capability
from schedspec.engines.errors import BUILDING
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.engines.registry import load_engine_factory
from schedspec.engines.remote.errors import ErrorRecord, rebuild_error
from schedspec.engines.remote.process import EngineProcess
from schedspec.engines.remote.wire import BUILD, MAX_HELD_OUTPUTS, Call, OutputRef
from schedspec.spec import (
    ModelRunnerOutput,
    Request,
    RequestOutput,
    SchedulerConfig,
    SchedulerOutput,
    State,
)
from schedspec.spec.invariants import Profile


def engine_factory(name: str, python: str | None = None) -> EngineFactory:
    """The factory `name` stands for (engines/registry.py): in this interpreter, or
    with `python` given, in a process of that interpreter (RemoteSetupError, a
    ValueError, if it cannot serve the engine)."""
    if python is None:
        return load_engine_factory(name)
    return RemoteEngineFactory(name, python)


class RemoteEngineFactory:
    """Builds `engine`'s engines in a process of `python` (see the module docstring)."""

    def __init__(self, engine: str, python: str) -> None:
        self.engine = engine
        self.python = python
        self.process = EngineProcess.start(python, engine)
        self._ids = itertools.count()

    def __call__(self, config: SchedulerConfig) -> EngineAdapter:
        if not self.process.running:
            self.process = EngineProcess.start(self.python, self.engine)
        engine = next(self._ids)
        claims = self.process.request(BUILDING, Call(BUILD, engine, (config,)))
        remote = RemoteEngine(self.process, engine)  # dropped there too if claims fail
        if isinstance(claims, ErrorRecord):  # what reading its claims raised there
            raise rebuild_error(claims, self.process.describe())
        profiles, capabilities = cast("tuple[frozenset[Profile], frozenset[Capability]]", claims)
        remote.profiles = profiles
        remote.capabilities = capabilities
        return remote

    def close(self) -> None:
        """Let the process finish and reap it (also done when the factory is collected,
        and at exit)."""
        self.process.close()

    def __enter__(self) -> RemoteEngineFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteEngine:
    """One engine in the process, by its id there."""

    profiles: frozenset[Profile] = frozenset()  # the factory sets what the engine claims
    capabilities: frozenset[Capability] = frozenset()  # and what it declares

    def __init__(self, process: EngineProcess, engine: int) -> None:
        self._process = process
        self._engine = engine
        # schedule() outputs not yet handed back, by id (held, so the id stays theirs)
        self._outputs: dict[int, tuple[SchedulerOutput, int]] = {}

    def __del__(self) -> None:
        self._process.forget(self._engine)

    def _call(self, method: str, *args: object) -> object:
        return self._process.request(f"{method}()", Call(method, self._engine, args))

    def add_request(self, request: Request) -> None:
        self._call("add_request", request)

    def schedule(self) -> SchedulerOutput:
        output, handle = cast("tuple[SchedulerOutput, int | None]", self._call("schedule"))
        if handle is not None:
            self._outputs[id(output)] = (output, handle)
            if len(self._outputs) > MAX_HELD_OUTPUTS:  # as the process lets go of its own
                del self._outputs[next(iter(self._outputs))]
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Mapping[str, RequestOutput] | None:
        held = self._outputs.get(id(scheduler_output))
        sent: SchedulerOutput | OutputRef = scheduler_output
        if held is not None and held[0] is scheduler_output:
            del self._outputs[id(scheduler_output)]
            sent = OutputRef(held[1])
        reported = self._call("update_from_output", sent, model_runner_output)
        return cast("Mapping[str, RequestOutput] | None", reported)

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        self._call("update_draft_token_ids", draft_token_ids)

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        # An iterator does not pickle; what it yields does.
        sendable = (str, tuple, list, set, frozenset)
        ids = request_ids if isinstance(request_ids, sendable) else tuple(request_ids)
        self._call("finish_requests", ids)

    def snapshot(self) -> State:
        return cast(State, self._call("snapshot"))
