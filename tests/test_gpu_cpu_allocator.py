"""cpu_allocator: the thresholds take effect in glibc, and bad values are refused at the door."""

from __future__ import annotations

import ctypes
import sys

import pytest

from schedspec.gpu_impl.cpu_allocator import MAX_MMAP_THRESHOLD, _glibc, retain_freed_memory

GLIBC = _glibc() if sys.platform.startswith("linux") else None
GLIBC_DEFAULT = 128 * 1024  # glibc's initial mmap and trim thresholds


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mmapped_regions_while_holding(size: int) -> int:
    """How many more regions malloc has mmapped while one block of `size` bytes is live."""
    assert GLIBC is not None
    GLIBC.mallinfo2.restype = _MallInfo2
    GLIBC.malloc.restype = ctypes.c_void_p
    GLIBC.malloc.argtypes = [ctypes.c_size_t]
    GLIBC.free.argtypes = [ctypes.c_void_p]
    before = GLIBC.mallinfo2().hblks
    block = GLIBC.malloc(size)
    during = GLIBC.mallinfo2().hblks
    GLIBC.free(block)
    return int(during - before)


@pytest.mark.skipif(
    GLIBC is None or not hasattr(GLIBC, "mallinfo2"), reason="glibc >= 2.33 (mallinfo2)"
)
def test_a_large_block_comes_from_the_heap_once_retained() -> None:
    """4 MiB (a [4096, 128] int64 temporary): an mmap of its own under glibc's default
    threshold, the heap once retain_freed_memory raised it."""
    four_mib = 4 * 1024 * 1024
    try:
        assert retain_freed_memory(GLIBC_DEFAULT, GLIBC_DEFAULT) is True
        assert _mmapped_regions_while_holding(four_mib) == 1
        assert retain_freed_memory() is True
        assert _mmapped_regions_while_holding(four_mib) == 0
    finally:
        retain_freed_memory(GLIBC_DEFAULT, GLIBC_DEFAULT)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mmap_threshold": 0}, "mmap_threshold must be in 1..33554432"),
        ({"mmap_threshold": MAX_MMAP_THRESHOLD + 1}, "got 33554433"),
        ({"trim_threshold": 0}, "trim_threshold must be > 0, got 0"),
    ],
)
def test_out_of_range_thresholds_name_the_field_and_bound(
    kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        retain_freed_memory(**kwargs)
