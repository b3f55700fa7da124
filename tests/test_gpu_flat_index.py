"""flat_index: pair reads and masked writes agree with advanced indexing, padding included."""

from __future__ import annotations

import torch

from schedspec.gpu_impl.flat_index import pick, put_at, selected, take_at


def test_take_at_reads_pairs_and_their_trailing_rows() -> None:
    x = torch.arange(12).view(3, 4)
    rows = torch.tensor([[0, 0], [2, 1]])
    cols = torch.tensor([[1, 0], [3, 3]])
    assert take_at(x, rows, cols).tolist() == [[1, 0], [11, 7]]
    table = torch.arange(24).view(2, 3, 4)  # [B, S, M]: whole tables come back
    assert take_at(table, torch.tensor([1, 0]), torch.tensor([2, 0])).tolist() == [
        [20, 21, 22, 23],
        [0, 1, 2, 3],
    ]


def test_put_at_writes_only_where_the_mask_holds() -> None:
    """Padding entries point at a real slot (here (0, 1), also written for real, and
    (2, 3) twice): they add nothing, whatever order the scatter takes them in."""
    x = torch.arange(12).view(3, 4).clone()
    rows = torch.tensor([[0, 0, 0], [2, 2, 2]])
    cols = torch.tensor([[1, 1, 0], [3, 3, 2]])
    values = torch.tensor([[100, -5, 200], [-7, -8, 300]])
    mask = torch.tensor([[True, False, True], [False, False, True]])
    put_at(x, rows, cols, values, mask)
    assert x.tolist() == [[200, 100, 2, 3], [4, 5, 6, 7], [8, 9, 300, 11]]


def test_put_at_takes_a_scalar_and_large_jumps() -> None:
    """Keys move between BIG-sized values and negatives: the delta wraps nowhere."""
    big = 2**62
    x = torch.tensor([[big, big], [-3, big]])
    put_at(x, torch.tensor([0, 1]), torch.tensor([1, 0]), -(2**40), torch.tensor([True, True]))
    assert x.tolist() == [[big, -(2**40)], [-(2**40), big]]


def test_selected_positions_pick_the_masked_entries_in_reading_order() -> None:
    mask = torch.tensor([[[False, True], [True, False]], [[False, False], [True, True]]])
    values = torch.arange(8).view(2, 2, 2) * 10
    positions = selected(mask)
    assert positions.tolist() == [1, 2, 6, 7]
    assert pick(values, positions).tolist() == values[mask].tolist() == [10, 20, 60, 70]
