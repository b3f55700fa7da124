"""cpu_allocator: the thresholds take effect in glibc, and bad values are refused at the door."""

from __future__ import annotations

import subprocess
import sys

import pytest

from schedspec.gpu_impl.cpu_allocator import MAX_MMAP_THRESHOLD, _glibc, retain_freed_memory

GLIBC = _glibc() if sys.platform.startswith("linux") else None


# Run in a fresh process: in a long-lived one, an earlier free chunk of the heap may
# serve the block whatever the threshold says.
_PROBE = """
import ctypes
from schedspec.gpu_impl.cpu_allocator import _glibc, retain_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(f"f{i}", ctypes.c_size_t) for i in range(10)]  # hblks is the 4th

libc = _glibc()
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mmapped_while_holding(size):
    before = libc.mallinfo2().f3
    block = libc.malloc(size)
    during = libc.mallinfo2().f3
    libc.free(block)
    return during - before

four_mib = 4 * 1024 * 1024
untuned = mmapped_while_holding(four_mib)
assert retain_freed_memory()
print(untuned, mmapped_while_holding(four_mib))
"""


@pytest.mark.skipif(
    GLIBC is None or not hasattr(GLIBC, "mallinfo2"), reason="glibc >= 2.33 (mallinfo2)"
)
def test_a_large_block_comes_from_the_heap_once_retained() -> None:
    """4 MiB (a [4096, 128] int64 temporary): an mmap of its own under glibc's default
    threshold, the heap once retain_freed_memory raised it."""
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True
    )
    assert probe.stdout.split() == ["1", "0"]


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
