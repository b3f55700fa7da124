"""What the install probe builds for SGLang, which `python -m schedspec.properties.probe
sglang` runs (`schedspec install sglang` runs it): an SGLangEngine for every config
family the adapter supports (the plain and the overlap loop; radix cache off and on;
page sizes 1 and 4; mixed chunk off and on), with every per-user cache SGLang, Triton,
Hugging Face and the XDG folders point at replaced by an empty temporary folder: SGLang
and Triton cache compiled kernels per user, and a cache warmed by another venv can hide
a package missing from this one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from schedspec.adapters.probe_plan import ProbePlan
from schedspec.adapters.sglang.engine import SGLangEngine
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
PLAN = ProbePlan(
    engine="SGLang",
    build=SGLangEngine,
    built="SGLangEngines",
    families=FAMILIES,
    spans="plain, overlap loop; radix cache off, on; page size 1, 4; mixed chunk off, on",
    cache_variables=CACHE_VARIABLES,
)
