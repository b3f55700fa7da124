"""`schedspec run`'s report: one line per engine iteration, and a summary of the whole run.

Built from what the scheduler publishes (SchedulerOutput, ModelRunnerOutput,
request statuses, the block pool's usage) through simulate/timeline.py's
entries, so it shows what the scheduler decided, not how it decided.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schedspec.simulate.timeline import ScheduledEntry, computed_before, scheduled_entries
from schedspec.spec import ModelRunnerOutput, Request, SchedulerOutput


@dataclass(frozen=True)
class StepRecord:
    """One engine iteration: schedule -> model -> update_from_output -> drafts."""

    iteration: int  # 1-based
    arrived: list[str]  # added to the scheduler just before this step
    entries: list[ScheduledEntry]  # in scheduling order
    total_scheduled: int
    token_budget: int
    kv_usage: float  # after the step: 1 - free / num_blocks
    preempted: list[str]
    finished: list[str]  # finished by this step's output

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


def record_step(
    iteration: int,
    arrived: Iterable[str],
    scheduler_output: SchedulerOutput,
    model_output: ModelRunnerOutput,
    num_tokens_at_schedule: Mapping[str, int],
    requests: Mapping[str, Request],
    token_budget: int,
    kv_usage: float,
) -> StepRecord:
    """Build a StepRecord; call after the step's update_from_output."""
    out = scheduler_output
    computed, fresh = computed_before(out)
    return StepRecord(
        iteration=iteration,
        arrived=list(arrived),
        entries=scheduled_entries(out, model_output, num_tokens_at_schedule, computed, fresh),
        total_scheduled=out.total_num_scheduled_tokens,
        token_budget=token_budget,
        kv_usage=kv_usage,
        preempted=sorted(out.preempted_req_ids),
        finished=[rid for rid in out.num_scheduled_tokens if requests[rid].is_finished],
    )


def format_step(record: StepRecord) -> str:
    """`Iter 3: [A prefill 256] [C spec 1+2] | 258/512 tokens, KV 87% | preempted: E`."""
    parts = [" ".join(str(e) for e in record.entries) or "(idle)"]
    parts.append(f"{record.total_scheduled}/{record.token_budget} tokens, KV {record.kv_usage:.0%}")
    for label, ids in (
        ("arrived", record.arrived),
        ("preempted", record.preempted),
        ("finished", record.finished),
    ):
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
    accepted = sum(e.num_accepted for r in records for e in r.entries)
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
