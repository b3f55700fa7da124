"""What one scheduling step says (SchedulerOutput) and what the model answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from schedspec.spec.connector import KVConnectorOutput
from schedspec.spec.errors import OutputError
from schedspec.spec.request import RequestStatus, check_token_ids


# The per-request records are NamedTuples: immutable like the rest, and
# cheap to build, since a step builds one per scheduled request.
class NewRequestData(NamedTuple):
    """A request scheduled for the first time: the runner learns it whole."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]  # the full block table, prefix-cache hits included
    num_computed_tokens: int  # before this step: the prefix-cache hit


class CachedRequestData(NamedTuple):
    """A request the runner already knows: a running one, or a resumed one."""

    request_id: str
    resumed: bool  # True: new_block_ids replace the table (it was freed at preemption)
    new_block_ids: tuple[int, ...]  # appended to the table unless resumed
    num_computed_tokens: int  # before this step
    num_output_tokens: int


@dataclass(frozen=True)
class SchedulerOutput:
    """The decisions of one schedule() call.

    num_scheduled_tokens is in scheduling order: running requests first, in
    running order, then admitted ones in queue order.
    """

    scheduled_new_reqs: tuple[NewRequestData, ...]
    scheduled_cached_reqs: tuple[CachedRequestData, ...]
    num_scheduled_tokens: Mapping[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: Mapping[str, tuple[int, ...]]
    preempted_req_ids: frozenset[str]
    finished_req_ids: frozenset[str]  # finished since the previous schedule()


class RequestOutput(NamedTuple):
    """What update_from_output tells the front end about one request, like vLLM's
    EngineCoreOutput: the tokens it kept this step and, once done, why it finished.

    The only place a finished request's last tokens are visible: the state
    forgets it as soon as it finishes.
    """

    request_id: str
    new_token_ids: tuple[int, ...]  # kept: tokens past a stop are dropped
    finish_status: RequestStatus | None  # a FINISHED_* status, or None while live
    # After this output: all kept tokens but the last have KV (None: not reported).
    num_computed_tokens: int | None = None


@dataclass(frozen=True)
class ModelRunnerOutput:
    """The tokens the model emitted for each scheduled request.

    A request whose step ended inside its known tokens (a prefill chunk)
    emits nothing and may be left out; any other gets 1 + accepted drafts.
    """

    sampled_token_ids: Mapping[str, Sequence[int]] = field(default_factory=dict)
    # The KV connector's worker side: loads and sends that completed, failures.
    kv_connector_output: KVConnectorOutput | None = None


# A live request that sampled this step: (request_id, token_ids, num_drafts), its tokens
# and how many drafts it verified. A plain tuple: one is built per sampling request per
# step, and a NamedTuple's constructor (a Python function) costs several times the tuple.
SamplingRequest = tuple[str, Sequence[int], int]


def sampling_requests(
    scheduler_output: SchedulerOutput,
    sampled_token_ids: Mapping[str, Sequence[int]],
    num_known_tokens: Mapping[str, int],
) -> list[SamplingRequest]:
    """The requests whose step ends with a sampled token, in scheduling order,
    after checking that the model's answer fits the step; every engine's
    update_from_output starts here, so a bad output is refused before any
    state changes.

    num_known_tokens holds each live request's prompt + output length, by id; a
    request the step ran that was aborted or finished meanwhile is absent (it is
    skipped). A step that ends inside the known tokens (a prefill chunk) must emit
    nothing; any other emits 1 + the drafts it accepted.
    """
    scheduled = scheduler_output.num_scheduled_tokens
    spec_tokens = scheduler_output.scheduled_spec_decode_tokens
    # The set test runs in C; only a bad output pays for finding the culprit.
    if not sampled_token_ids.keys() <= scheduled.keys():
        rid = next(r for r in sampled_token_ids if r not in scheduled)
        raise OutputError("sampled_token_ids", f"request {rid!r} was not scheduled")
    computed_before = {
        d.request_id: d.num_computed_tokens for d in scheduler_output.scheduled_new_reqs
    }
    for cached in scheduler_output.scheduled_cached_reqs:
        computed_before[cached.request_id] = cached.num_computed_tokens
    # One pass over the step, in scheduling order: every request's tokens are checked
    # (a finished or aborted one's too) before any state changes, so the first bad
    # request in that order is the one named.
    no_tokens: Sequence[int] = ()
    sampling: list[SamplingRequest] = []
    for rid, num_tokens in scheduled.items():
        tokens = sampled_token_ids.get(rid, no_tokens)
        check_token_ids("sampled_token_ids", tokens, OutputError)
        known = num_known_tokens.get(rid)
        if known is None:
            continue
        drafts = len(spec_tokens[rid]) if rid in spec_tokens else 0
        if computed_before[rid] + num_tokens - drafts < known:
            if tokens:
                raise OutputError(
                    "sampled_token_ids",
                    f"request {rid!r} ran a prefill chunk and must emit no token, "
                    f"got {len(tokens)}",
                )
        elif not 1 <= len(tokens) <= 1 + drafts:
            raise OutputError(
                "sampled_token_ids",
                f"request {rid!r} must emit between 1 and {1 + drafts} tokens "
                f"(1 + scheduled drafts), got {len(tokens)}",
            )
        else:
            sampling.append((rid, tokens, drafts))
    return sampling
