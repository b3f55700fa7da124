"""The prefix cache's index: per instance, a hash table from content id to the blocks holding it.

A lookup must find, for each content id a request asks about, the blocks of
its instance that hold that id, and take the oldest (smallest `reg_seq`), as
the reference's insertion-ordered map does. Sorting the instance's N blocks
costs O(N log N) per lookup; this index costs a few gathers per id.

Each instance has H buckets (`cache_index` [B, H], H a power of two and at
least 2N, so at most half full of entries). Every block holding an id is
its own entry: the bucket holds the block id, and `cache_bucket` [B, N]
remembers the bucket, so a block losing its id finds its entry in O(1).
An entry sits at its id's *home* bucket (the id's low bits) or, by linear
probing, at the first bucket after it with no entry. So the holders of an
id all lie between its home and the first EMPTY_BUCKET after it; ids that
share their low bits share that run and are told apart by comparing the
blocks' ids in full. A deleted entry leaves a TOMBSTONE (emptying the
bucket would cut the run of entries placed past it); inserts reuse
tombstones, and a row is rebuilt from `block_hash`, by the `forget` that wears
it, once more than H / 4 entries were deleted since its last rebuild
(`cache_deleted`, a bound on its tombstones), which keeps runs short: entries,
at most N, and tombstones never fill more than three quarters of the row, so
every run ends.

A lookup reads a fixed width of buckets from each id's home (the table is
sparse: most runs end within it) and goes on only for the ids whose window
held no EMPTY_BUCKET, up to `cache_reach` (per instance, one more than the
farthest any entry was placed from its home since the last rebuild). Reading
past the end of a run is harmless: a bucket counts only if its block holds
the id.

Inserts of one call are placed in rounds: each pending entry looks at a
window of buckets and proposes the first without an entry; where several
propose one bucket, the largest block id gets it (scatter_reduce amax) and
the others go on past it. The first round's window is the home bucket alone
(most homes are free), the later rounds' _PLACE_WINDOW buckets. Instances
never share buckets, so an instance's layout depends on its own history only
(an instance stepped alone and within a batch ends with the same tensors).
"""

from __future__ import annotations

import functools

import torch

from schedspec.gpu_impl.batch_state import (
    BIG,
    EMPTY_BUCKET,
    NO_BUCKET,
    NO_HASH,
    TOMBSTONE,
    BatchState,
)
from schedspec.gpu_impl.flat_index import pick, selected, write_rows

# Buckets every lookup reads from an id's home before checking whether the run ended.
_FIRST_WIDTH = 3
# Buckets an insert looks at per round for one without an entry.
_PLACE_WINDOW = 4


def insert(state: BatchState, block_index: torch.Tensor, ids: torch.Tensor) -> None:
    """Index blocks that were just given content ids: block_index holds their flat
    positions (instance * N + block) in the [B, N] block tensors, each block once, and
    block_hash already holds their ids, which the caller passes as `ids` too (it has
    just written them: no gather of block_hash). Rows worn by deletions were rebuilt
    when they wore (`forget`), so an insert only places."""
    rows, blocks = _split(block_index, state.block_hash.shape[1])
    _place(state, rows, blocks, block_index, ids)


def _split(block_index: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat positions in a [B, n] tensor as (row, column); a power-of-two n (pool sizes
    often are) by a shift and a mask, a fifth of an int64 division's cost on the CPU."""
    if n & (n - 1) == 0:
        return block_index >> (n.bit_length() - 1), block_index & (n - 1)
    rows = torch.div(block_index, n, rounding_mode="floor")
    return rows, block_index - rows * n


def forget(state: BatchState, block_index: torch.Tensor) -> None:
    """Blocks lose their content ids (flat positions, each block once): their entries
    are deleted and block_hash set to NO_HASH; blocks without an id are skipped (their
    block_hash is NO_HASH already). Then the rows these deletions wore are rebuilt."""
    bucket = state.cache_bucket.view(-1).index_select(0, block_index)
    if bucket.numel() == 0 or int(bucket.max()) < 0:
        # The usual case: in the benchmark no block taken from the free queue still has
        # an id. One reduction tells (a compare and a nonzero cost more), and the
        # caller's block_hash write is spared too (about 20 us a call).
        return
    at = selected(bucket >= 0)
    block_index = pick(block_index, at)
    rows, _ = _split(block_index, state.block_hash.shape[1])
    h = state.cache_index.shape[1]
    write_rows(state.cache_index, rows * h + pick(bucket, at), TOMBSTONE)
    write_rows(state.cache_bucket, block_index, NO_BUCKET)
    write_rows(state.block_hash, block_index, NO_HASH)
    state.cache_deleted.index_add_(0, rows, torch.ones_like(rows))
    # Only rows that deleted here can have worn: the check costs nothing on inserts,
    # and an instance's layout still depends on its own history only.
    deleting = torch.zeros_like(state.cache_deleted, dtype=torch.bool).index_fill_(0, rows, True)
    worn = selected(deleting & (state.cache_deleted > h // 4))
    if worn.numel() > 0:
        rebuild(state, worn)


def rebuild(state: BatchState, inst: torch.Tensor) -> None:
    """Index the instances `inst` afresh from block_hash (blocks in id order)."""
    for field, empty in (
        (state.cache_index, EMPTY_BUCKET),
        (state.cache_bucket, NO_BUCKET),
        (state.cache_reach, 0),
        (state.cache_deleted, 0),
    ):
        field.index_fill_(0, inst, empty)
    n = state.block_hash.shape[1]
    hashes = state.block_hash.index_select(0, inst)
    at = selected(hashes != NO_HASH)
    rows = pick(inst.unsqueeze(1).expand(-1, n), at)
    blocks = pick(torch.arange(n, device=inst.device).expand(inst.numel(), n), at)
    _place(state, rows, blocks, rows * n + blocks, pick(hashes, at))


def find(
    state: BatchState, inst: torch.Tensor, ids: torch.Tensor, wanted: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For the wanted content ids among ids [I, M] of instances inst [I]: whether some
    block holds each one, and the oldest holder (EMPTY_BUCKET where none does)."""
    at = selected(wanted)
    holder = oldest_holders(state, pick(inst.unsqueeze(1).expand_as(ids), at), pick(ids, at))
    oldest = torch.full_like(ids, EMPTY_BUCKET)
    write_rows(oldest, at, holder)
    return oldest >= 0, oldest


def oldest_holders(state: BatchState, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """For content ids [P] of instances rows [P]: the block holding each one with the
    smallest reg_seq, EMPTY_BUCKET where none does. Host reads: one per pass (two passes
    at most), none per id."""
    h = state.cache_index.shape[1]
    key, entries = _probe(state, rows, ids, 0, _FIRST_WIDTH)
    # Only ids whose run went on past the window (no EMPTY_BUCKET in it), in instances
    # with entries farther out. Per step, on contiguous [P] rows: a reduction over the
    # few steps costs twice as much on the CPU.
    run_goes_on = functools.reduce(torch.logical_and, (entries != EMPTY_BUCKET).unbind(0))
    reach = state.cache_reach.index_select(0, rows)
    rest = selected(run_goes_on & (reach > _FIRST_WIDTH))
    if rest.numel() > 0:
        width = int(reach.index_select(0, rest).max()) - _FIRST_WIDTH
        more, _ = _probe(
            state, rows.index_select(0, rest), ids.index_select(0, rest), _FIRST_WIDTH, width
        )
        write_rows(key, rest, torch.minimum(key.index_select(0, rest), more))
    return torch.where(key < BIG, key & (h - 1), EMPTY_BUCKET)


def _probe(
    state: BatchState, rows: torch.Tensor, ids: torch.Tensor, start: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Buckets start..start+width-1 past each id's home ([P] ids of instances rows): the
    smallest key among the window's holders of the id (BIG: none), and the window's
    entries [width, P].

    A holder's key is reg_seq * H + its block (H, the buckets per row, is a power of two
    above the blocks per row): the smallest key is the oldest holder, read back by a
    mask, so one min finds both (reg_seq stays far below BIG / H). Steps lie along the
    first dimension, so that the reductions over them are ops on contiguous [P] rows.
    """
    h, n = state.cache_index.shape[1], state.block_hash.shape[1]
    steps = torch.arange(start, start + width, device=ids.device).unsqueeze(1)
    # The home bucket is the id's low bits: (id + step) & (H - 1) wraps within the row.
    # Flat positions (row * H + bucket, row * N + block) by one fused add each, no
    # multiply: an op's own cost is most of it at these sizes.
    entries = _flat_read(state.cache_index, torch.add((ids + steps) & (h - 1), rows, alpha=h))
    # An empty bucket reads block 0 of the row. That is harmless: if block 0 holds the id
    # it is one of the id's holders, with the same key as through its own entry (every
    # holder has an entry in the run, which the passes read whole).
    block = entries.clamp(min=0)
    flat_block = torch.add(block, rows, alpha=n)
    holds = _flat_read(state.block_hash, flat_block) == ids
    keys = torch.where(holds, torch.add(block, _flat_read(state.reg_seq, flat_block), alpha=h), BIG)
    return functools.reduce(torch.minimum, keys.unbind(0)), entries


def _flat_read(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x's entries at flat positions, shaped like index."""
    return x.view(-1).index_select(0, index.reshape(-1)).view(index.shape)


def _place(
    state: BatchState,
    rows: torch.Tensor,
    blocks: torch.Tensor,
    block_index: torch.Tensor,
    ids: torch.Tensor,
) -> None:
    """Enter blocks [K] of instances rows [K] (flat positions block_index; block_hash
    holds their ids, as does `ids`) by linear probing, in rounds. One
    host read per round. The first round proposes each entry's home bucket only
    (`_claim_homes`): the table is at most half full of entries, so most homes are
    free; the few left (home taken, or lost to an entry of the same call) look at
    windows of _PLACE_WINDOW buckets from the bucket after their home on."""
    h = state.cache_index.shape[1]
    home = ids & (h - 1)
    todo = _claim_homes(state, torch.add(home, rows, alpha=h), blocks)
    # Winners sit at their homes, at distance 0: their instances' reach is at least 1.
    write_rows(state.cache_bucket, block_index, home)
    state.cache_reach.scatter_reduce_(0, rows, torch.ones_like(rows), "amax")
    if todo.numel() == 0:
        return
    blocks, home, block_index, rows = (
        t.index_select(0, todo) for t in (blocks, home, block_index, rows)
    )
    base = rows * h
    # probe: home + the distance to the bucket taken (or, for those still left, to go on
    # from), unwrapped. The second round takes them all, from next to their homes: no
    # gathers for it.
    lost, probe = _propose(state, base, blocks, home + 1, width=_PLACE_WINDOW)
    pending = selected(lost)
    while pending.numel() > 0:
        args = [t.index_select(0, pending) for t in (base, blocks, probe)]
        lost, moved = _propose(state, *args, width=_PLACE_WINDOW)
        write_rows(probe, pending, moved)
        pending = pick(pending, selected(lost))
    write_rows(state.cache_bucket, block_index, probe & (h - 1))
    state.cache_reach.scatter_reduce_(0, rows, probe - home + 1, "amax")


def _claim_homes(state: BatchState, at: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The first round: each entry proposes its home bucket (flat positions at), where
    it holds no entry; where several propose one, the largest block id gets it. The
    positions (in at) of those that did not get their home, to go on from the next."""
    table = state.cache_index.view(-1)
    seen = table.index_select(0, at)
    proposes = seen < 0  # EMPTY_BUCKET or TOMBSTONE
    # Those whose home holds an entry write it back: no change. That entry is another
    # block (a block gets an entry only once it has an id), so the bucket names the
    # entry's own block exactly where it won.
    _claim(table, at, torch.where(proposes, blocks, seen))
    return selected(table.index_select(0, at) != blocks)


def _claim(table: torch.Tensor, at: torch.Tensor, values: torch.Tensor) -> None:
    """table[at] = the largest of the values written to each bucket. A bucket's writers
    either all propose their blocks (the bucket is free: its EMPTY_BUCKET or TOMBSTONE,
    negative, loses to any block) or all write back the entry it holds, so the bucket's
    own value can take part: amax with include_self costs a third of amin without it
    (6.6 against 17 us for 5K writes). Order-free, so CUDA's unordered writes agree."""
    table.scatter_reduce_(0, at, values, "amax")


def _propose(
    state: BatchState, base: torch.Tensor, blocks: torch.Tensor, probe: torch.Tensor, *, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One round: each entry (its row's first bucket at flat position base) proposes the
    first bucket without an entry in the `width` buckets from bucket `probe` (past the
    row's end: wrapped) on; where several propose one bucket, the largest block id gets
    it (block ids are distinct within a row, and a row's buckets are its own). Whether
    each is still without a bucket, and the probe of its bucket, or to go on from."""
    h = state.cache_index.shape[1]
    steps = torch.arange(width, device=base.device)
    window = base.unsqueeze(1) + ((probe.unsqueeze(1) + steps) & (h - 1))
    seen = _flat_read(state.cache_index, window)  # [K, width]
    # Whether the window has a free bucket (EMPTY_BUCKET or TOMBSTONE), and the first
    # one (max returns the first of equal values; 0 where none is free).
    proposes, first = (seen < 0).max(dim=1, keepdim=True)
    at = torch.gather(window, 1, first).squeeze(1)
    proposes = proposes.squeeze(1)
    # Those that saw no free bucket write back what their window's first bucket (at)
    # holds: no change (and, as in _claim_homes, not their own block).
    table = state.cache_index.view(-1)
    _claim(table, at, torch.where(proposes, blocks, seen[:, 0]))
    lost = table.index_select(0, at) != blocks
    # A winner stops on its bucket, a loser goes on past it, the others past the window.
    return lost, probe + torch.where(proposes, first.squeeze(1) + lost, width)
