"""The free-block queue's ring (gpu_impl/free_queue.py) against a plain list.

Worked examples first (front and back keys, holes left by prefix-cache hits
and a window that has to widen past them, renumbering once the span would
outgrow the ring), then random operation sequences compared with a Python
list after every operation, CONSERVATION's ring part watching throughout.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from schedspec.gpu_impl.batch_state import BIG, BatchState, empty_state
from schedspec.gpu_impl.free_queue import make_room, place, pop_front, ring_disagrees
from schedspec.spec import SchedulerConfig


def _state(num_blocks: int) -> BatchState:
    config = SchedulerConfig(
        block_size=1,
        num_blocks=num_blocks,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=num_blocks,
    )
    return empty_state(config, batch=2, slots=1, max_stops=1, device=torch.device("cpu"))


def _queue(state: BatchState, inst: int = 1) -> list[int]:
    """One instance's queue in order: its free blocks sorted by key."""
    free = torch.nonzero(state.free_key[inst] < BIG).squeeze(1)
    return free[torch.argsort(state.free_key[inst, free])].tolist()


def _pop(state: BatchState, need: list[int]) -> tuple[list[int], list[int]]:
    """Pop need[i] blocks from instance i's front, for each instance in one call."""
    counts = torch.tensor(need)
    owner = torch.repeat_interleave(torch.arange(len(need)), counts)
    blocks, block_index = pop_front(state, torch.arange(len(need)), counts, owner)
    return blocks.tolist(), block_index.tolist()


def _take(state: BatchState, count: int, inst: int = 1) -> list[int]:
    """Pop count blocks from one instance's front (the other instance asks for none)."""
    need = [0, 0]
    need[inst] = count
    blocks, block_index = _pop(state, need)
    assert block_index == [inst * state.free_key.shape[1] + block for block in blocks]
    return blocks


def _free(state: BatchState, block: int, cached: bool, inst: int = 1) -> None:
    """What release_tables does for one block losing its last reference: a key below
    every other without content, above every other with it."""
    rows = torch.tensor([inst])
    one, none = torch.tensor([1]), torch.tensor([0])
    make_room(state, rows, none if cached else one, one if cached else none)
    if cached:
        key = int(state.free_back[inst])
        state.free_back[inst] += 1
    else:
        state.free_front[inst] -= 1
        key = int(state.free_front[inst])
    place(state, rows, torch.tensor([block]), torch.tensor([key]))
    state.num_free[inst] += 1


def _hit(state: BatchState, block: int, inst: int = 1) -> None:
    """What a prefix-cache hit on a free block does (admission.py): it leaves the
    queue's middle, its ring entry stays behind as a hole."""
    state.free_key[inst, block] = BIG
    state.num_free[inst] -= 1


def _consistent(state: BatchState) -> bool:
    return not bool(ring_disagrees(state).any())


def test_front_keys_go_below_and_back_keys_above() -> None:
    state = _state(6)
    assert _take(state, 2) == [0, 1]
    assert int(state.free_front[1]) == 2  # past the keys taken
    _free(state, 0, cached=False)
    _free(state, 1, cached=True)
    assert _queue(state) == [0, 2, 3, 4, 5, 1]
    assert _take(state, 3) == [0, 2, 3]
    _free(state, 0, cached=False)
    _free(state, 2, cached=False)  # freed later: ahead of block 0
    assert _queue(state) == [2, 0, 4, 5, 1]
    assert _take(state, 4) == [2, 0, 4, 5]
    assert _queue(state) == [1]
    assert _queue(state, inst=0) == [0, 1, 2, 3, 4, 5]  # the other instance untouched
    assert _consistent(state)


def test_holes_left_by_hits_are_skipped_and_the_window_widens() -> None:
    state = _state(8)
    for block in (0, 1, 2, 3, 4):
        _hit(state, block)  # five holes right at the front
    assert _consistent(state)
    assert _take(state, 1) == [5]  # a window of 1 widens to 8 to find it
    assert int(state.free_front[1]) == 6
    assert _take(state, 1) == [6]  # no hole: the packed read
    assert int(state.free_front[1]) == 7
    _free(state, 6, cached=False)
    _free(state, 2, cached=True)
    assert _queue(state) == [6, 7, 2]
    _hit(state, 7)
    assert _take(state, 2) == [6, 2]
    assert _consistent(state)


def test_two_instances_take_in_one_call_in_instance_then_queue_order() -> None:
    state = _state(6)
    _hit(state, 1, inst=0)
    blocks, block_index = _pop(state, [2, 3])  # a hole in instance 0's front only
    assert blocks == [0, 2, 0, 1, 2]
    assert block_index == [0, 2, 6, 7, 8]
    assert state.num_free.tolist() == [3, 3]
    assert _queue(state, inst=0) == [3, 4, 5]
    assert _queue(state, inst=1) == [3, 4, 5]


def test_a_span_past_the_ring_renumbers_the_keys_in_queue_order() -> None:
    state = _state(4)
    ring = state.free_ring.shape[1]
    assert ring == 8
    # Blocks 1 and 2 cycle through hits and frees: each cycle hands out a back key
    # and leaves a hole, while the front (block 0, freed without content) stays put.
    _free(state, _take(state, 1)[0], cached=False)
    for _ in range(4):
        for block in (1, 2):
            _hit(state, block)
            _free(state, block, cached=True)
    # Eight back keys after the first four and one front key: a span of 13 unrenumbered.
    assert int(state.free_back[1]) - int(state.free_front[1]) <= ring
    assert _queue(state) == [0, 3, 1, 2]
    assert _consistent(state)
    assert _take(state, 3) == [0, 3, 1]
    assert _consistent(state)


@given(
    st.lists(
        st.tuples(st.sampled_from(["take", "free", "hit"]), st.integers(0, 7), st.booleans()),
        max_size=60,
    )
)
def test_random_operations_match_a_list(ops: list[tuple[str, int, bool]]) -> None:
    """take pops from the front, free puts a held block at the front (no content) or
    the back (content), hit takes a free block out of the middle."""
    state = _state(5)
    queue = list(range(5))
    held: list[int] = []
    for op, number, to_back in ops:
        if op == "take" and queue:
            count = number % len(queue) + 1
            expected, queue = queue[:count], queue[count:]
            assert _take(state, count) == expected
            held += expected
        elif op == "free" and held:
            block = held.pop(number % len(held))
            _free(state, block, cached=to_back)
            if to_back:
                queue.append(block)
            else:
                queue.insert(0, block)
        elif op == "hit" and queue:
            block = queue.pop(number % len(queue))
            _hit(state, block)
            held.append(block)
        assert _queue(state) == queue
        assert _consistent(state)
        assert int(state.num_free[1]) == len(queue)
