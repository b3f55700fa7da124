"""What the install probe builds for vLLM, which `python -m schedspec.properties.probe
vllm` runs (`schedspec install vllm` runs it): a VllmEngine for every config family the
adapter supports (no drafts, n-gram drafts, EAGLE drafts; fcfs and priority; prefix
caching on and off; sync and async scheduling), with every per-user cache vLLM, Hugging
Face and the XDG folders point at replaced by an empty temporary folder. Each config has
the installed release's knob values (adapters/vllm/releases.py), with cache-aware
admission on where the release has it and vLLM applies it (fcfs, prefix caching); the
plan's name says which release it is ("vLLM 0.34.0"), and an unsupported one fails
every family with the supported range.

The empty caches are the point: vLLM inspects a model's architecture in a subprocess
(`python -m vllm.model_executor.models.registry`) that imports the model's code, and
caches the answer per user (~/.cache/vllm). A warm cache from another venv hides a
package that only that import needs (einops, once), so a probe that reads it says yes
to a venv in which no engine can be built.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from schedspec.adapters.probe_plan import ProbePlan
from schedspec.adapters.vllm.engine import VllmEngine
from schedspec.adapters.vllm.releases import current_release, describe_installed
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
        release = current_release()  # UnsupportedVllmError for an unsupported one
        reorders = release.cache_aware_admission and self.prefix_caching
        config = SchedulerConfig(
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
            # Threshold 0: it reorders on every step with two waiting (ignored under
            # priority, as vLLM ignores it).
            cache_aware_admission_window=4 if reorders else 0,
            cache_aware_admission_threshold=0.0 if reorders else 0.5,
        )
        return release.knobs(config)

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
PLAN = ProbePlan(
    engine=describe_installed(),  # "vLLM 0.34.0": its probe's lines name the release
    build=VllmEngine,
    built="VllmEngines",
    families=FAMILIES,
    spans="drafters none, ngram, eagle; fcfs, priority; prefix caching off, on; sync, async; "
    "the release's knobs",
    cache_variables=CACHE_VARIABLES,
)
