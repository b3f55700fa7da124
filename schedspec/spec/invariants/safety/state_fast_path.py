"""One pass over a state that vouches for every state invariant at once.

The six state invariants each walk the whole snapshot; on a busy engine they
are checked twice per step. `state_holds` walks the requests once and the KV
arrays once, and answers only "every one of FAST_PATH_IDS holds" or "maybe
not". On "maybe not" the checker runs the named predicates, which find and
word the violations; so the fast path never reports anything itself, and it may
be stricter than the predicates (a false alarm costs only the slow path), but
never laxer: True must imply that every predicate in FAST_PATH_IDS returns [].
The tests hold it to that on every hand-built bad state of the catalogue.
"""

from __future__ import annotations

from collections import Counter

from schedspec.spec.request import PLACEHOLDER_TOKEN_ID, RequestStatus
from schedspec.spec.state import RequestState, State

# The state invariants this pass covers; any other state invariant registered
# later still runs on its own. LOAD-PARKED and STALE-KEPT come free: the pass turns
# down every state with a connector load or held table, every status but RUNNING,
# WAITING and PREEMPTED (so any request parked for a load), and any request marked to
# drop stale output, and those are the only things either of them judges.
FAST_PATH_IDS = frozenset(
    {
        "CONSERVATION",
        "EXCLUSIVE",
        "CACHE-INDEX",
        "QUEUES",
        "SEQS",
        "LENGTH",
        "PIPELINE",
        "LOAD-PARKED",
        "STALE-KEPT",
    }
)

_RUNNING = RequestStatus.RUNNING
_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED


def state_holds(state: State) -> bool:
    """True only if every invariant of FAST_PATH_IDS holds."""
    return _holds(state, None) is not None


class StateFastPath:
    """state_holds for a run of snapshots of one engine, which walks again only what
    changed since the last state it vouched for.

    The reference's snapshots share unchanged parts with the last one (a request
    record, the KV state: reference.request_records, BlockPool.snapshot). What the pass
    asks of a request depends only on its record, the config and the queues, and what
    it asks of the pool only on the KV state and the held blocks; so a record or KV
    state that is the very object of a state vouched for with the same config needs
    only what may differ (the queues, the held blocks) asked again. The answer is
    state_holds' own, for any state.
    """

    def __init__(self) -> None:
        self._vouched: _Vouched | None = None

    def holds(self, state: State) -> bool:
        known = self._vouched
        if known is not None and known.state.config is not state.config:
            known = None
        vouched = _holds(state, known)
        self._vouched = vouched
        return vouched is not None


class _Vouched:
    """A state the pass vouched for, and its held blocks (requests in order, each
    table in order) where no block in them is held twice."""

    __slots__ = ("held_once", "state")

    def __init__(self, state: State, held_once: list[int] | None) -> None:
        self.state = state
        self.held_once = held_once


def _holds(state: State, known: _Vouched | None) -> _Vouched | None:
    """The state, vouched for, if every invariant of FAST_PATH_IDS holds, else None.
    `known`: a state vouched for before with the same config, whose very records and
    KV state need not be asked again."""
    config = state.config
    kv = state.kv
    requests = state.requests
    connector = state.connector
    if connector is not None and (connector.loads or connector.held):
        return None  # loads and held tables: the named predicates judge those
    running = set(state.running)
    waiting = set(state.waiting)
    # QUEUES and SEQS: each live request queued exactly once, nothing else queued.
    if (
        len(state.running) > config.max_num_seqs
        or len(running) != len(state.running)
        or len(waiting) != len(state.waiting)
        or len(running) + len(waiting) != len(requests)
        or not running.isdisjoint(waiting)
    ):
        return None
    num_blocks = kv.num_blocks
    hashes = kv.block_hashes
    if len(hashes) != num_blocks:
        return None
    max_model_len = config.max_model_len
    async_scheduling = config.async_scheduling
    known_records = known.state.requests if known is not None else {}
    for rid, request in requests.items():
        status = request.status
        if known_records.get(rid) is request:
            # Vouched for before: only its queue may have changed.
            if rid not in (running if status is _RUNNING else waiting):
                return None
            continue
        num_tokens = request.num_tokens
        if not _pipeline_holds(request, status, num_tokens, async_scheduling):
            return None
        if status is _RUNNING:
            if rid not in running:
                return None
        elif status is _WAITING or status is _PREEMPTED:
            if (
                rid not in waiting
                or request.block_ids
                or request.spec_token_ids
                or request.num_computed_tokens
                or (status is _PREEMPTED and request.num_preemptions < 1)
            ):
                return None
        else:
            return None
        # LENGTH
        outputs = request.output_token_ids
        if num_tokens >= max_model_len or len(outputs) >= request.max_tokens:
            return None
        if outputs:
            eos = request.eos_token_id
            if eos is not None and eos in outputs:
                return None
            for stop in request.stop_token_ids:
                if stop in outputs:
                    return None
    held = [block for request in requests.values() for block in request.block_ids]
    if known is not None and kv is known.state.kv and held == known.held_once:
        # The same pool with the same blocks held once each: every question below has
        # the answer it had.
        return _Vouched(state, held)
    # CONSERVATION's counts, in C loops (set, min, max, sum, map) rather than one
    # Python loop per held block: the block ids in range, each held block's ref count
    # its number of holders, and every other block's 0 (the counts are >= 0 and sum to
    # the holders). Only when a block is held twice are the holders counted.
    ref_counts = kv.ref_counts
    if len(ref_counts) != num_blocks or (held and (min(held) < 0 or max(held) >= num_blocks)):
        return None
    if (ref_counts and min(ref_counts) < 0) or sum(ref_counts) != len(held):
        return None
    holders = set(held)
    held_once = len(holders) == len(held)
    if held_once:
        # No block held twice (most states): every held block counted at least once
        # and the counts summing to the holders leaves each held one at 1, the rest 0.
        if held and min(map(ref_counts.__getitem__, held)) < 1:
            return None
    else:
        counted = Counter(held)
        for block, count in counted.items():
            if ref_counts[block] != count:
                return None
        # EXCLUSIVE: a block held more than once is a cached full block at the same
        # position of every table that holds it (a table holding one block twice shows
        # up here as two positions).
        if not _shared_blocks_hold(state, counted):
            return None
    # CONSERVATION: the free queue is exactly the unheld blocks, each once.
    free = kv.free_block_ids
    free_set = set(free)
    if len(free) != num_blocks - len(holders) or len(free_set) != len(free):
        return None
    if (free and (min(free) < 0 or max(free) >= num_blocks)) or not free_set.isdisjoint(holders):
        return None
    # CACHE-INDEX: the map and the blocks' hashes agree, no empty entry.
    indexed: list[object] = [None] * num_blocks
    for block_hash, block_ids in kv.prefix_cache:
        if not block_ids:
            return None
        for block in block_ids:
            if not 0 <= block < num_blocks or indexed[block] is not None:
                return None
            indexed[block] = block_hash
    if tuple(indexed) != hashes:
        return None
    return _Vouched(state, held if held_once else None)


def _shared_blocks_hold(state: State, holders: Counter[int]) -> bool:
    """EXCLUSIVE's sharing rule for the blocks held more than once (block ids are in
    range: the caller checked)."""
    bs = state.config.block_size
    hashes = state.kv.block_hashes
    # A shared block's first holder: the block's index in its table and its length.
    first_seen: dict[int, tuple[int, int]] = {}
    for request in state.requests.values():
        num_tokens = request.num_tokens
        for index, block in enumerate(request.block_ids):
            if holders[block] < 2:
                continue
            seen = first_seen.setdefault(block, (index, num_tokens))
            if seen[0] != index or hashes[block] is None or (index + 1) * bs > num_tokens:
                return False
    return True


def _pipeline_holds(
    request: RequestState, status: RequestStatus, num_tokens: int, async_scheduling: bool
) -> bool:
    """PIPELINE for one request, as a yes/maybe-not."""
    in_flight = request.num_in_flight_tokens
    placeholders = request.num_output_placeholders
    stale = request.num_stale_output_tokens
    if request.drop_stale_output or min(in_flight, placeholders, stale) < 0:
        return False
    if placeholders > in_flight or stale > in_flight:
        return False
    if (placeholders or stale) and not async_scheduling:
        return False
    drafts = request.spec_token_ids
    placeholder_drafts = drafts.count(PLACEHOLDER_TOKEN_ID) if drafts else 0
    if placeholder_drafts and (not async_scheduling or placeholder_drafts != len(drafts)):
        return False
    if status is _RUNNING:
        confirmed = request.num_computed_tokens - in_flight
        return (
            not stale
            and 0 <= confirmed <= num_tokens - 1
            and not (request.is_prefill_chunk and placeholders)
        )
    if status is _WAITING:
        return not in_flight
    return not placeholders and stale == in_flight  # PREEMPTED
