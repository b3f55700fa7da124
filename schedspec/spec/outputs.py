"""What one scheduling step says (SchedulerOutput) and what the model answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from schedspec.spec.request import RequestStatus


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
