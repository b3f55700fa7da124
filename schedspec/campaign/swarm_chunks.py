"""Swarm mode's configs in chunks, run in this process or by any workers.ChunkRunner.

A chunk of swarm mode is `chunk.examples` configs drawn by Hypothesis on chunk.seed,
config k of it one swarm (swarm.run_swarm) on seed chunk.seed + k: run_configs, the one
place configs are drawn and run, so a run of one chunk is the plain swarm run of its
seed. A chunk stops at its first finding (already replayed on both engines and shrunk by
run_swarm, in the worker), or when its deadline has passed.

SwarmWork is the `work` a runner is given: a plain value (it pickles, so Ray ships it to
another machine; the configs go by name and are loaded in the worker). run_swarm_campaign
plans nothing itself: it hands the chunks to parallel.gather_chunks, the loop the suite's
campaigns run through, and merges each chunk's results in chunk order: a count run stops
at the first finding, a campaign (keep_going) keeps every distinct one (by the device
checks it broke and its shrunk trace), each later one's trace written under its chunk's
seed as the suite's campaigns write theirs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from schedspec.campaign.chunk_work import ChunkProgress
from schedspec.campaign.parallel import (
    CampaignTally,
    Finding,
    Merged,
    gather_chunks,
    kept_finding,
    lost_chunk,
)
from schedspec.campaign.swarm import SwarmResult, run_swarm
from schedspec.campaign.swarm_trace import SwarmRun
from schedspec.campaign.workers import ChunkRunner, WorkerCrashed, WorkerLost, report_progress
from schedspec.engines.registry import load_config_strategy
from schedspec.gpu_impl.cpu_allocator import retain_freed_memory
from schedspec.properties.strategies.configs import (
    ConfigStrategyError,
    checked_configs,
    configs,
)
from schedspec.properties.strategies.constant_pool import local_constants_pinned
from schedspec.properties.suite import Chunk
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile
from schedspec.traces.trace import SWARM_TRACE_STEM

# Configs in a chunk at most. A config is seconds of work at most (--instances instances
# for --max-steps ticks), so a chunk of 4 is short enough that a lost worker loses little
# and a campaign's deadline is kept, long enough that its start is a small part of it.
SWARM_CHUNK_CONFIGS = 4


@dataclass(frozen=True)
class SwarmSettings:
    """One swarm per config: how many instances, for how many ticks, where, checked how."""

    instances: int
    ticks: int
    device: str
    profile: Profile
    shrink_seconds: float  # 0: a finding is not shrunk


def prepare_device(device: str) -> None:
    """Set up this process for swarms on `device`: on the CPU, one intra-op thread (a tick's
    tensors are small: threads cost more in hand-offs than they win; and no thread pool
    is started before a fork) and freed temporaries kept in malloc (cpu_allocator.py;
    the process is the command's or a worker's own)."""
    if device == "cpu":
        torch.set_num_threads(1)
        retain_freed_memory()


def run_configs(
    strategy: st.SearchStrategy[SchedulerConfig],
    count: int,
    seed: int,
    swarm: SwarmSettings,
    on_config: Callable[[SwarmResult], None] | None = None,
    deadline: float | None = None,
) -> list[SwarmResult]:
    """`count` configs drawn on `seed`, config k a swarm on seed + k, until one finds
    something or the deadline (time.time()) passes; on_config is told each result."""
    results: list[SwarmResult] = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate])
    @given(config=checked_configs(strategy))  # --configs' mistakes: ConfigStrategyError
    def one_config(config: SchedulerConfig) -> None:
        # Hypothesis has no early exit that skips its replay: the draws left run empty.
        if any(r.finding is not None for r in results):
            return
        if deadline is not None and time.time() >= deadline:
            return
        run = SwarmRun(config, seed=seed + len(results))
        result = run_swarm(
            run, swarm.instances, swarm.ticks, swarm.device, swarm.profile, swarm.shrink_seconds
        )
        results.append(result)
        if on_config is not None:
            on_config(result)

    with local_constants_pinned():  # the same configs for a seed wherever it runs
        one_config()
    return results


@dataclass(frozen=True)
class SwarmChunkOutcome:
    """What a worker sends back for a chunk: the result of each config it ran."""

    chunk: Chunk
    results: tuple[SwarmResult, ...]
    # A --configs draw that raised or drew a non-config (ConfigStrategyError's message):
    # the user's mistake, sent back as such rather than as a crashed worker.
    config_strategy_error: str | None = None

    @property
    def examples(self) -> int:
        return len(self.results)

    @property
    def steps(self) -> int:
        return sum(r.instance_steps for r in self.results)


@dataclass(frozen=True)
class SwarmWork:
    """A chunk's configs as swarms, in whichever worker runs it."""

    swarm: SwarmSettings
    configs: str | None = None  # module:strategy; None: the suite's own
    deadline: float | None = None  # time.time() after which no config starts

    def __call__(self, chunk: Chunk) -> SwarmChunkOutcome:
        prepare_device(self.swarm.device)
        strategy = load_config_strategy(self.configs) if self.configs is not None else configs()
        done: list[SwarmResult] = []

        def progress(result: SwarmResult) -> None:
            done.append(result)
            report_progress(ChunkProgress(len(done), sum(r.instance_steps for r in done)))

        try:
            results = run_configs(
                strategy, chunk.examples, chunk.seed, self.swarm, progress, self.deadline
            )
        except ConfigStrategyError as err:
            return SwarmChunkOutcome(chunk, tuple(done), config_strategy_error=str(err))
        outcome = SwarmChunkOutcome(chunk, tuple(results))
        report_progress(ChunkProgress(outcome.examples, outcome.steps), final=True)
        return outcome


@dataclass
class SwarmCampaign:
    """Swarm mode over chunks: every config's result in chunk order, and what it found."""

    results: list[SwarmResult] = field(default_factory=list)
    first: SwarmResult | None = None  # the run's finding: the first failure in chunk order
    error: BaseException | None = None  # ... or a lost or crashed worker's, when that came first
    findings: list[Finding] = field(default_factory=list)  # every distinct failure
    chunks: int = 0  # chunks that handed back a result (or were lost)
    lost: int = 0  # chunks whose worker was lost or crashed
    interrupted: KeyboardInterrupt | None = None
    seconds: float = 0.0
    seen: set[tuple[str, str]] = field(default_factory=set, repr=False)

    @property
    def instance_steps(self) -> int:
        return sum(r.instance_steps for r in self.results)


def finding_label(result: SwarmResult) -> str:
    """The device checks a finding broke, as campaigns deduplicate findings by."""
    assert result.finding is not None
    return ", ".join(result.finding.device_checks)


def run_swarm_campaign(
    work: SwarmWork,
    chunks: Iterable[Chunk],
    runner: ChunkRunner,
    *,
    keep_going: bool = False,
    trace_dir: Path | None = None,
    on_config: Callable[[SwarmResult], None] | None = None,
    on_progress: Callable[[CampaignTally], None] | None = None,
) -> SwarmCampaign:
    """The chunks' swarms on the runner, merged in chunk order (on_config told each
    config's result as its chunk is merged). The first failure's trace is the caller's
    to write (under the run's seed, as a run in one process writes it); a campaign's later
    ones are written here under their chunks' seeds. An interrupt stops the workers and
    keeps what finished."""
    campaign = SwarmCampaign()
    started = time.perf_counter()

    def merge(outcome: SwarmChunkOutcome | WorkerLost[Chunk] | WorkerCrashed[Chunk]) -> Merged:
        campaign.chunks += 1
        if isinstance(outcome, WorkerLost | WorkerCrashed):
            campaign.lost += 1
            campaign.error = lost_chunk(campaign.findings, outcome) or campaign.error
            return Merged(not keep_going, len(campaign.findings))
        if outcome.config_strategy_error is not None:
            campaign.error = campaign.error or ConfigStrategyError(outcome.config_strategy_error)
            return Merged(True, len(campaign.findings))
        for result in outcome.results:
            campaign.results.append(result)
            if on_config is not None:
                on_config(result)
        found = next((r for r in outcome.results if r.finding is not None), None)
        if found is not None:
            _keep(campaign, found, outcome.chunk, trace_dir)
        return Merged(found is not None and not keep_going, len(campaign.findings))

    campaign.interrupted = gather_chunks(runner, work, chunks, merge, on_progress)
    campaign.seconds = time.perf_counter() - started
    return campaign


def _keep(
    campaign: SwarmCampaign, found: SwarmResult, chunk: Chunk, trace_dir: Path | None
) -> None:
    """A chunk's finding into the campaign, once per device checks and shrunk trace."""
    assert found.finding is not None
    label = finding_label(found)
    trace = found.finding.shrunk or found.finding.trace
    key = (label, json.dumps(trace.to_json(), sort_keys=True))
    if key in campaign.seen:
        return
    campaign.seen.add(key)
    if not campaign.findings:
        campaign.first = found
        campaign.findings.append(Finding(label, chunk.seed, len(trace.events), None))
    else:
        campaign.findings.append(kept_finding(label, chunk, trace, SWARM_TRACE_STEM, trace_dir))
