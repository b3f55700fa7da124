"""Does vLLM's scheduler work in this environment? Build and step a real VllmEngine.

    python -m schedspec.adapters.vllm.probe

builds a `VllmEngine` for every config family the adapter supports (no drafts, n-gram
drafts, EAGLE drafts; fcfs and priority; prefix caching on and off; sync and async
scheduling) and steps each one under the harness (the engine core's order of calls, the
safety invariants checked) until its requests finish, with every per-user cache vLLM,
Hugging Face and the XDG folders point at replaced by an empty temporary folder. Exit
status 0 when all of them work; 1, with the family and the error, when one does not.

The empty caches are the point: vLLM inspects a model's architecture in a subprocess
(`python -m vllm.model_executor.models.registry`) that imports the model's code, and
caches the answer per user (~/.cache/vllm). A warm cache from another venv hides a
package that only that import needs (einops, once), so a probe that reads it says yes
to a venv in which no engine can be built.

scripts/install_vllm.sh runs this before installing (a venv that passes needs nothing)
and after (the install is done only when it passes).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Literal

from schedspec.adapters import empty_caches as caches
from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.engines.events import AddRequest, Drain, ProposeDrafts, Step
from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError
from schedspec.spec import SchedulerConfig
from schedspec.spec.config import POLICIES, Policy

# Each is read where a per-user cache or config folder is chosen: XDG_* by vLLM's
# defaults and most libraries, VLLM_* and HF_HOME override those when a user set them.
CACHE_VARIABLES = (
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "VLLM_CACHE_ROOT",
    "VLLM_CONFIG_ROOT",
    "HF_HOME",
)
Drafter = Literal["none", "ngram", "eagle"]
DRAFTERS: tuple[Drafter, ...] = ("none", "ngram", "eagle")
# Steps with drafts proposed between them (a synchronous engine core's drafter), before
# the drain runs the requests to the end.
NUM_DRAFTING_STEPS = 2


@dataclass(frozen=True)
class Family:
    """One config family of the adapter: a drafter, a policy, prefix caching on or off,
    sync or async scheduling."""

    drafter: Drafter
    policy: Policy
    prefix_caching: bool
    async_scheduling: bool = False

    def config(self) -> SchedulerConfig:
        drafts = 0 if self.drafter == "none" else 2
        return SchedulerConfig(
            block_size=16,
            num_blocks=32,
            max_num_batched_tokens=64,
            max_num_seqs=4,
            max_model_len=256,
            enable_prefix_caching=self.prefix_caching,
            policy=self.policy,
            num_speculative_tokens=drafts,
            # vLLM's n-gram drafter reserves no lookahead slots, its EAGLE drafter one per draft.
            num_lookahead_tokens=drafts if self.drafter == "eagle" else 0,
            async_scheduling=self.async_scheduling,
            # vLLM pads whenever it speculates.
            pad_spec_decode=drafts > 0,
        )

    def __str__(self) -> str:
        caching = "prefix caching on" if self.prefix_caching else "prefix caching off"
        mode = "async" if self.async_scheduling else "sync"
        return f"drafter={self.drafter}, policy={self.policy}, {caching}, {mode}"


FAMILIES = tuple(
    Family(drafter, policy, caching, mode)
    for drafter, policy, caching, mode in itertools.product(
        DRAFTERS, POLICIES, (False, True), (False, True)
    )
)


class ProbeError(RuntimeError):
    """A family's engine was built but did not do its work."""


def step_family(family: Family) -> int:
    """Build the family's engine and run two requests that share a prefix to the end
    under the harness; return the schedule() calls it took. Raises whatever vLLM raises,
    or ProbeError when an invariant breaks (a request left unfinished among them)."""
    config = family.config()
    checked = CheckedEngine(VllmEngine(config), config, "safety")
    shared = tuple(range(40))  # over two blocks: the second request's prefix-cache hit
    try:
        checked.apply(AddRequest("a", (*shared, 7, 8), max_tokens=3, priority=1))
        checked.apply(AddRequest("b", (*shared, 9), max_tokens=3, priority=0))
        for _ in range(NUM_DRAFTING_STEPS):
            checked.apply(Step())
            if config.num_speculative_tokens:
                # The harness skips this under async scheduling, as vLLM's engine core does.
                k = config.num_speculative_tokens
                checked.apply(ProposeDrafts(dict.fromkeys(checked.state.running, k)))
        checked.apply(Drain())
    except InvariantViolationError as err:
        raise ProbeError(f"{family}: {err}") from err
    return checked.stats.steps


def empty_caches() -> contextlib.AbstractContextManager[str]:
    """Each of CACHE_VARIABLES names its own new empty folder (under the folder yielded)
    until the block ends; then the folders go and the variables are as they were."""
    return caches.empty_caches(CACHE_VARIABLES, "schedspec-vllm-probe-")


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

    Meant for a fresh process (`python -m`): vLLM and huggingface_hub read some of the
    cache variables once, when first imported."""
    start = time.monotonic()
    with empty_caches():
        try:
            probe()
        except ProbeError:
            traceback.print_exc()
            print("vLLM probe: FAILED (the last line of the traceback names the config family)")
            return 1
    print(
        f"vLLM probe: built and stepped {len(FAMILIES)} VllmEngines (drafters none, ngram, "
        f"eagle; fcfs, priority; prefix caching off, on; sync, async) with empty caches in "
        f"{time.monotonic() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
