"""The counts model's vocabulary: a symbolic config, one request slot, the harness's choices.

The model abstracts block ids away: the KV cache is a free-block count and
each slot holds a number of blocks. Every quantity is a Z3 term, so one
definition serves proofs (symbolic terms), counterexamples (a model's
values) and the drift test (concrete values substituted in).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import z3

from schedspec.spec.config import SchedulerConfig

# z3's Python API is untyped; these aliases say which kind of term a name holds.
IntTerm = Any  # z3.ArithRef over Int
BoolTerm = Any  # z3.BoolRef


def cdiv(a: IntTerm, b: IntTerm) -> IntTerm:
    """Ceiling division of non-negative a by positive b (the reference's cdiv)."""
    return (a + b - 1) / b


def zmin(a: IntTerm, b: IntTerm) -> IntTerm:
    return z3.If(a <= b, a, b)


def zmax(a: IntTerm, b: IntTerm) -> IntTerm:
    return z3.If(a >= b, a, b)


@dataclass(frozen=True)
class ConfigTerms:
    """SchedulerConfig as terms; policy is fcfs (the model's scope, see docs/FORMAL.md)."""

    block_size: IntTerm
    num_blocks: IntTerm
    budget: IntTerm  # max_num_batched_tokens
    max_num_seqs: IntTerm
    max_model_len: IntTerm
    chunked: BoolTerm  # enable_chunked_prefill
    threshold: IntTerm  # long_prefill_token_threshold, 0 = none
    # long_prefill_needs_chunked_prefill: the cap applies only with chunking on (0.34.0)
    cap_needs_chunked: BoolTerm
    prefix_caching: BoolTerm  # enable_prefix_caching
    watermark_blocks: IntTerm  # int(watermark * num_blocks)
    lookahead: IntTerm  # lookahead_tokens
    num_spec: IntTerm  # num_speculative_tokens
    async_scheduling: BoolTerm  # a step is scheduled while the previous one is in flight
    pad_spec_decode: BoolTerm  # one-token admissions padded to 1 + num_spec

    def constraints(self) -> list[BoolTerm]:
        """What SchedulerConfig.__post_init__ accepts, as constraints."""
        return [
            self.block_size >= 1,
            self.num_blocks >= 1,
            self.budget >= 1,
            self.max_num_seqs >= 1,
            self.max_model_len >= 2,
            self.threshold >= 0,
            self.num_spec >= 0,
            self.lookahead >= 0,
            # int(w * num_blocks) for 0 <= w < 1.
            self.watermark_blocks >= 0,
            self.watermark_blocks < self.num_blocks,
            self.num_blocks * self.block_size >= self.max_model_len,
            z3.Or(self.chunked, self.budget >= self.max_model_len),
            self.budget >= self.max_num_seqs,
            self.threshold <= self.max_model_len,
            z3.Implies(self.pad_spec_decode, self.num_spec >= 1),
        ]

    def terms(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]


def symbolic_config(prefix: str = "") -> ConfigTerms:
    ints = {
        name: z3.Int(prefix + name)
        for name in (
            "block_size",
            "num_blocks",
            "budget",
            "max_num_seqs",
            "max_model_len",
            "threshold",
            "watermark_blocks",
            "lookahead",
            "num_spec",
        )
    }
    return ConfigTerms(
        chunked=z3.Bool(prefix + "chunked"),
        cap_needs_chunked=z3.Bool(prefix + "cap_needs_chunked"),
        prefix_caching=z3.Bool(prefix + "prefix_caching"),
        async_scheduling=z3.Bool(prefix + "async_scheduling"),
        pad_spec_decode=z3.Bool(prefix + "pad_spec_decode"),
        **ints,
    )


def concrete_config(config: SchedulerConfig) -> ConfigTerms:
    """A SchedulerConfig as constant terms (policy must be fcfs: the model's scope)."""
    if config.policy != "fcfs":
        raise ValueError(f"policy: the counts model covers fcfs only, got {config.policy!r}")
    return ConfigTerms(
        block_size=z3.IntVal(config.block_size),
        num_blocks=z3.IntVal(config.num_blocks),
        budget=z3.IntVal(config.max_num_batched_tokens),
        max_num_seqs=z3.IntVal(config.max_num_seqs),
        max_model_len=z3.IntVal(config.max_model_len),
        chunked=z3.BoolVal(config.enable_chunked_prefill),
        threshold=z3.IntVal(config.long_prefill_token_threshold),
        cap_needs_chunked=z3.BoolVal(config.long_prefill_needs_chunked_prefill),
        prefix_caching=z3.BoolVal(config.enable_prefix_caching),
        watermark_blocks=z3.IntVal(config.watermark_blocks),
        lookahead=z3.IntVal(config.lookahead_tokens),
        num_spec=z3.IntVal(config.num_speculative_tokens),
        async_scheduling=z3.BoolVal(config.async_scheduling),
        pad_spec_decode=z3.BoolVal(config.pad_spec_decode),
    )


@dataclass(frozen=True)
class Slot:
    """One request as the counts model sees it; live=False is an empty slot.

    Slot order is list order: running slots in running order, then waiting
    slots in queue order (fcfs keeps it so: victims are a suffix of the
    running list and go to the front of the queue; admissions are a prefix
    of the queue and go to the back of the running list). A waiting slot is
    PREEMPTED when it has been preempted before, else WAITING.
    """

    live: BoolTerm  # an unfinished request
    running: BoolTerm  # in the running list (else waiting or preempted)
    computed: IntTerm  # num_computed_tokens
    tokens: IntTerm  # num_tokens (prompt + output)
    drafts: IntTerm  # len(spec_token_ids) (placeholders included)
    blocks: IntTerm  # len(block table)
    preemptions: IntTerm  # num_preemptions
    # The pipeline (async scheduling; all 0 between synchronous steps).
    in_flight: IntTerm  # num_in_flight_tokens
    placeholders: IntTerm  # num_output_placeholders
    stale: IntTerm  # num_stale_output_tokens
    chunk: BoolTerm  # is_prefill_chunk: the last step scheduled for it samples nothing
    token_limit: IntTerm  # num_prompt_tokens + max_tokens: max_tokens stops it there

    def replace(self, **changes: Any) -> Slot:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Slot(**values)

    def select(self, condition: BoolTerm, other: Slot) -> Slot:
        """This slot where condition holds, else other (field by field)."""
        return Slot(
            **{
                f.name: z3.If(condition, getattr(self, f.name), getattr(other, f.name))
                for f in fields(self)
            }
        )

    def terms(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]


def symbolic_slot(name: str) -> Slot:
    return Slot(
        live=z3.Bool(f"{name}.live"),
        running=z3.Bool(f"{name}.running"),
        computed=z3.Int(f"{name}.computed"),
        tokens=z3.Int(f"{name}.tokens"),
        drafts=z3.Int(f"{name}.drafts"),
        blocks=z3.Int(f"{name}.blocks"),
        preemptions=z3.Int(f"{name}.preemptions"),
        in_flight=z3.Int(f"{name}.in_flight"),
        placeholders=z3.Int(f"{name}.placeholders"),
        stale=z3.Int(f"{name}.stale"),
        chunk=z3.Bool(f"{name}.chunk"),
        token_limit=z3.Int(f"{name}.token_limit"),
    )


@dataclass(frozen=True)
class Choices:
    """What the harness (the model and the prefix cache) decides for one slot in a step."""

    hit: IntTerm  # prefix-cache hit in tokens at admission
    accepted: IntTerm  # drafts the model accepts
    kept: IntTerm  # sampled tokens kept by the stop checker
    stop: BoolTerm  # the model emits EOS or a stop token
    new_drafts: IntTerm  # drafts proposed after the step (synchronous engines only)

    def terms(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]


def symbolic_choices(name: str) -> Choices:
    return Choices(
        hit=z3.Int(f"{name}.hit"),
        accepted=z3.Int(f"{name}.accepted"),
        kept=z3.Int(f"{name}.kept"),
        stop=z3.Bool(f"{name}.stop"),
        new_drafts=z3.Int(f"{name}.new_drafts"),
    )


@dataclass(frozen=True)
class ModelState:
    """The counts model's state: N slots and the free-block count."""

    slots: tuple[Slot, ...]
    free: IntTerm

    def terms(self) -> list[Any]:
        return [self.free, *(t for s in self.slots for t in s.terms())]


def symbolic_state(n: int, prefix: str = "s") -> ModelState:
    return ModelState(
        tuple(symbolic_slot(f"{prefix}[{i}]") for i in range(n)), z3.Int(f"{prefix}.free")
    )
