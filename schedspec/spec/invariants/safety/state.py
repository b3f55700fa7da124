"""Invariants of a single abstract state: they hold between any two engine calls."""

from __future__ import annotations

from collections import Counter

from schedspec.spec.invariants.registry import (
    FieldCheck,
    Violation,
    field_violations,
    holds_nothing,
    invariant,
    or_absent,
    still_live,
)
from schedspec.spec.kv_groups import NULL_BLOCK_ID
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import RequestState, State

_WAITING_STATUSES = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


@invariant(
    "CONSERVATION",
    "state",
    "safety",
    "Every block is either free (ref count 0, in the free queue exactly once) or held; its "
    "ref count equals the number of block tables holding it (a live request's, or a "
    "finished one's that the KV connector holds); free + held == num_blocks; no table "
    "holds a block twice.",
)
def check_conservation(state: State) -> list[Violation]:
    if _conserved(state):
        return []
    return _diagnose_conservation(state)


def _conserved(state: State) -> bool:
    """The cheap whole-state test; the diagnosis below runs only when it fails."""
    kv = state.kv
    counts = [0] * kv.num_blocks
    try:
        for _, table in state.held_tables():
            for block in table:
                if block < 0:
                    return False
                counts[block] += 1
    except IndexError:
        return False
    if tuple(counts) != kv.ref_counts or (max(counts, default=0) > 1 and not _shared_ok(state)):
        return False
    free = kv.free_block_ids
    size = kv.num_blocks
    return len(set(free)) == len(free) == counts.count(0) and all(
        0 <= b < size and counts[b] == 0 for b in free
    )


def _shared_ok(state: State) -> bool:
    """No table holds the same block twice (sharing across tables is EXCLUSIVE's business)."""
    return all(len(set(table)) == len(table) for _, table in state.held_tables())


def _diagnose_conservation(state: State) -> list[Violation]:
    kv = state.kv
    out: list[Violation] = []
    holders: Counter[int] = Counter()
    for rid, table in state.held_tables():
        if len(set(table)) != len(table):
            dupes = sorted(b for b, n in Counter(table).items() if n > 1)
            out.append(
                Violation(
                    "CONSERVATION",
                    f"table holds blocks {dupes} twice",
                    rid,
                    expected="each block once",
                    actual={b: Counter(table)[b] for b in dupes},
                )
            )
        for block in table:
            if not 0 <= block < kv.num_blocks:
                out.append(
                    Violation(
                        "CONSERVATION",
                        "block id out of range",
                        rid,
                        block,
                        expected=f"0 <= id < {kv.num_blocks}",
                        actual=block,
                    )
                )
        holders.update(table)
    free = kv.free_block_ids
    free_set = set(free)
    if len(free_set) != len(free):
        dupes = sorted(b for b, n in Counter(free).items() if n > 1)
        out.append(
            Violation(
                "CONSERVATION",
                f"blocks {dupes} are in the free queue twice",
                expected="each free block once",
                actual={b: Counter(free)[b] for b in dupes},
            )
        )
    for block in free_set - set(range(kv.num_blocks)):
        out.append(
            Violation(
                "CONSERVATION",
                "free block id out of range",
                block_id=block,
                expected=f"0 <= id < {kv.num_blocks}",
                actual=block,
            )
        )
    for block, ref in enumerate(kv.ref_counts):
        held = holders.get(block, 0)
        if ref != held:
            out.append(
                Violation(
                    "CONSERVATION",
                    "ref count differs from the number of tables holding the block",
                    block_id=block,
                    expected=held,
                    actual=ref,
                )
            )
        if (ref == 0) != (block in free_set):
            where = "in" if block in free_set else "not in"
            out.append(
                Violation(
                    "CONSERVATION",
                    f"ref count {ref} but {where} the free queue",
                    None,
                    block,
                    expected="in the free queue" if ref == 0 else "not in the free queue",
                    actual=f"{where} the free queue",
                )
            )
    num_held = sum(1 for ref in kv.ref_counts if ref > 0)
    if len(free_set) + num_held != kv.num_blocks:
        out.append(
            Violation(
                "CONSERVATION",
                "free + held blocks do not add up to num_blocks",
                expected=kv.num_blocks,
                actual=len(free_set) + num_held,
            )
        )
    return out


@invariant(
    "EXCLUSIVE",
    "state",
    "safety",
    "A block held by two live requests is a full block registered in the prefix cache, at "
    "the same position of each table (of the same group, with kv_cache_groups); any other "
    "block has one writer.",
)
def check_exclusive(state: State) -> list[Violation]:
    # A place is the index in the table, or (group, index) with kv_cache_groups; a block
    # at index i of a table of block size b is full once a request has (i + 1) * b tokens.
    places_of: dict[int, list[tuple[str, Place, int]]] = {}
    for rid, request in state.requests.items():
        for place, block, end in _table_places(state, request):
            places_of.setdefault(block, []).append((rid, place, end))
    out: list[Violation] = []
    for block, held in places_of.items():
        if len(held) < 2 or not 0 <= block < len(state.kv.block_hashes):
            continue  # CONSERVATION reports ids out of range
        places = [(rid, place) for rid, place, _ in held]
        if state.kv.block_hashes[block] is None:
            out.append(
                Violation(
                    "EXCLUSIVE",
                    f"shared by {places} but not cached",
                    None,
                    block,
                    expected="a block hash",
                    actual="no hash",
                )
            )
        if len({place for _, place in places}) != 1:
            out.append(
                Violation(
                    "EXCLUSIVE",
                    f"shared at different positions {places}",
                    None,
                    block,
                    expected="one position",
                    actual=sorted({place for _, place in places}, key=_place_order),
                )
            )
        for rid, place, end in held:
            if end > state.requests[rid].num_tokens:
                out.append(
                    Violation(
                        "EXCLUSIVE",
                        f"shared block is not full at index {place}",
                        rid,
                        block,
                        expected=f">= {end} tokens",
                        actual=state.requests[rid].num_tokens,
                    )
                )
    return out


# Where a request holds a block: its index in the table, or (group, index).
Place = int | tuple[int, int]


def _place_order(place: Place) -> tuple[int, ...]:
    return place if isinstance(place, tuple) else (place,)


def _table_places(state: State, request: RequestState) -> list[tuple[Place, int, int]]:
    """(place, block, tokens that fill it) for each block a request holds."""
    groups = state.config.kv_cache_groups
    if not groups:
        bs = state.config.block_size
        return [(index, block, (index + 1) * bs) for index, block in enumerate(request.block_ids)]
    return [
        ((gid, index), block, (index + 1) * group.block_size)
        for gid, (group, table) in enumerate(zip(groups, request.group_block_ids, strict=False))
        for index, block in enumerate(table)
        if block != NULL_BLOCK_ID
    ]


@invariant(
    "CACHE-INDEX",
    "state",
    "safety",
    "The prefix-cache map and the blocks' hashes agree: a block is under hash h in the map "
    "exactly when its hash is h, and no entry is empty.",
)
def check_cache_index(state: State) -> list[Violation]:
    kv = state.kv
    out: list[Violation] = []
    indexed: dict[int, int] = {}
    for block_hash, block_ids in kv.prefix_cache:
        if not block_ids:
            out.append(
                Violation(
                    "CACHE-INDEX",
                    f"empty entry for hash {block_hash:#x}",
                    expected="at least one block",
                    actual=list(block_ids),
                )
            )
        for block in block_ids:
            if block in indexed:
                out.append(
                    Violation(
                        "CACHE-INDEX",
                        "block indexed twice",
                        None,
                        block,
                        expected=f"indexed once, under {indexed[block]:#x}",
                        actual=f"also under {block_hash:#x}",
                    )
                )
            indexed[block] = block_hash
    for block, registered in enumerate(kv.block_hashes):
        if indexed.get(block) != registered:
            out.append(
                Violation(
                    "CACHE-INDEX",
                    "block hash and prefix-cache map disagree",
                    None,
                    block,
                    expected=or_absent(registered, "no hash"),
                    actual=or_absent(indexed.get(block), "not in the map"),
                )
            )
    return out


@invariant(
    "QUEUES",
    "state",
    "safety",
    "Each unfinished request sits exactly once in waiting or running: RUNNING ones in "
    "running, WAITING, PREEMPTED and WAITING_FOR_REMOTE_KVS ones in waiting; a WAITING or "
    "PREEMPTED request holds no drafts, and no blocks and no computed tokens unless it is "
    "a KV connector's promoted load; finished requests are gone.",
)
def check_queues(state: State) -> list[Violation]:
    if _queues_ok(state):
        return []
    return _diagnose_queues(state)


def _queues_ok(state: State) -> bool:
    """The cheap whole-state test; the diagnosis below runs only when it fails."""
    running = set(state.running)
    waiting = set(state.waiting)
    requests = state.requests
    if (
        len(running) != len(state.running)
        or len(waiting) != len(state.waiting)
        or len(running) + len(waiting) != len(requests)
        or not running.isdisjoint(waiting)
    ):
        return False
    for rid, request in requests.items():
        status = request.status
        if status is RequestStatus.RUNNING:
            if rid not in running:
                return False
        elif status is RequestStatus.WAITING or status is RequestStatus.PREEMPTED:
            if (
                rid not in waiting
                or (
                    _holds_nothing_expected(state, rid)
                    and (request.block_ids or request.num_computed_tokens)
                )
                or request.spec_token_ids
                or (status is RequestStatus.PREEMPTED and request.num_preemptions < 1)
            ):
                return False
        elif status is RequestStatus.WAITING_FOR_REMOTE_KVS:
            if rid not in waiting:
                return False
        else:
            return False
    return True


def _holds_nothing_expected(state: State, request_id: str) -> bool:
    """A waiting request holds no blocks and no computed tokens, unless it is a KV
    connector's promoted load waiting for admission (LOAD-PARKED judges those)."""
    connector = state.connector
    return connector is None or connector.loads.get(request_id) != "promoted"


def _diagnose_queues(state: State) -> list[Violation]:
    out: list[Violation] = []
    placed = Counter(state.waiting) + Counter(state.running)
    for rid, count in placed.items():
        if count > 1:
            out.append(Violation("QUEUES", f"queued {count} times", rid, expected=1, actual=count))
        if rid not in state.requests:
            out.append(
                Violation(
                    "QUEUES",
                    "queued but not an unfinished request",
                    rid,
                    expected="an unfinished request",
                    actual="not live",
                )
            )
    running = set(state.running)
    for rid, request in state.requests.items():
        if request.status.is_finished:
            out.append(
                still_live("QUEUES", f"finished ({request.status.name}) but still live", request)
            )
        elif rid not in placed:
            out.append(
                Violation(
                    "QUEUES",
                    "unfinished but in no queue",
                    rid,
                    expected="running or waiting",
                    actual=state.queue_of(rid),
                )
            )
        elif (request.status is RequestStatus.RUNNING) != (rid in running):
            where = "running" if rid in running else "waiting"
            out.append(
                Violation(
                    "QUEUES",
                    f"status {request.status.name} but in {where}",
                    rid,
                    expected="waiting" if where == "running" else "running",
                    actual=where,
                )
            )
        if request.status in _WAITING_STATUSES:
            checks = [FieldCheck("spec_token_ids", (), tuple(request.spec_token_ids))]
            if _holds_nothing_expected(state, rid):
                checks += holds_nothing(request)
            out += field_violations("QUEUES", "waiting but holds", rid, checks)
        if request.status is RequestStatus.PREEMPTED and request.num_preemptions < 1:
            out.append(
                Violation(
                    "QUEUES",
                    "PREEMPTED with num_preemptions 0",
                    rid,
                    expected=">= 1",
                    actual=request.num_preemptions,
                )
            )
    return out


@invariant(
    "SEQS",
    "state",
    "safety",
    "len(running) <= max_num_seqs.",
)
def check_seqs(state: State) -> list[Violation]:
    limit = state.config.max_num_seqs
    if len(state.running) <= limit:
        return []
    return [
        Violation("SEQS", "too many running requests", expected=limit, actual=len(state.running))
    ]


@invariant(
    "LENGTH",
    "state",
    "safety",
    "A live request is below both length caps (num_tokens < max_model_len, outputs < "
    "max_tokens) and holds no EOS or stop token: it would have finished.",
)
def check_length(state: State) -> list[Violation]:
    max_model_len = state.config.max_model_len
    out: list[Violation] = []
    for rid, request in state.requests.items():
        if request.num_tokens >= max_model_len:
            out.append(
                Violation(
                    "LENGTH",
                    "live at max_model_len",
                    rid,
                    None,
                    expected=max_model_len - 1,
                    actual=request.num_tokens,
                )
            )
        if len(request.output_token_ids) >= request.max_tokens:
            out.append(
                Violation(
                    "LENGTH",
                    "live at max_tokens",
                    rid,
                    None,
                    expected=request.max_tokens - 1,
                    actual=len(request.output_token_ids),
                )
            )
        stops = set(request.stop_token_ids)
        if request.eos_token_id is not None:
            stops.add(request.eos_token_id)
        if stops.intersection(request.output_token_ids):
            out.append(
                Violation(
                    "LENGTH",
                    "live after emitting a stop token",
                    rid,
                    expected="finished",
                    actual=f"{request.status.name} after stop token(s) "
                    f"{sorted(stops.intersection(request.output_token_ids))}",
                )
            )
    return out
