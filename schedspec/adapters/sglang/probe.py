"""Does SGLang's scheduler work in this environment? Build and step a real SGLangEngine.

    python -m schedspec.adapters.sglang.probe

builds an `SGLangEngine` for every config family the adapter supports (the plain and
the overlap loop; radix cache off and on; page sizes 1 and 4; mixed chunk off and on)
and steps each one under the harness (the engine core's order of calls, the safety
invariants checked) until its requests finish, with every per-user cache SGLang,
Triton, Hugging Face and the XDG folders point at replaced by an empty temporary folder
(adapters/empty_caches.py says why). Exit status 0 when all of them work; 1, with the
family and the error, when one does not.

scripts/install_sglang.sh runs this before installing (a venv that passes needs nothing)
and after (the install is done only when it passes).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
import traceback
from dataclasses import dataclass

from schedspec.adapters import empty_caches as caches
from schedspec.adapters.sglang.engine import SGLangEngine
from schedspec.engines.events import AddRequest, Drain, Step
from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError
from schedspec.spec import SchedulerConfig

# Read where a per-user cache or config folder is chosen: XDG_* by most libraries'
# defaults, SGLANG_CACHE_DIR by SGLang (it points Triton's and other JIT caches under
# it unless TRITON_CACHE_DIR is set), HF_HOME by Hugging Face.
CACHE_VARIABLES = (
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "SGLANG_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "HF_HOME",
)
# Steps before the drain runs the requests to the end: the first prefills, the second
# decodes (or prefills the second request, SGLang's prefill-first rule).
NUM_STEPS = 2


@dataclass(frozen=True)
class Family:
    """One config family of the adapter: the loop, the radix cache, the page size,
    mixed chunk (only with chunked prefill, which every family has)."""

    overlap: bool
    radix_cache: bool
    page_size: int
    mixed_chunk: bool

    def config(self) -> SchedulerConfig:
        return SchedulerConfig(
            family="sglang",
            block_size=self.page_size,
            num_blocks=256 // self.page_size,
            # Under the prompts' 42 and 41 tokens: the first prompt takes two chunks.
            max_num_batched_tokens=32,
            max_num_seqs=4,
            max_model_len=128,
            enable_prefix_caching=self.radix_cache,
            enable_mixed_chunk=self.mixed_chunk,
            async_scheduling=self.overlap,
        )

    def __str__(self) -> str:
        return (
            f"{'overlap' if self.overlap else 'plain'} loop, "
            f"radix cache {'on' if self.radix_cache else 'off'}, page size {self.page_size}, "
            f"mixed chunk {'on' if self.mixed_chunk else 'off'}"
        )


FAMILIES = tuple(
    Family(overlap, radix, page_size, mixed)
    for overlap, radix, page_size, mixed in itertools.product(
        (False, True), (False, True), (1, 4), (False, True)
    )
)


class ProbeError(RuntimeError):
    """A family's engine was built but did not do its work."""


def step_family(family: Family) -> int:
    """Build the family's engine and run two requests that share a prefix to the end
    under the harness; return the schedule() calls it took. Raises whatever SGLang
    raises, or ProbeError when an invariant breaks (a request left unfinished among
    them)."""
    config = family.config()
    checked = CheckedEngine(SGLangEngine(config), config, "safety")
    shared = tuple(range(40))  # ten pages of 4: the second request's radix-cache hit
    try:
        checked.apply(AddRequest("a", (*shared, 7, 8), max_tokens=3))
        checked.apply(AddRequest("b", (*shared, 9), max_tokens=3))
        for _ in range(NUM_STEPS):
            checked.apply(Step())
        checked.apply(Drain())
    except InvariantViolationError as err:
        raise ProbeError(f"{family}: {err}") from err
    return checked.stats.steps


def empty_caches() -> contextlib.AbstractContextManager[str]:
    """Each of CACHE_VARIABLES names its own new empty folder until the block ends."""
    return caches.empty_caches(CACHE_VARIABLES, "schedspec-sglang-probe-")


def probe() -> None:
    """Step every family's engine in this process; raise ProbeError on the first that
    fails, naming the family."""
    for family in FAMILIES:
        try:
            step_family(family)
        except Exception as err:
            raise ProbeError(f"{family}: {type(err).__name__}: {err}") from err


def main() -> int:
    """The probe with empty caches: 0 if every family works, 1 (and why) if not.

    Meant for a fresh process (`python -m`): SGLang reads some of the cache variables
    once, when first imported."""
    start = time.monotonic()
    with empty_caches():
        try:
            probe()
        except ProbeError:
            traceback.print_exc()
            print("SGLang probe: FAILED (the last line of the traceback names the config family)")
            return 1
    print(
        f"SGLang probe: built and stepped {len(FAMILIES)} SGLangEngines (plain, overlap "
        f"loop; radix cache off, on; page size 1, 4; mixed chunk off, on) with empty caches "
        f"in {time.monotonic() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
