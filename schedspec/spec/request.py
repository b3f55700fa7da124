"""A request and its status lifecycle.

WAITING --admit--> RUNNING --preempt--> PREEMPTED --admit--> RUNNING ...
WAITING or PREEMPTED --start an async KV load--> WAITING_FOR_REMOTE_KVS
    --load reported, promoted--> WAITING or PREEMPTED (holding the loaded blocks)
any unfinished status --stop / length cap / abort / failed load--> FINISHED_*
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.connector import RemoteKV
from schedspec.spec.errors import RequestError, SpecInputError, shown

# A draft whose token the scheduler does not know: the model runner proposes it
# itself (async scheduling) or it pads a batch (spec-decode padding). It is
# charged budget and KV like any draft and verified like one.
PLACEHOLDER_TOKEN_ID = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    # Parked while a KV connector loads its KV (docs/SPEC.md, "The KV connector"): it
    # holds blocks and computed tokens, and is in neither running nor any step.
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    FINISHED_STOPPED = "finished_stopped"  # EOS or a stop token
    FINISHED_LENGTH_CAPPED = "finished_length_capped"  # max_tokens or max_model_len
    FINISHED_ABORTED = "finished_aborted"  # finish_requests()
    FINISHED_ERROR = "finished_error"  # its KV load failed under the "fail" policy

    # Every FINISHED_* status. A member's own attribute, set once when the class is
    # made: read per request per step, where a property's call cost more than the test.
    is_finished: bool

    def __init__(self, value: str) -> None:
        self.is_finished = value.startswith("finished_")


class Request:
    """One generation request, mutated by the scheduler that owns it.

    The token history is prompt followed by outputs. num_computed_tokens
    counts the leading tokens (plus any scheduled drafts) whose KV is
    computed or scheduled; like vLLM it is advanced at schedule time and
    corrected when the model's output arrives.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_id: int | None = None,
        stop_token_ids: Iterable[int] = (),
        priority: int = 0,
        remote_kv: RemoteKV | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids: tuple[int, ...] = tuple(prompt_token_ids)
        self.max_tokens = max_tokens
        self.eos_token_id = eos_token_id
        self.stop_token_ids: tuple[int, ...] = tuple(stop_token_ids)
        self.priority = priority
        # What a KV connector holds for it elsewhere (vLLM's kv_transfer_params).
        self.remote_kv = remote_kv
        # Set by the scheduler at add_request: position in arrival order.
        self.arrival: int = -1
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.spec_token_ids: list[int] = []  # drafts to verify next step
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        # After schedule(): true when this step stops short of the known
        # tokens, so the model emits nothing for this request.
        self.is_prefill_chunk = False
        self.stop_reason: int | None = None  # the stop token that ended it
        # The pipeline (async scheduling; all 0 in a synchronous engine between
        # steps). Tokens scheduled whose output is not applied yet:
        self.num_in_flight_tokens = 0
        # Output positions of in-flight sampling steps (1 + drafts each), which
        # the next step counts as if known:
        self.num_output_placeholders = 0
        # The in-flight tokens that belong to steps before a preemption: their
        # output is still delivered (it is right), but must not move the reset
        # counters.
        self.num_stale_output_tokens = 0
        # Stale output is dropped instead of delivered (SGLang drops a retracted
        # request's output in flight; vLLM's modelled paths never drop it).
        self.drop_stale_output = False
        # finish_requests marked it, and it finishes FINISHED_ABORTED when the next
        # step that runs it lands (SGLang's deferred abort of a running request).
        self.abort_pending = False
        # A hybrid config's shared-prefix junction (vLLM's shared_prefix_boundary): the
        # longest hit one KV cache group alone had at the request's last prefix-cache
        # lookup, where the reconciled hit was shorter; else 0. Set at each lookup,
        # kept while it runs and through a preemption (the lookup that resumes it
        # replaces it); an aligned Mamba group's split stops a chunk there.
        self.shared_prefix_boundary = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def num_confirmed_computed_tokens(self) -> int:
        """Computed tokens whose step's output has been applied (no longer in flight)."""
        return self.num_computed_tokens - self.num_in_flight_tokens

    def append_output_token_id(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"drafts={len(self.spec_token_ids)})"
        )


# Token ids are hashed as signed 64-bit ints (see block_hash.py).
MAX_TOKEN_ID = 2**63


def check_token_ids(
    field: str, token_ids: Sequence[object], error: type[SpecInputError] = RequestError
) -> None:
    """Raise `error` unless every token id is an int in [0, 2**63). A sequence: the
    ids are read twice when one is bad."""
    # The common case first, in one cheap pass (this runs per request per step): plain
    # ints in range. Anything else (an int subclass, a bad value) takes the full test.
    for token in token_ids:
        if type(token) is not int or not 0 <= token < MAX_TOKEN_ID:
            break
    else:
        return
    for i, token in enumerate(token_ids):
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < MAX_TOKEN_ID:
            raise error(
                field, f"token ids must be ints in [0, 2**63), got {shown(token)} at index {i}"
            )


def _progress_field(request: Request) -> str | None:
    """The first field that says a scheduler already had this request (None: none)."""
    fresh_values: tuple[tuple[str, object], ...] = (
        ("arrival", -1),
        ("num_computed_tokens", 0),
        ("spec_token_ids", []),
        ("num_preemptions", 0),
        ("num_in_flight_tokens", 0),
        ("num_output_placeholders", 0),
        ("num_stale_output_tokens", 0),
        ("is_prefill_chunk", False),
        ("stop_reason", None),
        ("drop_stale_output", False),
        ("abort_pending", False),
        ("shared_prefix_boundary", 0),
        ("all_token_ids", list(request.prompt_token_ids)),
    )
    return next((name for name, fresh in fresh_values if getattr(request, name) != fresh), None)


# SGLang's door (Scheduler.init_req_max_new_tokens, validate_input_length): its
# longest request is min(context_len, max_total_num_tokens) - 1 tokens, and it
# aborts a prompt of that less SGLANG_PROMPT_MARGIN tokens or more.
SGLANG_PROMPT_MARGIN = 5


def max_prompt_tokens(config: SchedulerConfig) -> int:
    """The longest prompt the family's door admits. vLLM: below max_model_len.
    SGLang: below max_req_len - 5, max_req_len = min(context length, pool tokens) - 1,
    and the config guarantees that the pool holds max_model_len tokens."""
    if config.family == "sglang":
        return config.max_model_len - 1 - SGLANG_PROMPT_MARGIN - 1
    return config.max_model_len - 1


def sglang_max_new_tokens(config: SchedulerConfig, num_prompt_tokens: int, asked: int) -> int:
    """SGLang's max_new_tokens for an admitted prompt: the asked count clipped so the
    request fits the context (max_req_len - prompt - 1) and an empty pool (pool
    tokens - the prompt's pages - one page - 1). It may be 0; SGLang then still
    samples one token, which finishes the request."""
    page = config.block_size
    max_req_len = config.max_model_len - 1
    pool_tokens = config.num_blocks * page
    paged_prompt = cdiv(num_prompt_tokens, page) * page
    return max(
        0, min(asked, max_req_len - num_prompt_tokens - 1, pool_tokens - paged_prompt - page - 1)
    )


def admitted_max_tokens(config: SchedulerConfig, request: Request) -> int:
    """The max_tokens an accepted request runs with: what it asked for (vLLM), or
    SGLang's clipped max_new_tokens, at least 1 (one token is always sampled)."""
    if config.family == "sglang":
        return max(1, sglang_max_new_tokens(config, request.num_prompt_tokens, request.max_tokens))
    return request.max_tokens


def validate_new_request(request: Request, config: SchedulerConfig) -> None:
    """Refuse at the door every request that could not run to completion.

    Called by add_request of every implementation, so that all engines
    refuse the same inputs. Together with the config's capacity check this
    guarantees that an admitted request fits an empty KV cache.
    """
    rid = request.request_id
    if not isinstance(rid, str) or not rid:
        raise RequestError("request_id", f"must be a non-empty str, got {shown(rid)}")
    where = f"request {shown(rid)}"
    if request.status is not RequestStatus.WAITING or request.output_token_ids:
        raise RequestError("status", f"{where}: only a fresh WAITING request can be added")
    used = _progress_field(request)
    if used is not None:
        raise RequestError(
            used,
            f"{where}: a new request must not have {used} set (got "
            f"{shown(getattr(request, used))}); was it added to a scheduler before?",
        )
    if request.num_prompt_tokens == 0:
        raise RequestError("prompt_token_ids", f"{where}: the prompt must not be empty")
    longest = max_prompt_tokens(config)
    if request.num_prompt_tokens > longest:
        bound = (
            f"be at most {longest} tokens (SGLang refuses prompts of max_model_len - 6 "
            "tokens or more)"
            if config.family == "sglang"
            else f"be shorter than max_model_len ({config.max_model_len})"
        )
        raise RequestError(
            "prompt_token_ids",
            f"{where}: prompt of {request.num_prompt_tokens} tokens must {bound}",
        )
    check_token_ids("prompt_token_ids", request.prompt_token_ids)
    if isinstance(request.max_tokens, bool) or not isinstance(request.max_tokens, int):
        raise RequestError(
            "max_tokens", f"{where}: must be an int, got {shown(request.max_tokens)}"
        )
    if request.max_tokens < 1:
        raise RequestError("max_tokens", f"{where}: must be >= 1, got {request.max_tokens}")
    if request.eos_token_id is not None:
        check_token_ids("eos_token_id", [request.eos_token_id])
    check_token_ids("stop_token_ids", request.stop_token_ids)
    if isinstance(request.priority, bool) or not isinstance(request.priority, int):
        raise RequestError("priority", f"{where}: must be an int, got {shown(request.priority)}")
    remote = request.remote_kv
    if remote is not None:
        if not isinstance(remote, RemoteKV):
            raise RequestError("remote_kv", f"{where}: must be a RemoteKV, got {shown(remote)}")
        if not config.kv_connector:
            raise RequestError(
                "remote_kv", f"{where}: needs a config with kv_connector=True (no connector to ask)"
            )
        remote.validate(where, request.num_prompt_tokens)
