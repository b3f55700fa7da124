"""The KV connector as the scheduler sees it (docs/SPEC.md, "The KV connector").

A connector moves KV between this engine and somewhere else: a prefill instance
(P/D disaggregation), a CPU or disk tier (offloading), a shared store. The scheduler
asks it, for a request that has nothing computed yet, how many tokens past the local
prefix hit it can supply, and whether it loads them while the engine goes on (async)
or inside the step that runs the request (sync). It tells the connector each request
that finishes, and the connector may keep the request's blocks until it has sent them
(delay_free). The worker side reports, with each step's output, the loads and sends
that completed and the loads that failed.

The spec's connector is a deterministic fake, the same for every engine
(engines/fake_connector.py): each request says in `RemoteKV` what the remote side
holds for it. The worker's reports are events of the trace (engines/events.py
KVTransfers): they name requests, and blocks by their index in a request's table,
so a trace replays on engines whose block ids differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from schedspec.spec.errors import OutputError, RequestError, shown

LoadFailurePolicy = Literal["fail", "recompute"]
# How the fake remote side's load of a request fails: not at all, as a whole
# (failed_recving), or on one block (invalid_block_ids: the first block it brought).
LoadFailure = Literal["none", "request", "block"]
LOAD_FAILURES: tuple[LoadFailure, ...] = ("none", "request", "block")
# Most steps a fake transfer may take: a trace stays short.
MAX_TRANSFER_STEPS = 16
LOAD_FAILURE_POLICIES: tuple[LoadFailurePolicy, ...] = ("fail", "recompute")

# Most None answers a request's matched-token query may give before it answers: each one
# makes the scheduler skip the request for a step, so a bound keeps a trace finite.
MAX_UNREADY_QUERIES = 64


@dataclass(frozen=True)
class RemoteKV:
    """What the remote side holds for one request, and how the fake connector serves it.

    num_tokens: the leading prompt tokens whose KV is held remotely (0: none). The
    connector offers the part past the local prefix hit: all of it under an async load
    (promotion then recomputes the last token), all but the prompt's last token under
    a sync one (a step must compute something).
    load_async: load while the engine goes on (the request parks, holding blocks) or
    inside the step that admits the request.
    num_unready_queries: the first this many queries answer None ("ask again next
    step"): the lookup is still in progress.
    send_on_finish: request_finished asks to keep the blocks (delay_free) until the
    worker reports the send finished, as a prefill instance does for its decoder.
    send_never_finishes: the worker never reports that send (a lost decoder): the blocks
    stay held for as long as the engine runs.
    The worker side (the harness, properties/state_machine.py) reads the rest: a load
    reports after load_steps engine steps, failing as load_failure says; a send
    reports after send_steps.
    """

    num_tokens: int = 0
    load_async: bool = True
    num_unready_queries: int = 0
    send_on_finish: bool = False
    send_never_finishes: bool = False
    load_steps: int = 1
    load_failure: LoadFailure = "none"
    send_steps: int = 1

    def validate(self, where: str, num_prompt_tokens: int) -> None:
        """Refuse, naming the field and its bound, what no connector could report."""
        for name in ("num_tokens", "num_unready_queries", "load_steps", "send_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise RequestError(
                    f"remote_kv.{name}", f"{where}: must be an int, got {shown(value)}"
                )
        if not 0 <= self.num_tokens <= num_prompt_tokens:
            raise RequestError(
                "remote_kv.num_tokens",
                f"{where}: must be in [0, the prompt's {num_prompt_tokens} tokens], "
                f"got {self.num_tokens}",
            )
        if not 0 <= self.num_unready_queries <= MAX_UNREADY_QUERIES:
            raise RequestError(
                "remote_kv.num_unready_queries",
                f"{where}: must be in [0, {MAX_UNREADY_QUERIES}], got {self.num_unready_queries}",
            )
        for name in ("load_steps", "send_steps"):
            if not 1 <= getattr(self, name) <= MAX_TRANSFER_STEPS:
                raise RequestError(
                    f"remote_kv.{name}",
                    f"{where}: must be in [1, {MAX_TRANSFER_STEPS}], got {getattr(self, name)}",
                )
        if self.load_failure not in LOAD_FAILURES:
            raise RequestError(
                "remote_kv.load_failure",
                f"{where}: must be one of {LOAD_FAILURES}, got {shown(self.load_failure)}",
            )
        for name in ("load_async", "send_on_finish", "send_never_finishes"):
            if not isinstance(getattr(self, name), bool):
                raise RequestError(
                    f"remote_kv.{name}",
                    f"{where}: must be a bool, got {shown(getattr(self, name))}",
                )
        if self.send_never_finishes and not self.send_on_finish:
            raise RequestError(
                "remote_kv.send_never_finishes",
                f"{where}: needs send_on_finish (no send, no report)",
            )


@dataclass(frozen=True)
class KVConnectorOutput:
    """What the worker side reports with one step's output (vLLM's KVConnectorOutput),
    in the engine's own block ids."""

    finished_recving: frozenset[str] = frozenset()  # loads that completed (failed ones too)
    failed_recving: frozenset[str] = frozenset()  # loads that failed as a whole
    invalid_block_ids: frozenset[int] = frozenset()  # blocks whose load failed
    finished_sending: frozenset[str] = frozenset()  # sends that completed

    def check_block_ids(self, num_blocks: int) -> None:
        """Refuse, naming the field and the bound, a failed block id outside the pool
        (every engine checks a report here before it changes anything)."""
        for block in self.invalid_block_ids:
            if not isinstance(block, int) or not 0 <= block < num_blocks:
                raise OutputError(
                    "kv_connector_output.invalid_block_ids",
                    f"block ids must be in [0, num_blocks ({num_blocks})), got {block!r}",
                )

    def __bool__(self) -> bool:
        return bool(
            self.finished_recving
            or self.failed_recving
            or self.invalid_block_ids
            or self.finished_sending
        )


# Where a load stands, as the engine sees it. loading: parked (WAITING_FOR_REMOTE_KVS),
# no report yet. received: parked, the worker reported it finished. failed: parked, the
# worker reported a failure that the recompute policy will recover from at promotion.
# promoted: the load is in and the request waits (WAITING or PREEMPTED) for admission,
# holding its loaded blocks.
LoadPhase = Literal["loading", "received", "failed", "promoted"]
LOAD_PHASES: tuple[LoadPhase, ...] = ("loading", "received", "failed", "promoted")

# Why a finished request's blocks are still held: the connector sends them
# (request_finished's delay_free), or the request was aborted while its load was in
# flight and the worker still writes into them.
HoldReason = Literal["sending", "loading"]


@dataclass(frozen=True)
class HeldBlocks:
    """A finished request whose blocks stay allocated until the worker reports."""

    block_ids: tuple[int, ...]
    reason: HoldReason


@dataclass(frozen=True)
class ConnectorState:
    """The connector's part of the abstract state (State.connector).

    loads: the live requests holding loaded (or loading) KV outside `running`.
    held: finished requests whose blocks wait for a report (they are no longer in
    State.requests; CONSERVATION counts their tables).
    finished_calls: every request_finished call so far, in order: the request and the
    block ids it was passed (those covering its computed tokens).
    """

    loads: Mapping[str, LoadPhase] = field(default_factory=dict)
    held: Mapping[str, HeldBlocks] = field(default_factory=dict)
    finished_calls: tuple[tuple[str, tuple[int, ...]], ...] = ()


class ConnectorModel:
    """The scheduler side of the spec's connector: the same fake for every engine (the
    reference calls it; the vLLM adapter's connector class wraps it), so that a trace
    means the same on each.

    Readiness counts schedule() calls, not queries: the matched-token query has no
    side effects (vLLM's contract: it may be asked again, or for a request that is then
    not admitted), so a request is ready once `num_unready_queries` steps have been
    scheduled since it arrived.

    An async load is served once, as a prefill instance's KV is: once the worker reports
    it in, the remote side offers that request nothing more (a preempted or a
    recomputing request computes locally). A sync load is offered again after a
    preemption, as an offloading tier's copy is.
    """

    def __init__(self) -> None:
        self._arrived_at: dict[str, int] = {}  # request -> schedule() calls before it arrived
        self._num_steps = 0
        self._served: set[str] = set()  # async loads the worker reported in
        self.finished_calls: list[tuple[str, tuple[int, ...]]] = []

    def on_new_request(self, request_id: str) -> None:
        self._arrived_at[request_id] = self._num_steps

    def on_schedule(self) -> None:
        """Once per schedule() call, after its decisions (vLLM's build_connector_meta)."""
        self._num_steps += 1

    def get_num_new_matched_tokens(
        self,
        request_id: str,
        remote: RemoteKV | None,
        num_tokens: int,
        num_local_hit: int,
    ) -> tuple[int | None, bool]:
        """(tokens past the local hit the connector supplies, whether it loads them
        async); (None, False) when the lookup is not ready: ask again next step. An
        async load may cover the whole prompt; a sync one leaves the last token to
        compute."""
        if remote is None or remote.num_tokens == 0 or request_id in self._served:
            return 0, False
        waited = self._num_steps - self._arrived_at.get(request_id, self._num_steps)
        if waited < remote.num_unready_queries:
            return None, False
        limit = num_tokens if remote.load_async else num_tokens - 1
        external = min(remote.num_tokens, limit) - num_local_hit
        if external <= 0:
            return 0, False
        return external, remote.load_async

    def update_connector_output(self, report: KVConnectorOutput) -> None:
        """The worker's report, before the scheduler acts on it: the loads it reports in
        whole have been served."""
        self._served |= report.finished_recving - report.failed_recving

    def request_finished(
        self,
        request_id: str,
        remote: RemoteKV | None,
        finished_normally: bool,
        block_ids: tuple[int, ...],
    ) -> bool:
        """Record the call; return delay_free: keep the blocks until the send is reported.
        Only a request that finished normally (stop or length) with KV to send sends."""
        self.finished_calls.append((request_id, block_ids))
        self._arrived_at.pop(request_id, None)
        self._served.discard(request_id)
        return bool(
            remote is not None and remote.send_on_finish and finished_normally and block_ids
        )


Item = TypeVar("Item")


def interleaved(
    waiting: Sequence[Item], async_waiting: Sequence[Item], goes_first: Callable[[Item, Item], bool]
) -> list[Item]:
    """The order admission takes the plain queue and the async-load queue in (vLLM 0.34.0's
    _next_waiting_queue): at each pick the async queue's head when it goes before the
    plain queue's (goes_first(async_head, head): arrived earlier under fcfs, a smaller
    (priority, arrival) under priority), else the plain queue's."""
    order: list[Item] = []
    i = j = 0
    while i < len(waiting) or j < len(async_waiting):
        if j < len(async_waiting) and (
            i == len(waiting) or goes_first(async_waiting[j], waiting[i])
        ):
            order.append(async_waiting[j])
            j += 1
        else:
            order.append(waiting[i])
            i += 1
    return order
