"""The scheduler state of B instances as tensors on one device.

Every per-request tensor is [B, S, ...]: instance, request slot. A slot is
EMPTY until a request is added there and EMPTY again once it finishes; the
caller names the slot (the B = 1 adapter keeps id <-> slot on the host).
Queue orders are keys, not lists, so that a step never shuffles memory:

- the running list is the RUNNING slots sorted by `run_key` (a counter
  bumped on admission: appending to the list);
- the waiting queue is the WAITING/PREEMPTED slots sorted by `wait_key`
  (fcfs: a back counter for arrivals, a front counter going down for
  preempted requests put back at the head; priority: (priority, arrival));
- the free-block queue is the blocks with ref count 0 sorted by `free_key`
  (front keys go down, back keys go up), so popping the front is taking
  the smallest keys; a held block's key is BIG, so the smallest keys of a
  row are free blocks without masking by ref count, and `num_free` counts
  the queue without a pass over the pool. `free_ring` indexes the keys, so
  that taking blocks reads the queue's front only (free_queue.py);
- the prefix cache is a block's `block_hash` (-1: not cached); among blocks
  holding one hash the lookup takes the smallest `reg_seq` (the oldest
  registration), as the reference's map does. `cache_index` finds the
  holders of a hash without a pass over the pool (prefix_index.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from schedspec.spec import SchedulerConfig

# Slot status codes (finished requests leave their slot: EMPTY).
EMPTY = 0
WAITING = 1
RUNNING = 2
PREEMPTED = 3

# Finish codes reported by update_from_output (aborts are the caller's to report).
NOT_FINISHED = 0
FINISHED_STOPPED = 1
FINISHED_LENGTH_CAPPED = 2

NO_BLOCK = -1
NO_HASH = -1
EMPTY_BUCKET = -1  # a cache_index bucket never used since the row was (re)built
TOMBSTONE = -2  # a cache_index bucket whose entry was deleted
NO_BUCKET = -1  # cache_bucket of a block with no content id
NO_TOKEN = -1
# Larger than any key a run can reach, smaller than int64 overflow in sums.
BIG = 2**62
# Priorities are packed with the arrival index into one int64 sort key.
PRIORITY_LIMIT = 2**30
ARRIVAL_SHIFT = 2**32


@dataclass
class BatchState:
    """All mutable scheduler state of B instances (one config for all)."""

    # --- per request slot [B, S]
    status: torch.Tensor  # EMPTY / WAITING / RUNNING / PREEMPTED
    arrival: torch.Tensor  # position in the instance's add order
    priority: torch.Tensor
    num_prompt: torch.Tensor
    num_tokens: torch.Tensor  # prompt + kept outputs
    num_computed: torch.Tensor
    max_tokens: torch.Tensor
    num_preemptions: torch.Tensor
    eos: torch.Tensor  # NO_TOKEN: none
    stops: torch.Tensor  # [B, S, Q] stop token ids, NO_TOKEN padded
    spec: torch.Tensor  # [B, S, K] drafts to verify next step
    num_spec: torch.Tensor
    is_prefill_chunk: torch.Tensor  # bool: the last step stopped short of the known tokens
    # The pipeline (async scheduling; docs/SPEC.md): tokens scheduled whose output has
    # not landed, the output positions of in-flight sampling steps (1 + drafts each,
    # async only), and the in-flight tokens of steps from before a preemption.
    num_in_flight: torch.Tensor
    num_placeholders: torch.Tensor
    num_stale: torch.Tensor
    table: torch.Tensor  # [B, S, M] block ids, NO_BLOCK padded
    num_held: torch.Tensor  # blocks in the table
    num_cached_block: torch.Tensor  # leading table blocks registered in the prefix cache
    req_hash: torch.Tensor  # [B, S, M] content id of each full block of known tokens
    hash_acc: torch.Tensor  # running sum of token mixes over all known tokens
    run_key: torch.Tensor
    wait_key: torch.Tensor
    # --- per block [B, N]
    ref_cnt: torch.Tensor
    free_key: torch.Tensor  # order in the free queue; BIG while the block is held
    block_hash: torch.Tensor  # NO_HASH: not in the prefix cache
    reg_seq: torch.Tensor  # registration order of the cached content
    cache_bucket: torch.Tensor  # the block's bucket in cache_index; NO_BUCKET: uncached
    # --- prefix-cache index per instance [B, H] (prefix_index.py)
    cache_index: torch.Tensor  # bucket -> a block holding an id; EMPTY_BUCKET, TOMBSTONE
    # --- free-queue ring per instance [B, R] (free_queue.py)
    free_ring: torch.Tensor  # key k -> at k mod R, the block given key k (stale once retaken)
    # --- per instance [B]
    num_free: torch.Tensor  # blocks with ref count 0 (the free queue's length)
    next_arrival: torch.Tensor
    free_front: torch.Tensor  # no free block's key is below it; the next front key is one less
    free_back: torch.Tensor  # the next back key
    next_reg: torch.Tensor
    next_run: torch.Tensor
    wait_front: torch.Tensor
    wait_back: torch.Tensor
    cache_reach: torch.Tensor  # every index entry lies less than this past its id's home
    cache_deleted: torch.Tensor  # index entries deleted since the last rebuild (>= tombstones)

    @property
    def device(self) -> torch.device:
        return self.status.device

    @property
    def batch(self) -> int:
        return int(self.status.shape[0])

    @property
    def slots(self) -> int:
        return int(self.status.shape[1])


def max_blocks_per_request(config: SchedulerConfig) -> int:
    return -(-config.max_model_len // config.block_size)


def index_size(num_blocks: int) -> int:
    """Buckets of an instance's cache_index: a power of two (an id's home bucket is its
    low bits) at least twice the blocks, so the table is never more than half full."""
    return 1 << max(2 * num_blocks - 1, 1).bit_length()


def empty_state(
    config: SchedulerConfig, batch: int, slots: int, max_stops: int, device: torch.device
) -> BatchState:
    """B idle instances: every slot EMPTY, every block free in id order."""

    def full(shape: tuple[int, ...], value: int) -> torch.Tensor:
        return torch.full(shape, value, dtype=torch.int64, device=device)

    b, s, n = batch, slots, config.num_blocks
    m = max_blocks_per_request(config)
    k = max(config.num_speculative_tokens, 1)
    return BatchState(
        status=full((b, s), EMPTY),
        arrival=full((b, s), 0),
        priority=full((b, s), 0),
        num_prompt=full((b, s), 0),
        num_tokens=full((b, s), 0),
        num_computed=full((b, s), 0),
        max_tokens=full((b, s), 0),
        num_preemptions=full((b, s), 0),
        eos=full((b, s), NO_TOKEN),
        stops=full((b, s, max(max_stops, 1)), NO_TOKEN),
        spec=full((b, s, k), NO_TOKEN),
        num_spec=full((b, s), 0),
        is_prefill_chunk=torch.zeros((b, s), dtype=torch.bool, device=device),
        num_in_flight=full((b, s), 0),
        num_placeholders=full((b, s), 0),
        num_stale=full((b, s), 0),
        table=full((b, s, m), NO_BLOCK),
        num_held=full((b, s), 0),
        num_cached_block=full((b, s), 0),
        req_hash=full((b, s, m), NO_HASH),
        hash_acc=full((b, s), 0),
        run_key=full((b, s), 0),
        wait_key=full((b, s), 0),
        ref_cnt=full((b, n), 0),
        free_key=torch.arange(n, dtype=torch.int64, device=device).expand(b, n).clone(),
        block_hash=full((b, n), NO_HASH),
        reg_seq=full((b, n), 0),
        cache_bucket=full((b, n), NO_BUCKET),
        cache_index=full((b, index_size(n)), EMPTY_BUCKET),
        free_ring=_first_ring(b, n, device),
        num_free=full((b,), n),
        next_arrival=full((b,), 0),
        free_front=full((b,), 0),
        free_back=full((b,), n),
        next_reg=full((b,), 0),
        next_run=full((b,), 0),
        wait_front=full((b,), 0),
        wait_back=full((b,), 0),
        cache_reach=full((b,), 0),
        cache_deleted=full((b,), 0),
    )


def _first_ring(batch: int, num_blocks: int, device: torch.device) -> torch.Tensor:
    """The free-queue ring of the first free queue (block b keyed b): a power of two
    (a key's entry is its low bits) at least twice the blocks, so that holes left by
    blocks taken from the queue's middle rarely force a renumbering."""
    ring = torch.zeros((batch, index_size(num_blocks)), dtype=torch.int64, device=device)
    ring[:, :num_blocks] = torch.arange(num_blocks, device=device)
    return ring


# Per-block, per-bucket and per-key tensors: their second dimension is not the slot one.
_NOT_PER_SLOT = (
    "ref_cnt",
    "free_key",
    "block_hash",
    "reg_seq",
    "cache_bucket",
    "cache_index",
    "free_ring",
)
# Fill values of the per-slot tensors, for growing the slot dimension.
_SLOT_FILL = {"eos": NO_TOKEN, "stops": NO_TOKEN, "spec": NO_TOKEN, "table": NO_BLOCK}
_SLOT_FILL["req_hash"] = NO_HASH


def grow(state: BatchState, slots: int, max_stops: int) -> BatchState:
    """The same state with at least `slots` slots and `max_stops` stop ids per request."""
    changes: dict[str, torch.Tensor] = {}
    for field in dataclasses.fields(state):
        tensor: torch.Tensor = getattr(state, field.name)
        if tensor.dim() < 2 or field.name in _NOT_PER_SLOT:
            continue
        fill = _SLOT_FILL.get(field.name, 0)
        extra = slots - tensor.shape[1]
        if extra > 0:
            pad = torch.full(
                (tensor.shape[0], extra, *tensor.shape[2:]),
                fill,
                dtype=tensor.dtype,
                device=tensor.device,
            )
            tensor = torch.cat([tensor, pad], dim=1)
        if field.name == "stops" and tensor.shape[2] < max_stops:
            pad = torch.full(
                (*tensor.shape[:2], max_stops - tensor.shape[2]),
                fill,
                dtype=tensor.dtype,
                device=tensor.device,
            )
            tensor = torch.cat([tensor, pad], dim=2)
        changes[field.name] = tensor
    return dataclasses.replace(state, **changes)


def num_free_blocks(state: BatchState) -> torch.Tensor:
    """[B] blocks in the free queue (ref count 0), kept as a counter by the block moves."""
    return state.num_free


def floor_div(a: torch.Tensor, b: int) -> torch.Tensor:
    """floor(a / b) for a positive b. A power of two (block sizes usually are) divides by
    an arithmetic shift, which floors like the division and costs a fifth of it on the
    CPU for int64."""
    if b & (b - 1) == 0:
        return a >> (b.bit_length() - 1)
    return torch.div(a, b, rounding_mode="floor")


def cdiv(a: torch.Tensor, b: int) -> torch.Tensor:
    """ceil(a / b) for a positive b."""
    return floor_div(a + (b - 1), b)
