"""The scheduler configuration, validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.checks import require_int
from schedspec.spec.connector import LOAD_FAILURE_POLICIES, LoadFailurePolicy
from schedspec.spec.errors import ConfigError, shown
from schedspec.spec.kv_groups import (
    FullAttentionGroup,
    KVCacheGroupSpec,
    blocks_for_one_request,
    check_groups,
)

Policy = Literal["fcfs", "priority"]
POLICIES: tuple[Policy, ...] = ("fcfs", "priority")

# Whose scheduling policy an engine follows (docs/SPEC.md, "Two families"). The
# shared fields keep one meaning in both; each family has knobs of its own, which
# must keep their defaults under the other family.
Family = Literal["vllm", "sglang"]
FAMILIES: tuple[Family, ...] = ("vllm", "sglang")

# The shortest context the SGLang family admits a one-token prompt into.
MIN_SGLANG_MAX_MODEL_LEN = 8

# SGLang's initial new_token_ratio is 0.7 * schedule_conservativeness, capped at 1:
# above 1 / 0.7 every value means the same. 100 leaves room for any real setting.
MAX_SCHEDULE_CONSERVATIVENESS = 100.0

# Upper bounds, for memory. An engine holds each KV block as a record of its own (the
# reference: a Python object of about 110 bytes; a million take a second to build),
# and every snapshot lists them all: 4M blocks is about 0.5 GB in the reference, and
# more than any deployment's pool (an 80 GB GPU holds about 110k blocks of 16 tokens
# of a 1B-parameter model's KV). Drafts: each step lists every running request's
# drafts, and under async scheduling as many placeholders.
# A request's tokens are a list: 16M tokens is more than any model's context window.
MAX_NUM_BLOCKS = 2**22
MAX_SPECULATIVE_TOKENS = 256
MAX_MODEL_LEN = 2**24
_WHY_BLOCKS = "each KV block is a record in the engine's pool and in every snapshot"
_WHY_DRAFTS = "every step lists each running request's drafts"
_WHY_LENGTH = "a request's tokens are held as a list; more than any model's context"


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """What a scheduler instance is allowed to do; vLLM's knobs, vLLM's names.

    Under family "sglang" the shared fields are SGLang's server arguments:
    block_size = page_size, num_blocks = max_total_num_tokens / page_size,
    max_num_batched_tokens = chunked_prefill_size (a prefill batch's budget; a
    decode batch has one token per running request), max_num_seqs =
    max_running_requests, max_model_len = the context length,
    enable_prefix_caching = the radix cache, enable_chunked_prefill = chunked
    prefill on. SGLang's max_prefill_tokens (16384 by default) is not a field:
    the spec assumes it is never the tighter bound.

    Every field is checked in __post_init__: a bad value raises ConfigError
    (a ValueError) naming the field and the bound it broke.
    """

    block_size: int  # tokens per KV block
    num_blocks: int  # usable KV blocks (no reserved null block)
    max_num_batched_tokens: int  # the per-step token budget
    max_num_seqs: int  # most requests in the running list at once
    max_model_len: int  # most tokens (prompt + output) a request may hold
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0 = no per-request cap
    # Which release's rule gates that cap (vLLM has no knob for it; see
    # Scheduler._long_prefill_cap). True: only with enable_chunked_prefill on
    # (vLLM 0.34.0). False: with chunked prefill on or off (vLLM 0.33.0).
    long_prefill_needs_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    watermark: float = 0.0  # fraction of num_blocks kept spare at admission
    policy: Policy = "fcfs"
    num_speculative_tokens: int = 0  # most drafts verified per step
    # KV slots allocated past the scheduled tokens for a drafter that writes
    # KV (EAGLE-style). None means num_speculative_tokens; vLLM's n-gram
    # drafter uses 0.
    num_lookahead_tokens: int | None = None
    # vLLM's async scheduling (its default): step N+1 is scheduled before step
    # N's output is applied, so every request may have one step in flight.
    async_scheduling: bool = False
    # vLLM's spec-decode padding: a waiting request with exactly one token to
    # compute is scheduled as 1 + num_speculative_tokens tokens, its drafts
    # placeholders (PLACEHOLDER_TOKEN_ID), so batches keep a uniform shape.
    pad_spec_decode: bool = False
    # vLLM 0.34.0's cache-aware admission: at the start of the waiting phase, the
    # plain waiting requests among the first cache_aware_admission_window of the
    # queue are reordered deepest cached prefix first, when KV usage is at least
    # cache_aware_admission_threshold. 0 = off (every release before 0.34.0). Like
    # vLLM, the window is accepted and ignored under priority or without prefix
    # caching (Scheduler._reorder_waiting_by_cached_prefix).
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5  # a fraction of num_blocks in use
    # A KV connector (docs/SPEC.md, "The KV connector"): requests may load KV from
    # elsewhere (RemoteKV) and keep blocks after finishing while it sends them.
    kv_connector: bool = False
    # What a failed load does: the request finishes with an error ("fail", vLLM's
    # default), or it recomputes from the last good block ("recompute").
    kv_load_failure_policy: LoadFailurePolicy = "fail"
    # vLLM 0.34.0's cap on async loads in flight (loading, or received and not yet
    # running, or aborted while loading); None = no cap, and no async-load queue.
    max_num_inflight_kv_loads: int | None = None
    # Whose policy decides each step; the fields below are SGLang's own knobs.
    family: Family = "vllm"
    # SGLang: scales the new_token_ratio that admission reserves for the running
    # requests' future outputs (lower admits more, and retracts more).
    schedule_conservativeness: float = 1.0
    # SGLang: running requests decode inside a prefill batch instead of waiting
    # for a decode-only batch.
    enable_mixed_chunk: bool = False
    # The KV cache groups of a hybrid model (spec/kv_groups.py; docs/SPEC.md, "Hybrid
    # KV cache groups"). Empty: one full-attention group of block_size, as before
    # groups existed. Otherwise block_size is the groups' scheduler block size.
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = ()

    def __post_init__(self) -> None:
        require_int("block_size", self.block_size, 1)
        require_int("num_blocks", self.num_blocks, 1, MAX_NUM_BLOCKS, _WHY_BLOCKS)
        require_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        require_int("max_num_seqs", self.max_num_seqs, 1)
        # A prompt needs one token and must leave room for one output token.
        require_int("max_model_len", self.max_model_len, 2, MAX_MODEL_LEN, _WHY_LENGTH)
        require_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        require_int("cache_aware_admission_window", self.cache_aware_admission_window, 0)
        require_int(
            "num_speculative_tokens",
            self.num_speculative_tokens,
            0,
            MAX_SPECULATIVE_TOKENS,
            _WHY_DRAFTS,
        )
        for flag in (
            "kv_connector",
            "enable_chunked_prefill",
            "long_prefill_needs_chunked_prefill",
            "enable_prefix_caching",
            "async_scheduling",
            "pad_spec_decode",
            "enable_mixed_chunk",
        ):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(flag, f"must be a bool, got {shown(getattr(self, flag))}")
        if self.policy not in POLICIES:
            raise ConfigError("policy", f"must be one of {POLICIES}, got {shown(self.policy)}")
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, int | float):
            raise ConfigError("watermark", f"must be a float, got {shown(self.watermark)}")
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError("watermark", f"must be in [0, 1), got {self.watermark}")
        threshold = self.cache_aware_admission_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ConfigError(
                "cache_aware_admission_threshold", f"must be a float, got {shown(threshold)}"
            )
        # A KV usage: 0 reorders on every step, 1 only when no block is free.
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(
                "cache_aware_admission_threshold", f"must be in [0, 1], got {threshold}"
            )
        if self.family not in FAMILIES:
            raise ConfigError("family", f"must be one of {FAMILIES}, got {shown(self.family)}")
        conservativeness = self.schedule_conservativeness
        if isinstance(conservativeness, bool) or not isinstance(conservativeness, int | float):
            raise ConfigError(
                "schedule_conservativeness", f"must be a float, got {shown(conservativeness)}"
            )
        if not 0.0 < conservativeness <= MAX_SCHEDULE_CONSERVATIVENESS:
            raise ConfigError(
                "schedule_conservativeness",
                f"must be in (0, {MAX_SCHEDULE_CONSERVATIVENESS:g}], got {conservativeness}",
            )
        if self.num_lookahead_tokens is None:
            object.__setattr__(self, "num_lookahead_tokens", self.num_speculative_tokens)
        else:
            require_int(
                "num_lookahead_tokens",
                self.num_lookahead_tokens,
                0,
                MAX_SPECULATIVE_TOKENS,
                _WHY_DRAFTS,
            )
        check_groups(self.kv_cache_groups, self.block_size, self.enable_prefix_caching)
        self._check_connector_knobs()
        self._check_hybrid_knobs()
        self._check_cross_field_bounds()
        self._check_family_knobs()

    def _check_connector_knobs(self) -> None:
        if self.kv_load_failure_policy not in LOAD_FAILURE_POLICIES:
            raise ConfigError(
                "kv_load_failure_policy",
                f"must be one of {LOAD_FAILURE_POLICIES}, got {shown(self.kv_load_failure_policy)}",
            )
        if self.max_num_inflight_kv_loads is not None:
            require_int("max_num_inflight_kv_loads", self.max_num_inflight_kv_loads, 1)
        if self.kv_connector:
            if self.async_scheduling:
                # With two batches in flight vLLM defers a connector consumer's block
                # frees past the step still in flight (Scheduler.defer_block_free) and
                # drops preempted requests' stale output: the spec models neither yet.
                raise ConfigError(
                    "async_scheduling",
                    "is not modelled with kv_connector=True (vLLM defers block frees "
                    "past the batch in flight): use a synchronous config",
                )
            return
        # Without a connector these knobs would be silently ignored: refused.
        for name, default in (
            ("kv_load_failure_policy", "fail"),
            ("max_num_inflight_kv_loads", None),
        ):
            if getattr(self, name) != default:
                raise ConfigError(
                    name,
                    f"needs kv_connector=True (without a connector it means nothing): must "
                    f"keep its default {default!r}, got {shown(getattr(self, name))}",
                )

    def _check_hybrid_knobs(self) -> None:
        # Refused until modelled, rather than run as if the cache had one group.
        if not self.kv_cache_groups:
            return
        for name, default in (("family", "vllm"), ("kv_connector", False)):
            if getattr(self, name) != default:
                raise ConfigError(
                    name,
                    f"must keep {default!r} with kv_cache_groups (hybrid caches are modelled "
                    f"for vLLM without a connector only), got {shown(getattr(self, name))}",
                )

    def _check_family_knobs(self) -> None:
        # A knob of the other family would be silently ignored by the engine: refused.
        others = _SGLANG_ONLY if self.family == "vllm" else _VLLM_ONLY
        for name, default in others:
            if getattr(self, name) != default:
                raise ConfigError(
                    name,
                    f"is not a knob of family {self.family!r}: must keep its default "
                    f"{default!r}, got {shown(getattr(self, name))}",
                )
        if self.family != "sglang":
            return
        # SGLang refuses prompts of max_model_len - 6 tokens or more (request.py,
        # max_prompt_tokens): below this context length it admits nothing.
        if self.max_model_len < MIN_SGLANG_MAX_MODEL_LEN:
            raise ConfigError(
                "max_model_len",
                f"must be >= {MIN_SGLANG_MAX_MODEL_LEN} in family 'sglang' (SGLang refuses "
                f"prompts of max_model_len - 6 tokens or more), got {self.max_model_len}",
            )
        # SGLang cuts a chunk to whole pages: a chunk budget under one page admits nothing.
        if self.enable_chunked_prefill and self.max_num_batched_tokens < self.block_size:
            raise ConfigError(
                "max_num_batched_tokens",
                f"must be >= block_size ({self.block_size}) with chunked prefill in family "
                f"'sglang' (SGLang cuts chunks to whole pages: a smaller chunk admits nothing, "
                f"and nothing ever runs), got {self.max_num_batched_tokens}",
            )
        # SGLang mixes decodes into a prefill only when it chunks prefills.
        if self.enable_mixed_chunk and not self.enable_chunked_prefill:
            raise ConfigError(
                "enable_mixed_chunk", "needs enable_chunked_prefill (SGLang ignores it without)"
            )

    def _check_cross_field_bounds(self) -> None:
        # vLLM refuses these at start-up; each one, if allowed, lets a
        # request wait forever or be refused only after it was admitted.
        capacity = self.num_blocks * self.block_size
        if capacity < self.max_model_len:
            raise ConfigError(
                "num_blocks",
                f"num_blocks * block_size ({capacity}) must be >= max_model_len "
                f"({self.max_model_len}) so that any admissible request fits an empty cache",
            )
        if self.kv_cache_groups:
            held = blocks_for_one_request(
                self.kv_cache_groups, self.max_model_len, self.async_scheduling
            )
            if self.num_blocks < held:
                raise ConfigError(
                    "num_blocks",
                    f"must be >= {held}, the blocks a max_model_len request holds over all "
                    f"kv_cache_groups, so that any admissible request fits an empty cache, "
                    f"got {self.num_blocks}",
                )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                "max_num_batched_tokens",
                f"must be >= max_model_len ({self.max_model_len}) when chunked prefill "
                f"is off, got {self.max_num_batched_tokens}",
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                "max_num_batched_tokens",
                f"must be >= max_num_seqs ({self.max_num_seqs}), got {self.max_num_batched_tokens}",
            )
        if self.pad_spec_decode and self.num_speculative_tokens == 0:
            raise ConfigError(
                "pad_spec_decode",
                "pads admissions with placeholder drafts, so it needs "
                "num_speculative_tokens >= 1, got 0",
            )
        padded = 1 + self.num_speculative_tokens
        if self.pad_spec_decode and self.max_num_batched_tokens < padded:
            # A one-token admission after a prefix hit is padded or not admitted at
            # all: below 1 + K it would wait for budget forever.
            raise ConfigError(
                "max_num_batched_tokens",
                f"must be >= 1 + num_speculative_tokens ({padded}) with pad_spec_decode, "
                f"got {self.max_num_batched_tokens}",
            )
        needed = smallest_pool(self)
        if self.num_blocks < needed:
            # vLLM admits an async KV load only if it fits beside one verify step's
            # blocks (Scheduler._spec_decode_step_blocks): below this, the load of a
            # prompt of max_model_len - 1 tokens never starts, and waits forever.
            raise ConfigError(
                "num_blocks",
                f"must be >= {needed} with a KV connector and drafts: an async load of a "
                f"max_model_len - 1 token prompt must fit beside one verify step's blocks, "
                f"got {self.num_blocks}",
            )
        if self.long_prefill_token_threshold > self.max_model_len:
            raise ConfigError(
                "long_prefill_token_threshold",
                f"must be <= max_model_len ({self.max_model_len}), "
                f"got {self.long_prefill_token_threshold}",
            )

    def own_fields(self) -> dict[str, object]:
        """The fields that mean something in this config's family, for people to read:
        the other family's knobs (at their defaults) left out, and the family named
        only when it is not vLLM's (every config before families existed was)."""
        others = {name for name, _ in (_SGLANG_ONLY if self.family == "vllm" else _VLLM_ONLY)}
        if self.family == "vllm":
            others.add("family")
        if not self.kv_cache_groups:
            others.add("kv_cache_groups")  # the default single group, as before groups
        if not self.kv_connector:
            # Without a connector its knobs keep their defaults and mean nothing.
            others |= {"kv_connector", "kv_load_failure_policy", "max_num_inflight_kv_loads"}
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in others
        }

    @property
    def lookahead_tokens(self) -> int:
        """num_lookahead_tokens resolved to an int (None means num_speculative_tokens)."""
        assert self.num_lookahead_tokens is not None  # set in __post_init__
        return self.num_lookahead_tokens

    @property
    def watermark_blocks(self) -> int:
        """Spare blocks an admission must leave while something runs."""
        return int(self.watermark * self.num_blocks)


def smallest_pool(config: SchedulerConfig, kv_connector: bool | None = None) -> int:
    """The fewest blocks that run every request the door admits: one max_model_len
    request's; with a KV connector (the config's, or `kv_connector` if given) and drafts,
    an async load of max_model_len - 1 tokens beside one verify step's blocks, which
    vLLM reserves against it."""
    size = config.block_size
    whole = blocks_for_one_request(
        config.kv_cache_groups or (FullAttentionGroup(block_size=size),),
        config.max_model_len,
        config.async_scheduling,
    )
    connector = config.kv_connector if kv_connector is None else kv_connector
    if not (connector and config.num_speculative_tokens):
        return whole
    step = 1 + config.num_speculative_tokens + config.lookahead_tokens
    return max(whole, cdiv(config.max_model_len - 1, size) + cdiv(step, size))


def require_family(config: SchedulerConfig, engine: str, families: tuple[Family, ...]) -> None:
    """Refuse, naming the field, a config of a policy family the engine does not follow:
    built anyway, it would make the other family's decisions under this one's name."""
    if config.family not in families:
        followed = " or ".join(map(repr, families))
        raise ConfigError(
            "family", f"{engine} follows family {followed}, not {shown(config.family)}"
        )


def require_single_kv_group(config: SchedulerConfig, engine: str, why: str) -> None:
    """Refuse, naming the field, a config with kv_cache_groups (a hybrid cache) in an
    engine that keeps one full-attention group: built anyway, it would run every layer
    as full attention, keeping blocks a window frees and giving Mamba layers a block per
    token, and its decisions would be another cache's under this config's name. `why`
    says what the engine lacks."""
    if config.kv_cache_groups:
        kinds = ", ".join(group.kind for group in config.kv_cache_groups)
        raise ConfigError(
            "kv_cache_groups",
            f"{engine} runs one full-attention KV cache group only ({why}): run it with "
            f"kv_cache_groups=(), got {len(config.kv_cache_groups)} groups ({kinds})",
        )


# Each family's own knobs and their defaults, which the other family must keep.
# num_lookahead_tokens is compared resolved (None means num_speculative_tokens).
_VLLM_ONLY: tuple[tuple[str, object], ...] = (
    ("watermark", 0.0),
    ("long_prefill_token_threshold", 0),
    ("long_prefill_needs_chunked_prefill", True),
    ("policy", "fcfs"),
    ("num_speculative_tokens", 0),
    ("num_lookahead_tokens", 0),
    ("pad_spec_decode", False),
    ("cache_aware_admission_window", 0),
    ("cache_aware_admission_threshold", 0.5),
    ("kv_connector", False),
    ("kv_load_failure_policy", "fail"),
    ("max_num_inflight_kv_loads", None),
)
_SGLANG_ONLY: tuple[tuple[str, object], ...] = (
    ("schedule_conservativeness", 1.0),
    ("enable_mixed_chunk", False),
)
