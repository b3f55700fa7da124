"""vLLM V1's scheduler under schedspec: an EngineAdapter, on CPU, with no model download.

The adapter drives the scheduler class vLLM's engine core would build for the config
(`AsyncScheduler` with async scheduling, else `Scheduler`), with its own KVCacheManager
and BlockPool. Where the parts are: adapters/vllm/runtime.py imports vLLM (only when an
engine is built; install it with `schedspec install vllm`);
adapters/vllm/config.py translates the config, builds the scheduler and says which
configs are refused and why; adapters/vllm/releases.py says which releases it runs (0.33.0
and 0.34.0) and maps each to the spec's knobs; adapters/vllm/output.py translates vLLM's
SchedulerOutput; this module translates each call and reads vLLM's state as the spec's.
What differs between releases' APIs is found where it is read (feature detection: the
output layout, ModelRunnerOutput's fields, the prefix-cache map, each named there).

Translation of the calls: add_request applies the checks vLLM makes above
the Scheduler (the front end's prompt-length check, duplicate ids) through
`schedspec.spec.validate_new_request`, then builds a vLLM Request with the
engine's block hasher; its arrival_time is its arrival index, so vLLM's
priority order (priority, arrival_time) is ours. Its vLLM request id is the
spec's id plus "#" and the arrival index (output.internal_id), as vLLM's
front end gives every request an internal id of its own: a client may reuse
an aborted request's id while that request's step is still in flight, and
vLLM keys its requests by id (with one id for both, vLLM applies the old
step's output to the new request). Every id is translated back on the way
out. aborts go one id at a time
(vLLM iterates a set, which would make a multi-id abort's free order, and so
later block ids, depend on string hashing).

schedule() translates vLLM's SchedulerOutput to the spec's. The V2 runner
learns a resumed request whole again: vLLM lists it among
scheduled_new_reqs, with all its token ids (`prefill_token_ids`: prompt and
outputs) and its whole block table. The spec, like the V1 runner, says
"resumed": a CachedRequestData with resumed=True, the whole table, the
computed count before the step and num_output_tokens = its outputs (a
resumed request has no placeholders: preemption zeroed them). A new request
of vLLM's output is resumed exactly when it was PREEMPTED, and only
preemption makes it so, which its num_preemptions counts.

`SchedulerOutput.skip_drafts` (V2 runner with a lookahead drafter, i.e.
EAGLE: vLLM's `can_skip_drafts`) tells the model runner to propose no drafts
after the step, because no scheduled request can use them: each is a
non-final prefill chunk or sure to reach max_tokens in this step
(`Scheduler._drafts_unused`). The scheduler's own state does not depend on
it, and the spec's SchedulerOutput has no such field. The harness's
FakeModel fills placeholder drafts with the drafter's guesses as if the
drafter had run: that models vLLM only if vLLM's claim holds, so the adapter
holds vLLM to it: a request whose last step skipped drafting must not be
scheduled again with drafts it would verify (the running loop's drafts; an
admission's padding drafts were never proposed by anyone). Seeing one is a
RuntimeError naming the request.

update_from_output() lands the oldest step in flight (vLLM's engine core
lands them in order; another step, or tokens for a request the step did not
schedule, are refused first: adapters/in_flight.py) and returns what vLLM
reports to the front end per request (its EngineCoreOutputs: kept tokens and
finish reason), which STOP checks; vLLM does not report a computed count, so
that field stays None.

The refinement mapping (`snapshot`): per request, vLLM's token lists, drafts,
num_computed_tokens, status, block table (minus the null block offset),
num_preemptions, priority and arrival index, and the async pipeline's
counters (num_in_flight_tokens, num_output_placeholders,
num_stale_output_tokens, drop_stale_output, is_prefill_chunk); the waiting
queue (kv-holding queue first, then the FCFS deque or the priority heap
drained in order, then 0.34.0's async_kv_waiting, as the reference lists them);
the running list; the free queue front to back; each block's ref count and cached hash;
the prefix-cache map. vLLM names a block's content by SHA-256 over pickled tokens, the spec by
chained BLAKE2b: each vLLM request carries its own block hashes, computed
from its tokens, so the adapter pairs vLLM hash i of a request with the spec
hash of the same request's block i (from its tokens, independent of any
block table) and translates the pool's hashes through that pairing. (With
EAGLE's lookahead hashes two vLLM hashes can name one spec hash: same block,
different next token; the prefix-cache map then lists that spec hash twice.)

With a KV connector (config.kv_connector: our connector class,
adapters/vllm/connector.py, loaded by vLLM by module path): each request's RemoteKV
rides on it as kv_transfer_params; the worker's report (ModelRunnerOutput's
kv_connector_output) becomes vLLM's KVConnectorOutput, block ids shifted past the
null block; a load that fails under "fail" finishes with vLLM's ERROR reason
(FINISHED_ERROR). The snapshot's State.connector reads vLLM's bookkeeping
(`_connector_state`); a finished request vLLM keeps in `requests` while the
connector holds its blocks is there, not among State.requests. vLLM's
drop_stale_output is mapped to what it does (see `snapshot`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from schedspec.adapters.in_flight import check_landing
from schedspec.adapters.vllm.config import build_scheduler
from schedspec.adapters.vllm.connector import remote_kv_of, remote_kv_params
from schedspec.adapters.vllm.kv_groups import PoolHashes, group_tables
from schedspec.adapters.vllm.output import (
    DraftingSkips,
    external_id,
    internal_id,
    spec_block_ids,
    spec_output,
)
from schedspec.adapters.vllm.releases import current_release
from schedspec.adapters.vllm.runtime import load_vllm, vllm_runner_output
from schedspec.engines.capabilities import VLLM_FAMILY_CAPABILITIES, Capability
from schedspec.spec import (
    BlockHash,
    KVState,
    ModelRunnerOutput,
    OutputError,
    Request,
    RequestError,
    RequestOutput,
    RequestState,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
    validate_new_request,
)
from schedspec.spec.config import require_family
from schedspec.spec.connector import (
    ConnectorState,
    HeldBlocks,
    KVConnectorOutput,
    LoadPhase,
    interleaved,
)
from schedspec.spec.invariants import Profile

_STATUS: dict[str, RequestStatus] = {
    "WAITING": RequestStatus.WAITING,
    "RUNNING": RequestStatus.RUNNING,
    "PREEMPTED": RequestStatus.PREEMPTED,
    "FINISHED_STOPPED": RequestStatus.FINISHED_STOPPED,
    "FINISHED_LENGTH_CAPPED": RequestStatus.FINISHED_LENGTH_CAPPED,
    "FINISHED_ABORTED": RequestStatus.FINISHED_ABORTED,
    "WAITING_FOR_REMOTE_KVS": RequestStatus.WAITING_FOR_REMOTE_KVS,
    "FINISHED_ERROR": RequestStatus.FINISHED_ERROR,
}
# vLLM's FinishReason names: STOP covers EOS and stop tokens (and stop strings).
_FINISH_STATUS: dict[str, RequestStatus] = {
    "STOP": RequestStatus.FINISHED_STOPPED,
    "LENGTH": RequestStatus.FINISHED_LENGTH_CAPPED,
    "ABORT": RequestStatus.FINISHED_ABORTED,
    "ERROR": RequestStatus.FINISHED_ERROR,  # a failed KV load under "fail"
}


class VllmEngine:
    """vLLM V1's scheduler (AsyncScheduler or Scheduler) seen through the spec.

    It claims vllm-v1 too: in both modes, with and without drafts, it makes every
    decision the profile pins down, outside the corners config.avoid_known_corners names
    (vLLM's findings F2 and F3, the reference's gap G1: docs/FINDINGS.md).
    """

    # What it claims for a config whose knobs describe the installed release (the
    # instance narrows it to safety where they do not: __init__).
    profiles: frozenset[Profile] = frozenset({"safety", "vllm-v1"})
    # Every knob of the vLLM family: drafts (n-gram and EAGLE), async scheduling, the KV
    # connector, both releases' knobs, hybrid KV cache groups (adapters/vllm/kv_groups.py).
    capabilities: frozenset[Capability] = VLLM_FAMILY_CAPABILITIES

    def __init__(self, config: SchedulerConfig, *, num_blocks: int | None = None) -> None:
        """num_blocks: see `build_scheduler` (probes only; the snapshot then has that many)."""
        require_family(config, "vLLM's scheduler", ("vllm",))
        self.config = config
        # First: it refuses an unsupported release before vLLM is imported.
        self.scheduler: Any = build_scheduler(config, num_blocks)
        # vLLM decides by its own release's rules; where the config's knobs state other
        # rules (Release.mismatch), vLLM's exact decisions are not the config's.
        if current_release().mismatch(config) is not None:
            self.profiles = frozenset({"safety"})
        self._v = load_vllm()
        self._block_hasher: Any = None
        if config.enable_prefix_caching:
            # As vLLM's EngineCore does: the configured hash, vLLM's hash lookahead.
            hash_fn = self._v.get_hash_fn_by_name("sha256")
            self._v.init_none_hash(hash_fn)
            # At the block size vLLM hashes at (the groups' gcd: config._resolve_block_sizes).
            self._block_hasher = self._v.get_request_block_hasher(
                self.scheduler.hash_block_size,
                hash_fn,
                self.scheduler.vllm_config.num_hash_lookahead_tokens,
            )
        self._num_arrivals = 0
        # The vLLM id of each spec id's latest request (output.internal_id).
        self._internal: dict[str, str] = {}
        # Every request added and not yet seen finished: its hashes are learned
        # even from inside the update_from_output call that frees it.
        self._tracked: dict[str, Any] = {}
        # vLLM pool key -> spec hash, per group.
        self._hashes = PoolHashes(config, self.scheduler.hash_block_size)
        # Each step scheduled and not landed, oldest first: ours and vLLM's output.
        self._in_flight: deque[tuple[SchedulerOutput, Any]] = deque()
        self._drafting = DraftingSkips()

    # ------------------------------------------------------------------ calls

    def add_request(self, request: Request) -> None:
        # vLLM checks these above the Scheduler (front end, engine core).
        validate_new_request(request, self.config)
        # A finished request whose blocks the connector holds keeps its id too.
        if self._internal.get(request.request_id) in self.scheduler.requests:
            raise RequestError("request_id", f"duplicate request id {request.request_id!r}")
        rid = internal_id(request.request_id, self._num_arrivals)
        remote = request.remote_kv
        params = self._v.SamplingParams(
            max_tokens=request.max_tokens,
            stop_token_ids=list(request.stop_token_ids),
            # How a client hands a connector its per-request parameters.
            extra_args=None if remote is None else {"kv_transfer_params": remote_kv_params(remote)},
        )
        if request.eos_token_id is not None:
            params.update_from_generation_config({}, request.eos_token_id)
        vllm_request = self._v.Request(
            request_id=rid,
            prompt_token_ids=list(request.prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(self._num_arrivals),
            priority=request.priority,
            block_hasher=self._block_hasher,
        )
        self.scheduler.add_request(vllm_request)
        self._num_arrivals += 1
        self._internal[request.request_id] = rid
        self._tracked[rid] = vllm_request
        self._learn(rid, vllm_request)

    def schedule(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        ours = spec_output(out, self.scheduler.requests)
        self._drafting.check(ours, out.skip_drafts)
        self._in_flight.append((ours, out))
        return ours

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[str, RequestOutput]:
        """Land the oldest step in flight (vLLM's engine core lands steps in the order
        it scheduled them, and vLLM's counters, num_in_flight_tokens and stale output,
        count on that). Returns what vLLM reports to the front end for each request
        that emitted tokens or finished: its kept tokens and finish status."""
        sampled = model_runner_output.sampled_token_ids
        oldest = self._in_flight[0][0] if self._in_flight else None
        check_landing(oldest, scheduler_output, sampled)
        # Refused, like the reference does, before anything changes.
        kv_output = self._kv_connector_output(model_runner_output.kv_connector_output)
        out = self._in_flight.popleft()[1]
        req_ids = list(out.num_scheduled_tokens)  # vLLM's ids of this step's requests
        runner_output = vllm_runner_output(
            self._v,
            req_ids,
            [list(sampled.get(external_id(rid), ())) for rid in req_ids],
            kv_output,
        )
        reported = self.scheduler.update_from_output(out, runner_output)
        self._learn_tracked()
        return {
            external_id(o.request_id): RequestOutput(
                external_id(o.request_id),
                tuple(o.new_token_ids),
                self._finish_status(o.finish_reason),
            )
            for engine_core_outputs in reported.values()
            for o in engine_core_outputs.outputs
        }

    def _kv_connector_output(self, report: KVConnectorOutput | None) -> Any:
        """The worker's report as vLLM's KVConnectorOutput (its request ids, its block
        ids: the spec's + 1), or None where there is none. A request the report names
        must be one vLLM still holds (live, or finished with its blocks held), as the
        reference's check_report requires; and, where vLLM asserts so halfway through
        update_from_output, a finished load must be parked or finished (held), a
        finished send finished: refused here first, before anything changes."""
        if report is None:
            return None
        if not self.config.kv_connector:
            raise OutputError("kv_connector_output", "this scheduler has no KV connector")
        known = {external_id(rid): rid for rid in self.scheduler.requests}
        # Lists, sorted by the spec's id, where vLLM's type says sets: vLLM frees the
        # blocks of finished loads and sends in the order it iterates these, and a
        # set of strings iterates in string-hash order, which changes from process to
        # process. vLLM only iterates them and tests membership, which lists serve;
        # the reference goes in sorted order too.
        ids: dict[str, list[str]] = {}
        for name in ("finished_recving", "failed_recving", "finished_sending"):
            unknown = sorted(set(getattr(report, name)) - set(known))
            if unknown:
                raise OutputError(
                    f"kv_connector_output.{name}", f"request {unknown[0]!r} has no transfer"
                )
            ids[name] = [known[rid] for rid in sorted(getattr(report, name))]
        parked = self._v.RequestStatus.WAITING_FOR_REMOTE_KVS
        for name, allowed in (("finished_recving", (parked,)), ("finished_sending", ())):
            for rid in ids[name]:
                request = self.scheduler.requests[rid]
                if not (request.is_finished() or request.status in allowed):
                    raise OutputError(
                        f"kv_connector_output.{name}",
                        f"request {external_id(rid)!r} is {request.status.name}: it has no "
                        "transfer in flight (vLLM asserts on it)",
                    )
        report.check_block_ids(self.config.num_blocks)
        return self._v.KVConnectorOutput(
            finished_sending=ids["finished_sending"],
            finished_recving=ids["finished_recving"],
            failed_recving=ids["failed_recving"],
            invalid_block_ids={b + 1 for b in report.invalid_block_ids},  # the null block
        )

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        # vLLM passes the drafts through its structured-output manager (0.33.0's
        # validate_tokens, 0.34.0's trim_spec_tokens), which changes them only for a
        # request with a grammar; the harness gives none, so both releases keep them.
        live = [(self._live_id(rid), drafts) for rid, drafts in draft_token_ids.items()]
        known = [(rid, drafts) for rid, drafts in live if rid is not None]
        self.scheduler.update_draft_token_ids(
            self._v.DraftTokenIds(
                req_ids=[rid for rid, _ in known],
                draft_token_ids=[list(drafts) for _, drafts in known],
            )
        )

    def finish_requests(self, request_ids: Iterable[str]) -> None:
        aborted = self._v.RequestStatus.FINISHED_ABORTED
        for request_id in dict.fromkeys(request_ids):
            rid = self._live_id(request_id)
            if rid is not None:
                self.scheduler.finish_requests(rid, aborted)
        self._learn_tracked()

    def _live_id(self, request_id: str) -> str | None:
        """vLLM's id of the live request the spec calls request_id, if there is one (a
        finished one whose blocks the connector holds is not live)."""
        rid = self._internal.get(request_id)
        request = None if rid is None else self.scheduler.requests.get(rid)
        return rid if request is not None and not request.is_finished() else None

    # ---------------------------------------------------- the refinement mapping

    def snapshot(self) -> State:
        s = self.scheduler
        kv = s.kv_cache_manager
        pool = kv.block_pool
        requests: dict[str, RequestState] = {}
        for rid, r in s.requests.items():
            if r.is_finished():
                continue  # its blocks wait for the connector: State.connector.held
            self._learn(rid, r)
            params = r.sampling_params
            request_id = external_id(rid)
            tables = kv.get_block_ids(rid)
            requests[request_id] = RequestState(
                request_id=request_id,
                priority=r.priority,
                arrival=int(r.arrival_time),
                prompt_token_ids=tuple(r.prompt_token_ids),
                output_token_ids=tuple(r.output_token_ids),
                spec_token_ids=tuple(r.spec_token_ids),
                num_computed_tokens=r.num_computed_tokens,
                status=self._status(r),
                block_ids=spec_block_ids(tables),
                group_block_ids=group_tables(tables) if self.config.kv_cache_groups else (),
                # Set at each prefix-cache lookup (0.33.0 and 0.34.0); 0 for one group.
                shared_prefix_boundary=r.shared_prefix_boundary,
                num_preemptions=r.num_preemptions,
                max_tokens=r.max_tokens,
                eos_token_id=params.eos_token_id,
                stop_token_ids=tuple(params.stop_token_ids or ()),
                num_in_flight_tokens=r.num_in_flight_tokens,
                num_output_placeholders=r.num_output_placeholders,
                num_stale_output_tokens=r.num_stale_output_tokens,
                # vLLM reads the flag only while stale output is in flight; a producer
                # connector (requires_kv_delivery) sets it at every preemption, stale
                # output or none, and it stays set. Without stale output it means
                # nothing, and the spec's flag is "drops the stale output it has".
                drop_stale_output=r.drop_stale_output and r.num_stale_output_tokens > 0,
                is_prefill_chunk=r.is_prefill_chunk,
                remote_kv=remote_kv_of(r) if self.config.kv_connector else None,
            )
        blocks = pool.blocks[1:]  # block 0 is the null block
        return State(
            config=self.config,
            requests=requests,
            # The order vLLM examines them in: kv-holding requests first (drained
            # before any other queue), then the FCFS deque front to back or the priority
            # heap drained in order, interleaved with 0.34.0's async_kv_waiting (filled
            # only by a connector under max_num_inflight_kv_loads) as _next_waiting_queue
            # takes them: the async queue's head first where it goes first.
            waiting=tuple(external_id(r.request_id) for r in self._waiting_order()),
            running=tuple(external_id(r.request_id) for r in s.running),
            kv=KVState(
                num_blocks=len(blocks),
                free_block_ids=tuple(
                    b.block_id - 1 for b in pool.free_block_queue.get_all_free_blocks()
                ),
                ref_counts=tuple(b.ref_cnt for b in blocks),
                block_hashes=tuple(
                    None if b.block_hash is None else self._spec_of(b.block_hash) for b in blocks
                ),
                prefix_cache=tuple(
                    (self._spec_of(key), held)
                    for key, held in _prefix_cache_entries(pool.cached_block_hash_to_block)
                ),
            ),
            connector=self._connector_state() if self.config.kv_connector else None,
        )

    def _waiting_order(self) -> list[Any]:
        s = self.scheduler
        priority = self.config.policy == "priority"

        def goes_first(async_head: Any, head: Any) -> bool:
            if priority:
                return bool(
                    (async_head.priority, async_head.arrival_time)
                    < (head.priority, head.arrival_time)
                )
            return bool(async_head.arrival_time < head.arrival_time)

        rest = interleaved(list(s.waiting), list(getattr(s, "async_kv_waiting", ())), goes_first)
        return [*s.kv_holding_waiting, *rest]

    def _connector_state(self) -> ConnectorState:
        """vLLM's connector bookkeeping as the spec's ConnectorState.

        loads: each request of kv_holding_waiting. Parked (WAITING_FOR_REMOTE_KVS): failed
        if a failure marked it for recovery at promotion (failed_recving_kv_req_ids, only
        under "recompute"), else received once the worker reported it
        (finished_recving_kv_req_ids), else loading. Back in WAITING or PREEMPTED with
        computed tokens: promoted (vLLM's _holds_kv_blocks; a failed load with nothing
        valid gave its blocks back and holds none).
        held: the finished requests vLLM keeps in `requests` because their blocks wait
        for a report: a send our connector asked to wait for (request_finished's
        delay_free), else a load aborted or failed in flight (0.34.0 lists these in
        _aborted_kv_loads; 0.33.0 keeps no such list, so the connector's record decides).
        """
        s = self.scheduler
        connector = s.connector  # connector.connector_class()
        parked = self._v.RequestStatus.WAITING_FOR_REMOTE_KVS
        kv = s.kv_cache_manager
        loads: dict[str, LoadPhase] = {}
        for r in self._waiting_order():
            rid = r.request_id
            phase: LoadPhase | None
            if r.status == parked:
                if rid in s.failed_recving_kv_req_ids:
                    phase = "failed"
                elif rid in s.finished_recving_kv_req_ids:
                    phase = "received"
                else:
                    phase = "loading"
            else:
                # In and waiting for admission with the blocks it loaded (a whole
                # one-token prompt's load leaves nothing computed and holds its block).
                phase = "promoted" if spec_block_ids(kv.get_block_ids(rid)) else None
            if phase is not None:
                loads[external_id(rid)] = phase
        held = {
            external_id(rid): HeldBlocks(
                spec_block_ids(kv.get_block_ids(rid)),
                "sending" if rid in connector.delayed else "loading",
            )
            for rid, r in s.requests.items()
            if r.is_finished()
        }
        return ConnectorState(loads, held, tuple(connector.model.finished_calls))

    def _status(self, request: Any) -> RequestStatus:
        name = request.status.name
        status = _STATUS.get(name)
        if status is None:
            # Grammar, streaming and repetition states need
            # inputs the harness never gives; seeing one is an adapter gap.
            raise RuntimeError(f"request {request.request_id!r} in vLLM status {name}")
        return status

    @staticmethod
    def _finish_status(reason: Any) -> RequestStatus | None:
        """vLLM's FinishReason (an IntEnum, or None while live) as the spec's status."""
        if reason is None:
            return None
        status = _FINISH_STATUS.get(reason.name)
        if status is None:
            # Other errors and repetition detection need inputs the harness never gives.
            raise RuntimeError(f"vLLM finish reason {reason.name}")
        return status

    # ------------------------------------------------------ hash translation

    def _learn(self, rid: str, request: Any) -> None:
        """Pair the request's vLLM block hashes with the spec's hashes of its own blocks."""
        self._hashes.learn(rid, request.block_hashes, request.all_token_ids)

    def _learn_tracked(self) -> None:
        """After a call that may append tokens or free requests: learn, then forget
        the requests that finished."""
        for rid, request in list(self._tracked.items()):
            self._learn(rid, request)
            if request.is_finished():
                del self._tracked[rid]
                self._drafting.forget(external_id(rid))
                self._hashes.forget(rid)

    def _spec_of(self, key: bytes) -> BlockHash:
        """A pool key (block hash + 4-byte group id) as the spec's hash."""
        return self._hashes.spec_of(key)


def _prefix_cache_entries(cache: Any) -> Iterator[tuple[bytes, tuple[int, ...]]]:
    """vLLM's BlockHashToBlockMap as (key, the spec's ids of the blocks under it), in
    its insertion order, the block a lookup takes first. Feature detection: 0.34.0
    keeps one block id per key in `_cache` and every id of a key that several blocks
    hold in `_dup_ids` (the first is `_cache`'s); 0.33.0 keeps a block, or
    {block_id: block} for several, in `_cache`."""
    duplicates = getattr(cache, "_dup_ids", None)
    for key, held in cache._cache.items():
        if duplicates is not None:
            ids = duplicates.get(key) or (held,)
        else:
            ids = held if isinstance(held, dict) else (held.block_id,)
        yield key, tuple(block_id - 1 for block_id in ids)
