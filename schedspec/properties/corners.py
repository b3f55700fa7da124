"""Named corners: the states and decisions where vLLM's scheduler bugs lived, counted per run.

A run that never reaches a corner cannot catch a bug that lives there, whatever its
invariants say, so `schedspec check` and `schedspec diff` print how often each corner
was reached (and --json reports it). Each corner is a cheap predicate over a
transition the harness builds anyway; the counters are plain dict increments, paid
once per schedule(), update_from_output() or proposal of drafts.

The corners come from docs/SPEC.md and the vLLM bug list of the research notes on
the V1 scheduler (section 7); each names the bug it guards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Concatenate, ParamSpec

from schedspec.engines.capabilities import ALL_CAPABILITIES, Capability
from schedspec.properties import hybrid_corners
from schedspec.spec import RequestStatus, SchedulerOutput, SGLangState, State
from schedspec.spec.invariants import (
    DraftsTransition,
    ScheduleTransition,
    UpdateTransition,
    waiting_phase,
)
from schedspec.spec.invariants.sglang.admission import latch_surely_open
from schedspec.spec.invariants.sglang.policy import refreshed_pages
from schedspec.spec.invariants.sglang.prefill_pass import (
    TOLERANCE,
    PrefillPass,
    admissions_in_batch_order,
    remaining_new_tokens,
    reserved_new_tokens,
)
from schedspec.spec.invariants.vllm.running_replay import served_priority_victims

P = ParamSpec("P")

VLLM_ONLY = ("vllm",)
SGLANG_ONLY = ("sglang",)
_DRAFTS = frozenset({Capability.DRAFTS})
_PADDING = frozenset({Capability.DRAFTS, Capability.SPEC_DECODE_PADDING})
_ASYNC = frozenset({Capability.ASYNC_SCHEDULING})
_CACHING = frozenset({Capability.PREFIX_CACHING})
_CONNECTOR = frozenset({Capability.KV_CONNECTOR})
_CHUNKED = frozenset({Capability.CHUNKED_PREFILL})
_HYBRID = frozenset({Capability.HYBRID_KV})


@dataclass(frozen=True)
class Corner:
    name: str
    description: str
    # The policy families whose engines can reach it (a corner of drafts, of the
    # watermark or of priority scheduling is no corner of SGLang's family).
    families: tuple[str, ...] = ("vllm", "sglang")
    # Reachable only under a config with a KV connector: a run that drew none reaches
    # none of them, and its table leaves them out (shown_corners).
    needs_connector: bool = False
    # Reachable only under a config with kv_cache_groups: left out the same way.
    needs_hybrid: bool = False
    # What an engine must have for a run to reach it (engines/capabilities.py): on an
    # engine without them the corner is not applicable, not "never reached".
    needs: frozenset[Capability] = frozenset()


CORNERS: tuple[Corner, ...] = (
    Corner(
        "priority-victim-ahead",
        "a priority preemption whose victim ran ahead of a request served in the step "
        "(#49097, #23347)",
        VLLM_ONLY,
        needs=frozenset({Capability.PRIORITY}),
    ),
    Corner("preemption", "a step that preempted"),
    Corner(
        "two-victims",
        "a step that preempted (SGLang: retracted) two requests or more: the victims' order "
        "and their order back in the waiting queue (SGLang #4914, #4977's retraction path)",
    ),
    Corner("kv-exact-fit", "a step that left no block free and preempted nothing"),
    Corner("budget-exact-fit", "a step that used exactly the whole token budget"),
    Corner(
        "admission-exact-fit",
        "an admission that left exactly the spare blocks (the watermark's, or none)",
        VLLM_ONLY,
    ),
    Corner(
        "resumed-with-outputs",
        "a preempted request with outputs resumed: its known sequence is longer than its "
        "prompt (#18115)",
    ),
    Corner("prefix-hit", "an admission that hit the prefix cache", needs=_CACHING),
    Corner(
        "hit-on-free-block",
        "a prefix hit on a free cached block, taken out of the free queue (#33775)",
        needs=_CACHING,
    ),
    Corner(
        "shared-hash", "one hash held by two blocks in the prefix cache", VLLM_ONLY, needs=_CACHING
    ),
    Corner(
        "lookahead-at-max-model-len",
        "a step whose lookahead slots reach past max_model_len (they are capped there)",
        VLLM_ONLY,
        needs=_DRAFTS,
    ),
    Corner("drafts-scheduled", "a step that verified drafts", VLLM_ONLY, needs=_DRAFTS),
    Corner(
        "stop-inside-drafts",
        "a stop token among the accepted drafts: the tokens after it are dropped",
        VLLM_ONLY,
        needs=_DRAFTS,
    ),
    Corner(
        "drafts-on-prefill",
        "drafts proposed for a request in its prefill, which must drop them (PR #30618)",
        VLLM_ONLY,
        needs=_DRAFTS,
    ),
    Corner(
        "padded-admission",
        "an admission padded to 1 + K for spec decode",
        VLLM_ONLY,
        needs=_PADDING,
    ),
    Corner(
        "padding-near-max-model-len",
        "a one-token admission under spec-decode padding whose padded step and sampled "
        "token would end on or past max_model_len (#53962)",
        VLLM_ONLY,
        needs=_PADDING,
    ),
    Corner(
        "preempted-with-output-in-flight",
        "async: a victim whose step was still in flight (#41190)",
        needs=_ASYNC,
    ),
    Corner("stale-output-lands", "async: output scheduled before a preemption lands", needs=_ASYNC),
    # It counts such a victim whether or not the step served it before preempting it:
    # only a victim the step served, under the priority policy, is unscheduled and has
    # its registrations revisited (the next corner).
    Corner(
        "victim-kv-in-flight-cached",
        "async, prefix caching: a victim with blocks registered before the step over KV a "
        "step in flight still writes, which CACHE-SCHEDULE-KEPT keeps registered",
        VLLM_ONLY,
        needs=_ASYNC | _CACHING,
    ),
    Corner(
        "victim-served-registers-in-flight",
        "async, prefix caching, priority: a victim the step served before preempting it "
        "(the running loop's replay says so), whose service registered a block over KV a "
        "step in flight still writes, which CACHE-SCHEDULE-KEPT keeps registered",
        VLLM_ONLY,
        needs=_ASYNC | _CACHING | frozenset({Capability.PRIORITY}),
    ),
    Corner(
        "max-tokens-in-flight",
        "async: a request whose step in flight is sure to reach max_tokens (PR #27922)",
        needs=_ASYNC,
    ),
    Corner(
        "cache-aware-reorder",
        "a step whose cache-aware admission moved a waiting request with a deeper cached "
        "prefix ahead (vLLM 0.34.0)",
        VLLM_ONLY,
        needs=frozenset({Capability.CACHE_AWARE_ADMISSION, Capability.PREFIX_CACHING}),
    ),
    Corner(
        "idle-with-waiting",
        "a step that scheduled nothing while a request waited: async, with output in "
        "flight; PROGRESS bounds how long (vllm #39734, #40707)",
    ),
    Corner(
        "abort-in-flight",
        "an abort applied while the step that scheduled the request ran, before its "
        "output landed (vLLM's abort queue; sglang #34153, vllm #46283's class)",
    ),
    Corner(
        "abort-mid-prefill",
        "an abort of a running request between the chunks of its prefill (SGLang's chunked "
        "request: its chunking stops and its KV is freed uncached, SG-CHUNKED-ABORT; "
        "sglang #16067's class)",
        needs=_CHUNKED,
    ),
    Corner(
        "sg-latch-closed",
        "SGLang: a step whose pass found the admission latch closed with requests waiting "
        "(the #32549 starvation class)",
        SGLANG_ONLY,
    ),
    Corner(
        "sg-budget-stop",
        "SGLang: a pass stopped by a spent chunk or input budget before a request that "
        "fits memory (the latch must stay open)",
        SGLANG_ONLY,
    ),
    Corner(
        "sg-mixed-step",
        "SGLang: a mixed-chunk step (an extend beside decodes)",
        SGLANG_ONLY,
        needs=frozenset({Capability.MIXED_CHUNK}),
    ),
    Corner(
        "sg-chunk-room-cut",
        "SGLang: the chunked request's next chunk cut to the room the running requests' "
        "reservations leave, short of the chunk budget and of its prompt (SG-CHUNK-ROOM "
        "judges it)",
        SGLANG_ONLY,
        needs=_CHUNKED,
    ),
    Corner(
        "sg-readmit-whole-budget",
        "SGLang: a pass that re-admitted a retracted request with outputs, then refused the "
        "next waiting request only because the re-admission reserves its whole "
        "max_new_tokens, outputs included, not what it has left (SG-ADMISSION judges it)",
        SGLANG_ONLY,
    ),
    Corner(
        "sg-prefix-refresh",
        "SGLang: a waiting-prefix refresh (every 32nd prefill pass) with evictable pages on "
        "the cached paths of two waiting requests or more, whose order SG-EVICT-ORDER judges "
        "(the engine must count its passes: State.sglang.prefill_passes)",
        SGLANG_ONLY,
    ),
    Corner(
        "sg-chunk-after-unaligned",
        "SGLang: a pass that chunked a request after admitting one whose extend is not a "
        "whole number of pages (the chunk budget pays the page-ceiled extend: SG-ADMISSION "
        "judges the chunk it leaves)",
        SGLANG_ONLY,
        needs=_CHUNKED,
    ),
    Corner(
        "load-in-progress",
        "KV connector: a step that parked an async load (WAITING_FOR_REMOTE_KVS, blocks "
        "held, nothing cached; vllm #45388's class)",
        VLLM_ONLY,
        needs_connector=True,
        needs=_CONNECTOR,
    ),
    Corner(
        "load-failed",
        "KV connector: a worker report that failed a load, as a whole or on a block "
        "(invalid_block_ids, failed_recving)",
        VLLM_ONLY,
        needs_connector=True,
        needs=_CONNECTOR,
    ),
    Corner(
        "send-delayed",
        "KV connector: a finished request whose blocks stay held for a send "
        "(request_finished's delay_free)",
        VLLM_ONLY,
        needs_connector=True,
        needs=_CONNECTOR,
    ),
    Corner(
        "abort-while-loading",
        "KV connector: an abort of a parked load still in flight, its blocks held until it "
        "reports (vllm #46283)",
        VLLM_ONLY,
        needs_connector=True,
        needs=_CONNECTOR,
    ),
    Corner(
        "window-frees-a-block",
        "hybrid: a sliding-window or chunked-local group freed a block of a scheduled "
        "request, the null block in its place (WINDOW-FREED judges it)",
        VLLM_ONLY,
        needs_hybrid=True,
        needs=_HYBRID,
    ),
    Corner(
        "hit-cut-by-lagging-group",
        "hybrid: an admission whose prefix hit another group cut short of what full "
        "attention alone had cached (the reconciled hit; vllm #46453)",
        VLLM_ONLY,
        needs_hybrid=True,
        needs=_HYBRID | _CACHING,
    ),
    Corner(
        "mamba-aligned-split",
        "hybrid: a prefill chunk that stopped before its prefill's end with budget left, "
        "cut to a Mamba state boundary, stopped at its checkpoint (where a later hit "
        "resumes) or its shared-prefix junction, or advanced by part of a block wider than "
        "any step (vllm #55600, #40707)",
        VLLM_ONLY,
        needs_hybrid=True,
        needs=_HYBRID,
    ),
    Corner(
        "mamba-eagle-checkpoint-backoff",
        "hybrid: under EAGLE's block drop (an EAGLE-style drafter, no prefix caching), a "
        "prefill chunk that the Mamba checkpoint's back-off cut: stopped, with budget left, "
        "one block before the plain checkpoint, or ran through it (vllm #50630, #43559)",
        VLLM_ONLY,
        needs_hybrid=True,
        needs=_HYBRID | _DRAFTS,
    ),
    Corner(
        "hybrid-preemption",
        "hybrid: a victim that held blocks in two groups or more, all freed (nulls left out)",
        VLLM_ONLY,
        needs_hybrid=True,
        needs=_HYBRID,
    ),
)
CORNER_NAMES: tuple[str, ...] = tuple(c.name for c in CORNERS)


def corners_for(profile: str) -> tuple[Corner, ...]:
    """The corners a run under that profile can reach: its family's, or every corner
    for the safety profile (whose engine's family the run does not know)."""
    family = {"vllm-v1": "vllm", "sglang": "sglang"}.get(profile)
    return tuple(c for c in CORNERS if family is None or family in c.families)


def _bump(counts: MutableMapping[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


def count_reached(
    count: Callable[Concatenate[MutableMapping[str, int], P], None],
    failed: bool,
    counts: MutableMapping[str, int],
    *args: P.args,
    **kwargs: P.kwargs,
) -> None:
    """Count the corners a call reached, a call that broke an invariant included: a run
    that failed exactly at a corner must show that corner reached. The counters assume a
    consistent transition, which a failing one need not be (a victim missing from the
    state, a block id out of range): what they cannot read of it is left uncounted, since
    the violation, not the table, is that run's report."""
    if not failed:
        count(counts, *args, **kwargs)
        return
    with contextlib.suppress(LookupError, ValueError, TypeError, AttributeError, ZeroDivisionError):
        count(counts, *args, **kwargs)


def count_schedule(counts: MutableMapping[str, int], t: ScheduleTransition) -> None:
    """The corners a schedule() reached."""
    pre, post, output = t.pre, t.post, t.output
    config = post.config
    scheduled = output.num_scheduled_tokens
    if config.kv_connector and _newly_loading(pre, post):
        _bump(counts, "load-in-progress")
    preempted = output.preempted_req_ids
    if preempted:
        _bump(counts, "preemption")
        if len(preempted) > 1:
            _bump(counts, "two-victims")
        if config.policy == "priority":
            order = {rid: i for i, rid in enumerate(pre.running)}
            first_victim = min(order.get(r, len(order)) for r in preempted)
            if any(order.get(r, -1) > first_victim for r in scheduled):
                _bump(counts, "priority-victim-ahead")
        if config.async_scheduling and any(
            pre.requests[r].num_in_flight_tokens for r in preempted if r in pre.requests
        ):
            _bump(counts, "preempted-with-output-in-flight")
            if config.enable_prefix_caching and any(
                _cached_over_kv_in_flight(pre, r) for r in preempted
            ):
                _bump(counts, "victim-kv-in-flight-cached")
            if config.enable_prefix_caching and any(
                _registered_over_kv_in_flight(pre, r) for r in served_priority_victims(t)
            ):
                _bump(counts, "victim-served-registers-in-flight")
    # The reorder runs before any admission, so a step that admits nothing counts too.
    if config.cache_aware_admission_window and waiting_phase(t).moved:
        _bump(counts, "cache-aware-reorder")
    if pre.sglang is not None:
        _count_sglang_pass(counts, t, pre.sglang)
    if config.kv_cache_groups:
        hybrid_corners.count_hybrid(counts, t)
    if not scheduled:
        if pre.waiting:
            _bump(counts, "idle-with-waiting")
        return
    free = len(post.kv.free_block_ids)
    if free == 0 and not preempted:
        _bump(counts, "kv-exact-fit")
    if output.total_num_scheduled_tokens == config.max_num_batched_tokens:
        _bump(counts, "budget-exact-fit")
    if output.scheduled_spec_decode_tokens:
        _bump(counts, "drafts-scheduled")
    lookahead = config.lookahead_tokens
    if lookahead and any(
        post.requests[r].num_computed_tokens + lookahead > config.max_model_len
        for r in scheduled
        if r in post.requests
    ):
        _bump(counts, "lookahead-at-max-model-len")
    _count_admissions(counts, t, free)
    if post.sglang is not None and post.sglang.last_batch_kind == "mixed":
        _bump(counts, "sg-mixed-step")
    if config.enable_prefix_caching and any(len(ids) > 1 for _, ids in post.kv.prefix_cache):
        _bump(counts, "shared-hash")


def _cached_over_kv_in_flight(pre: State, request_id: str) -> bool:
    """Does the request hold a block registered before the step whose tokens are not
    all confirmed, only computed by a step still in flight?"""
    request = pre.requests.get(request_id)
    if request is None or not request.num_in_flight_tokens:
        return False
    bs = pre.config.block_size
    confirmed = request.num_computed_tokens - request.num_in_flight_tokens
    full = request.block_ids[confirmed // bs : request.num_computed_tokens // bs]
    return any(pre.kv.block_hashes[b] is not None for b in full)


def _registered_over_kv_in_flight(pre: State, request_id: str) -> bool:
    """Does the request hold a full block of known tokens, unregistered before the step,
    whose KV a step still in flight writes? The step that serves it registers that block
    (its tokens became known when an output landed, after that step was scheduled)."""
    request = pre.requests[request_id]
    bs = pre.config.block_size
    start = request.num_confirmed_computed_tokens // bs
    end = min(request.num_computed_tokens, request.num_tokens) // bs
    return any(pre.kv.block_hashes[b] is None for b in request.block_ids[start:end])


def _count_sglang_pass(
    counts: MutableMapping[str, int], t: ScheduleTransition, policy: SGLangState
) -> None:
    if policy.chunked_request_id is not None and _chunk_cut_by_room(PrefillPass.of(t, policy)):
        _bump(counts, "sg-chunk-room-cut")
    if len(set(refreshed_pages(t).values())) > 1:
        _bump(counts, "sg-prefix-refresh")
    if _chunked_after_unaligned(t, policy):
        _bump(counts, "sg-chunk-after-unaligned")
    if not t.pre.waiting:
        return
    if not t.admitted_ids and not latch_surely_open(t, policy):
        _bump(counts, "sg-latch-closed")
        return
    count = PrefillPass.of(t, policy)
    before = count.at_refusal
    rem_chunk = before.rem_chunk
    spent = before.rem_input.hi <= 0 or (rem_chunk is not None and rem_chunk.hi <= 0)
    if spent and count.refused is not None and count.surely_fits(count.refused):
        _bump(counts, "sg-budget-stop")
    if _refused_for_a_readmission(count):
        _bump(counts, "sg-readmit-whole-budget")


def _chunked_after_unaligned(t: ScheduleTransition, policy: SGLangState) -> bool:
    """Did the pass chunk a request it admitted after one whose extend ends inside a page?"""
    chunked = t.post.sglang.chunked_request_id if t.post.sglang is not None else None
    page = t.pre.config.block_size
    if page == 1 or chunked is None or chunked == policy.chunked_request_id:
        return False
    admitted = admissions_in_batch_order(t)
    if chunked not in admitted:
        return False
    scheduled = t.output.num_scheduled_tokens
    return any(scheduled[rid] % page for rid in admitted[: admitted.index(chunked)])


def _refused_for_a_readmission(count: PrefillPass) -> bool:
    """Was the first request the pass left waiting refused for memory, with a seat and
    budget left, where it would have fitted had the requests the pass re-admitted with
    outputs (whole, not chunked) reserved only the max_new_tokens they have left?"""
    request = count.refused
    if request is None:
        return False
    t, config = count.t, count.config
    spared = 0
    for rid in count.admitted:
        admitted = t.pre.requests[rid]
        if rid != count.chunked_after and admitted.output_token_ids:
            spared += reserved_new_tokens(config, admitted) - remaining_new_tokens(config, admitted)
    if not spared:
        return False
    before = count.at_refusal
    rem_chunk = before.rem_chunk
    if count.seats_left(before.num_can_run).lo <= 0 or before.rem_input.lo <= 0:
        return False
    if rem_chunk is not None and rem_chunk.lo < count.page:
        return False
    future = count.future(request, count.longest_match(request))
    room = count.room_for(request)
    return room.hi <= future < room.lo + spared - TOLERANCE


def _chunk_cut_by_room(count: PrefillPass) -> bool:
    """Did the reservations, surely leaving some room, size the chunked request's next
    chunk below the chunk budget, the rest of its prompt and the free and evictable
    slots (so that a chunk sized without them would be larger)?"""
    room = count.chunk_room()
    if count.chunked is None or not count.chunk or room is None or room.lo <= 0:
        return False
    rem_chunk = count.start.rem_chunk
    assert rem_chunk is not None
    prefix = count.t.computed_before.get(count.chunked, 0)
    remaining = count.t.pre.requests[count.chunked].num_tokens - prefix
    return room.hi < min(remaining, rem_chunk.lo, count.available(frozenset()).lo)


def _count_admissions(counts: MutableMapping[str, int], t: ScheduleTransition, free: int) -> None:
    output = t.output
    new = output.scheduled_new_reqs
    resumed = [d for d in output.scheduled_cached_reqs if d.resumed]
    if not new and not resumed:
        return
    config = t.post.config
    spare = config.watermark_blocks if len(t.post.running) > 1 else 0
    if free == spare:
        _bump(counts, "admission-exact-fit")
    if any(t.pre.requests[d.request_id].output_token_ids for d in resumed):
        _bump(counts, "resumed-with-outputs")
    spec = output.scheduled_spec_decode_tokens
    admitted = t.admitted_ids
    if any(r in spec for r in admitted):
        _bump(counts, "padded-admission")
    if _padding_near_max_model_len(t, admitted):
        _bump(counts, "padding-near-max-model-len")
    hits = [
        (rid, computed)
        for rid, computed in t.computed_before.items()
        if computed and rid in admitted and rid in t.post.requests
    ]
    if hits:
        _bump(counts, "prefix-hit")
        pre_free = set(t.pre.kv.free_block_ids)
        bs = config.block_size
        if any(
            b in pre_free
            for rid, computed in hits
            for b in t.post.requests[rid].block_ids[: computed // bs]
        ):
            _bump(counts, "hit-on-free-block")


def _padding_near_max_model_len(t: ScheduleTransition, admitted: Iterable[str]) -> bool:
    """An admission with a computed prefix and one token left, under padding, where
    1 + K tokens and the one sampled would reach max_model_len: the boundary at which
    vLLM padded a resumed request onto max_model_len and crashed (#53962)."""
    config = t.post.config
    num_spec = config.num_speculative_tokens
    if not config.pad_spec_decode or not num_spec:
        return False
    for rid in admitted:
        request = t.pre.requests.get(rid)
        computed = t.computed_before.get(rid, 0)
        if request is None or not computed or request.num_tokens - computed != 1:
            continue
        if computed + 1 + num_spec + 1 >= config.max_model_len:
            return True
    return False


def _newly_loading(pre: State, post: State) -> bool:
    before = pre.connector.loads if pre.connector is not None else {}
    after = post.connector.loads if post.connector is not None else {}
    return any(p == "loading" and before.get(rid) != "loading" for rid, p in after.items())


def _newly_held(pre: State, post: State, reason: str) -> bool:
    before = pre.connector.held if pre.connector is not None else {}
    after = post.connector.held if post.connector is not None else {}
    return any(h.reason == reason and rid not in before for rid, h in after.items())


def count_update(counts: MutableMapping[str, int], t: UpdateTransition) -> None:
    """The corners an update_from_output() reached."""
    report = t.model_output.kv_connector_output
    if report is not None and (report.failed_recving or report.invalid_block_ids):
        _bump(counts, "load-failed")
    if _newly_held(t.pre, t.post, "sending"):
        _bump(counts, "send-delayed")
    sampled: Mapping[str, object] = t.model_output.sampled_token_ids
    pre = t.pre
    for rid, tokens in t.model_output.sampled_token_ids.items():
        request = pre.requests.get(rid)
        if request is None or len(tokens) < 2:
            continue
        stops = request.stop_token_ids
        if any(tok == request.eos_token_id or tok in stops for tok in tokens[:-1]):
            _bump(counts, "stop-inside-drafts")
            break
    if not pre.config.async_scheduling:
        return
    if any(
        r.num_stale_output_tokens for rid in sampled if (r := pre.requests.get(rid)) is not None
    ):
        _bump(counts, "stale-output-lands")
    if any(r.sure_to_reach_max_tokens for r in pre.requests.values()):
        _bump(counts, "max-tokens-in-flight")


def count_abort_in_flight(
    counts: MutableMapping[str, int],
    in_flight: Iterable[SchedulerOutput],
    aborts: tuple[str, ...],
    pre: State,
) -> None:
    """An abort that hit a request of a step in flight: between engine steps under
    vLLM's batch queue or SGLang's overlap loop, or inside one (events.Step.aborts);
    and one that hit a request mid-prefill (pre: the state the abort met)."""
    if any(rid in output.num_scheduled_tokens for output in in_flight for rid in aborts):
        _bump(counts, "abort-in-flight")
    loads = pre.connector.loads if pre.connector is not None else {}
    if any(loads.get(rid) == "loading" for rid in aborts):
        _bump(counts, "abort-while-loading")
    if any(
        r.is_prefill_chunk and r.status is RequestStatus.RUNNING
        for rid in aborts
        if (r := pre.requests.get(rid)) is not None
    ):
        _bump(counts, "abort-mid-prefill")


def count_drafts(counts: MutableMapping[str, int], t: DraftsTransition) -> None:
    """The corners a proposal of drafts reached."""
    requests = t.pre.requests
    if any(
        drafts and (r := requests.get(rid)) is not None and r.is_prefill_chunk
        for rid, drafts in t.proposed.items()
    ):
        _bump(counts, "drafts-on-prefill")


def shown_corners(counts: Mapping[str, int], profile: str = "safety") -> tuple[Corner, ...]:
    """The corners a run's table lists: its profile's, less the KV connector's when it
    reached none of them (its configs drew no connector), and less the hybrid KV cache's
    likewise (its configs drew no kv_cache_groups)."""
    corners = corners_for(profile)
    for optional in (attrgetter("needs_connector"), attrgetter("needs_hybrid")):
        if not any(counts.get(c.name) for c in corners if optional(c)):
            corners = tuple(c for c in corners if not optional(c))
    return corners


def applicable(corner: Corner, capabilities: frozenset[Capability]) -> bool:
    """Can a run on engines with these capabilities reach the corner at all?"""
    return corner.needs <= capabilities


NOT_APPLICABLE = "not applicable"


def format_corners(
    counts: Mapping[str, int],
    profile: str = "safety",
    capabilities: frozenset[Capability] = ALL_CAPABILITIES,
) -> list[str]:
    """One row per named corner of the profile's family (shown_corners): how often the
    run reached it, and what it is; "not applicable" for a corner that needs a capability
    the engines lack, counted neither reached nor missed."""
    corners = shown_corners(counts, profile)
    width = max(len("corner"), *(len(c.name) for c in corners))
    reached = {
        c.name: str(counts.get(c.name, 0)) if applicable(c, capabilities) else NOT_APPLICABLE
        for c in corners
    }
    column = max(len("reached"), 9, *(len(r) for r in reached.values()))
    lines = [f"{'corner':<{width}}  {'reached':>{column}}  what"]
    for corner in corners:
        lines.append(
            f"{corner.name:<{width}}  {reached[corner.name]:>{column}}  {corner.description}"
        )
    inapplicable = [c.name for c in corners if not applicable(c, capabilities)]
    live = [c for c in corners if applicable(c, capabilities)]
    missed = [c.name for c in live if not counts.get(c.name)]
    lines.append(
        f"corners reached: {len(live) - len(missed)}/{len(live)}"
        + (f" (never: {', '.join(missed)})" if missed else "")
        + (
            f"; not applicable (the engine lacks what they need): {', '.join(inapplicable)}"
            if inapplicable
            else ""
        )
    )
    return lines
