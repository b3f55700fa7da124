"""Keep freed tensor memory inside the process when gpu_impl runs on the CPU.

A batched step allocates and frees a few hundred temporaries of 0.1-8 MB.
glibc's malloc serves every request above its mmap threshold (128 KiB
until it adapts) with a fresh mmap and unmaps it on free, and trims the
heap top past its trim threshold, so the next temporary of the same size
page-faults its memory back in, one 4 KiB page at a time: at B = 4096 that
was about a quarter of a tick. Raising both thresholds keeps the freed
blocks in malloc's free lists for reuse. This is the knob PyTorch's CPU
tuning guide reaches through a different allocator (jemalloc, tcmalloc);
mallopt needs no extra library. It is process-wide, so only entry points
that own the process (the benchmark, swarm mode) call it, never the engine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# mallopt(3) documents 32 MiB as the largest mmap threshold on 64-bit systems (some
# glibc versions accept more; this module stays within the documented bound).
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024
DEFAULT_MMAP_THRESHOLD = MAX_MMAP_THRESHOLD
DEFAULT_TRIM_THRESHOLD = 1024 * 1024 * 1024


def retain_freed_memory(
    mmap_threshold: int = DEFAULT_MMAP_THRESHOLD, trim_threshold: int = DEFAULT_TRIM_THRESHOLD
) -> bool:
    """Serve allocations up to `mmap_threshold` bytes from malloc's heap and keep up to
    `trim_threshold` free bytes at its top. True where glibc accepted both settings;
    False where there is no glibc (other platforms keep their own allocator)."""
    if not 0 < mmap_threshold <= MAX_MMAP_THRESHOLD:
        raise ValueError(
            f"mmap_threshold must be in 1..{MAX_MMAP_THRESHOLD} (mallopt's documented limit), "
            f"got {mmap_threshold}"
        )
    if trim_threshold <= 0:
        raise ValueError(f"trim_threshold must be > 0, got {trim_threshold}")
    libc = _glibc()
    if libc is None:
        return False
    mmap_ok = int(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) == 1
    trim_ok = int(libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)) == 1
    return mmap_ok and trim_ok


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):  # musl has no mallopt
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
