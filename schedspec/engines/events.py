"""The events of a trace: what the harness does to an engine, in order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from schedspec.engines.fake_model import StepDecisions
from schedspec.spec import RemoteKV, Request


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    priority: int = 0
    # What the KV connector holds for it elsewhere (a config with kv_connector).
    remote_kv: RemoteKV | None = None

    def to_request(self) -> Request:
        """A fresh spec Request: each engine gets its own object."""
        return Request(
            self.request_id,
            self.prompt_token_ids,
            self.max_tokens,
            eos_token_id=self.eos_token_id,
            stop_token_ids=self.stop_token_ids,
            priority=self.priority,
            remote_kv=self.remote_kv,
        )


@dataclass(frozen=True)
class Abort:
    request_ids: tuple[str, ...]


@dataclass(frozen=True)
class ProposeDrafts:
    num_drafts: Mapping[str, int]  # request -> how many drafts the drafter proposes


@dataclass(frozen=True)
class KVTransfers:
    """What the KV connector's worker side reports with a step's output, named so that
    it means the same on every engine: requests by id, a failed block by its request
    and its index in that request's block table. The harness turns it into the engine's
    KVConnectorOutput at the landing (properties/connector_worker.py), keeping only
    what the engine can be waiting for: a load reported done, failed or with a bad
    block must be in flight (a parked load, or one aborted while loading), a send
    must be pending. A failed load is reported done as well, as vLLM's workers do.
    """

    loads_done: tuple[str, ...] = ()
    loads_failed: tuple[str, ...] = ()
    blocks_failed: tuple[tuple[str, int], ...] = ()
    sends_done: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.loads_done or self.loads_failed or self.blocks_failed or self.sends_done)


@dataclass(frozen=True)
class Step:
    """schedule(), the model's output for it (shaped by these decisions), update_from_output().

    `aborts` arrive while the step's model runs, and the engine's own loop applies them
    where it does. vLLM's engine core drains its abort queue just before
    update_from_output of the step that lands (`EngineCore.step` and
    `step_with_batch_queue` alike): the aborted requests' blocks are freed with their
    step's output still to land. In an engine step that lands nothing, and in an SGLang
    family engine (whose loop takes aborts only at the start of an iteration), they
    apply after the step, as an Abort event would.
    """

    decisions: StepDecisions = field(default_factory=StepDecisions)
    aborts: tuple[str, ...] = ()
    # The connector's worker reports that land with this step's output.
    kv: KVTransfers = field(default_factory=KVTransfers)


@dataclass(frozen=True)
class Drain:
    """Step with no arrivals until nothing is unfinished; then the liveness checks."""


Event = AddRequest | Abort | ProposeDrafts | Step | Drain
