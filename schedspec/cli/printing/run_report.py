"""`schedspec run`'s report: one line per engine iteration, and a summary of the whole run.

Built from what the scheduler publishes (SchedulerOutput, ModelRunnerOutput,
request statuses, the block pool's usage) through simulate/timeline.py's
entries, so it shows what the scheduler decided, not how it decided.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schedspec.simulate.timeline import (
    ScheduledEntry,
    computed_before,
    in_flight_outputs,
    scheduled_entries,
)
from schedspec.spec import ModelRunnerOutput, Request, RequestOutput, SchedulerOutput


@dataclass(frozen=True)
class Landing:
    """The step whose output landed in an iteration (async scheduling: the one scheduled
    in the iteration before; synchronously, the iteration's own)."""

    iteration: int  # the iteration that scheduled it
    drafts_accepted: int
    finished: list[str]  # requests its output finished
    stale: list[str]  # preempted since it was scheduled: output delivered, no counter moved
    dropped: list[str]  # finished or aborted since it was scheduled: output dropped


@dataclass(frozen=True)
class StepRecord:
    """One engine iteration: what it scheduled, and what landed in it."""

    iteration: int  # 1-based
    arrived: list[str]  # added to the scheduler just before this step
    entries: list[ScheduledEntry]  # scheduled this iteration, in scheduling order
    total_scheduled: int
    token_budget: int
    kv_usage: float  # after the step: 1 - free / num_blocks
    preempted: list[str]
    landing: Landing | None  # None: nothing landed (the first async step)
    pipelined: bool = False  # async scheduling: say which step landed

    @property
    def finished(self) -> list[str]:
        return self.landing.finished if self.landing is not None else []

    @property
    def prefill_tokens(self) -> int:
        return sum(e.num_scheduled for e in self.entries if e.kind == "prefill")

    @property
    def draft_tokens(self) -> int:
        return sum(e.num_drafts for e in self.entries)

    @property
    def decode_tokens(self) -> int:
        # A spec step is one decode token plus its drafts.
        return self.total_scheduled - self.prefill_tokens - self.draft_tokens


@dataclass(frozen=True)
class Scheduled:
    """What the run knew of a step when it was scheduled."""

    iteration: int
    output: SchedulerOutput
    num_tokens: dict[str, int]  # each scheduled request's delivered tokens then
    num_outputs: dict[str, int]  # and its delivered outputs


def record_step(
    iteration: int,
    arrived: Iterable[str],
    scheduled: Scheduled | None,
    landed: tuple[Scheduled, ModelRunnerOutput, Mapping[str, RequestOutput]] | None,
    token_budget: int,
    kv_usage: float,
    pipelined: bool = False,
) -> StepRecord:
    """Build a StepRecord after the iteration: `scheduled` is this iteration's step (None
    if it scheduled nothing), `landed` the step whose output landed in it, with the
    model's answer and the engine's report. A synchronous iteration lands its own step,
    whose entries then carry their accepted drafts."""
    entries: list[ScheduledEntry] = []
    if scheduled is not None:
        out = scheduled.output
        computed, fresh = computed_before(out)
        own = landed is not None and landed[0] is scheduled
        answer = landed[1] if own and landed is not None else ModelRunnerOutput()
        in_flight = in_flight_outputs(out, scheduled.num_outputs)
        entries = scheduled_entries(out, answer, scheduled.num_tokens, computed, fresh, in_flight)
    return StepRecord(
        iteration=iteration,
        arrived=list(arrived),
        entries=entries,
        total_scheduled=scheduled.output.total_num_scheduled_tokens if scheduled else 0,
        token_budget=token_budget,
        kv_usage=kv_usage,
        preempted=sorted(scheduled.output.preempted_req_ids) if scheduled else [],
        landing=_landing(*landed) if landed is not None else None,
        pipelined=pipelined,
    )


def _landing(
    scheduled: Scheduled, model_output: ModelRunnerOutput, reported: Mapping[str, RequestOutput]
) -> Landing:
    sampled = model_output.sampled_token_ids
    drafts = scheduled.output.scheduled_spec_decode_tokens
    # The model emits 1 + the accepted drafts for a spec step (dropped output aside).
    accepted = sum(len(sampled[rid]) - 1 for rid in reported if rid in drafts)
    return Landing(
        iteration=scheduled.iteration,
        drafts_accepted=accepted,
        finished=[rid for rid, o in reported.items() if o.finish_status is not None],
        # The reference reports no computed count for stale output.
        stale=[rid for rid, o in reported.items() if o.num_computed_tokens is None],
        dropped=[rid for rid in sampled if rid not in reported],
    )


def format_step(record: StepRecord) -> str:
    """`Iter 3: [A prefill 256] [C spec 1+2] | 258/512 tokens, KV 87% | preempted: E`;
    with async scheduling also which step landed, and its stale and dropped output."""
    parts = [" ".join(str(e) for e in record.entries) or "(idle)"]
    parts.append(f"{record.total_scheduled}/{record.token_budget} tokens, KV {record.kv_usage:.0%}")
    landing = record.landing
    if record.pipelined:
        parts.append(f"landed: iter {landing.iteration}" if landing else "landed: -")
    groups = [("arrived", record.arrived), ("preempted", record.preempted)]
    if landing is not None:
        groups += [
            ("finished", landing.finished),
            ("stale", landing.stale),
            ("dropped", landing.dropped),
        ]
    for label, ids in groups:
        if ids:
            parts.append(f"{label}: {', '.join(ids)}")
    return f"Iter {record.iteration}: " + " | ".join(parts)


@dataclass(frozen=True)
class Summary:
    steps: int
    num_requests: int
    tokens_scheduled: int
    prefill_tokens: int
    decode_tokens: int
    draft_tokens: int
    preemptions: int  # preemption events; a request may be preempted more than once
    finished: dict[str, int]  # finish status name -> count
    prefix_cache_queries: int  # tokens looked up at admission
    prefix_cache_hits: int  # of which found in the cache
    prefix_cache_hit_rate: float | None  # None when prefix caching is off
    drafts_accepted: int
    draft_acceptance_rate: float | None  # None when no draft was verified
    final_kv_usage: float


def summarize(
    records: list[StepRecord],
    requests: Mapping[str, Request],
    prefix_cache_queries: int,
    prefix_cache_hits: int,
    caching: bool,
    final_kv_usage: float,
) -> Summary:
    statuses = Counter(r.status.name for r in requests.values())
    drafts = sum(r.draft_tokens for r in records)
    accepted = sum(r.landing.drafts_accepted for r in records if r.landing is not None)
    return Summary(
        steps=len(records),
        num_requests=len(requests),
        tokens_scheduled=sum(r.total_scheduled for r in records),
        prefill_tokens=sum(r.prefill_tokens for r in records),
        decode_tokens=sum(r.decode_tokens for r in records),
        draft_tokens=drafts,
        preemptions=sum(len(r.preempted) for r in records),
        finished=dict(sorted(statuses.items())),
        prefix_cache_queries=prefix_cache_queries,
        prefix_cache_hits=prefix_cache_hits,
        prefix_cache_hit_rate=(
            prefix_cache_hits / prefix_cache_queries if caching and prefix_cache_queries else None
        ),
        drafts_accepted=accepted,
        draft_acceptance_rate=accepted / drafts if drafts else None,
        final_kv_usage=final_kv_usage,
    )


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def format_summary(s: Summary) -> list[str]:
    finished = ", ".join(f"{count} {status.lower()}" for status, count in s.finished.items())
    return [
        f"Steps: {s.steps}",
        f"Tokens scheduled: {s.tokens_scheduled} "
        f"(prefill {s.prefill_tokens}, decode {s.decode_tokens}, draft {s.draft_tokens})",
        f"Preemptions: {s.preemptions}",
        f"Requests: {s.num_requests} ({finished})",
        f"Prefix-cache hit rate: {_rate(s.prefix_cache_hit_rate)} "
        f"({s.prefix_cache_hits}/{s.prefix_cache_queries} tokens)",
        f"Draft acceptance rate: {_rate(s.draft_acceptance_rate)} "
        f"({s.drafts_accepted}/{s.draft_tokens} drafts)",
        f"KV usage at the end: {s.final_kv_usage:.0%}",
    ]
