"""Violations, the catalogue of invariants and the profiles that group them.

Every invariant has one id used everywhere: here, in docs/SPEC.md, in
failure messages and in traces.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, TypeVar

from schedspec.spec.config import Family
from schedspec.spec.state import RequestState

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# safety: the engine-neutral core, which every engine keeps. Each family profile is
# safety plus one policy family's exact decisions; an engine claims at most one.
Profile = Literal["safety", "vllm-v1", "sglang"]
PROFILES: tuple[Profile, ...] = ("safety", "vllm-v1", "sglang")
FAMILY_PROFILES: dict[Family, Profile] = {"vllm": "vllm-v1", "sglang": "sglang"}

# When an invariant is checked: on any state, on add_request, on a schedule()
# transition, on an update_from_output() transition, on update_draft_token_ids()
# (the drafter's proposal), on an abort, or once the drain ends.
Kind = Literal["state", "add", "schedule", "update", "drafts", "abort", "drain"]

# Which KV caches an invariant is about: any; the single full-attention group only (it
# ties block_ids to token counts at config.block_size, which a hybrid request's flat
# block_ids do not follow); or hybrid caches only (it reads group_block_ids).
Groups = Literal["any", "single", "hybrid"]


SPEC_DOC = "docs/SPEC.md"  # the catalogue for humans: one section per invariant id


def rule_anchor(invariant_id: str) -> str:
    """The anchor of an invariant's section in docs/SPEC.md, as GitHub and the docs site's
    Markdown renderer both compute it from the heading `### ID`: lower case, every
    character other than a letter, digit, '-', '_' or space dropped, spaces to hyphens."""
    kept = re.sub(r"[^\w\- ]", "", invariant_id.lower())
    return kept.replace(" ", "-")


def rule_link(invariant_id: str) -> str:
    """Where an invariant's rule is stated, relative to the repository root."""
    return f"{SPEC_DOC}#{rule_anchor(invariant_id)}"


@dataclass(frozen=True)
class Violation:
    """One broken invariant, precise enough to act on: what is at fault, the value the
    spec requires (expected) and the one the engine produced (actual).

    expected and actual are keyword-only and have no default, so no predicate can report a
    violation without saying what it compared; where the rule is a membership or a
    condition rather than a number, they are short phrases ("in waiting", "absent").
    """

    invariant: str  # the catalogue id, e.g. "BUDGET"
    message: str
    request_id: str | None = None
    block_id: int | None = None
    expected: object = field(kw_only=True)
    actual: object = field(kw_only=True)

    @property
    def rule(self) -> str:
        """The section of docs/SPEC.md that states the broken rule."""
        return rule_link(self.invariant)

    def __str__(self) -> str:
        where = []
        if self.request_id is not None:
            where.append(f"request {self.request_id!r}")
        if self.block_id is not None:
            where.append(f"block {self.block_id}")
        text = f"[{self.invariant}] " + (", ".join(where) + ": " if where else "") + self.message
        return text + f" (expected {self.expected!r}, actual {self.actual!r}; rule: {self.rule})"


def or_absent(value: object, absent: str = "none") -> object:
    """A value for a violation's expected or actual, with None (no hash, no phase, no
    entry) spelled out: None in a violation means "not given", never a value."""
    return absent if value is None else value


@dataclass(frozen=True)
class FieldCheck:
    """One field a rule pins down: its name, the value the rule requires, the value seen."""

    name: str
    expected: object
    actual: object


def still_live(invariant_id: str, message: str, request: RequestState) -> Violation:
    """A request that should have left (finished, aborted) but is live."""
    return Violation(
        invariant_id, message, request.request_id, expected="not live", actual=request.status.name
    )


def outputs_changed(
    invariant_id: str, message: str, before: RequestState, after: RequestState | None
) -> Violation:
    """A request whose outputs had to stay as they were, and did not (or that left)."""
    return Violation(
        invariant_id,
        message,
        before.request_id,
        expected=before.output_token_ids,
        actual="not live" if after is None else after.output_token_ids,
    )


def holds_nothing(request: RequestState) -> list[FieldCheck]:
    """A request that holds no KV: nothing computed, no blocks (a fresh arrival, a victim
    just reset, a waiting request that is not a parked load)."""
    return [
        FieldCheck("num_computed_tokens", 0, request.num_computed_tokens),
        FieldCheck("block_ids", (), tuple(request.block_ids)),
    ]


def field_violations(
    invariant_id: str, context: str, request_id: str | None, checks: Iterable[FieldCheck]
) -> list[Violation]:
    """One violation per field whose value is not the required one, each naming the field,
    so a rule over several fields (a reset, a waiting request's emptiness) says which
    failed instead of listing them all."""
    return [
        Violation(
            invariant_id,
            f"{context}: {c.name}",
            request_id,
            expected=c.expected,
            actual=c.actual,
        )
        for c in checks
        if c.actual != c.expected
    ]


def changed_fields(
    before: DataclassInstance, after: DataclassInstance | None, ignore: Iterable[str] = ()
) -> list[FieldCheck]:
    """The fields in which two records of one dataclass differ, the first as expected: for
    a rule that a call leaves a record unchanged (but for the fields in ignore). An after
    of None (the request left) is the one check "live"."""
    if after is None:
        return [FieldCheck("live", True, False)]
    skipped = set(ignore)
    return [
        FieldCheck(f.name, getattr(before, f.name), getattr(after, f.name))
        for f in fields(before)
        if f.name not in skipped and getattr(before, f.name) != getattr(after, f.name)
    ]


@dataclass(frozen=True)
class InvariantInfo:
    id: str
    kind: Kind
    profile: Profile  # the smallest profile that includes it
    statement: str
    groups: Groups = "any"

    def applies_to(self, hybrid: bool) -> bool:
        """Is it checked on a config with kv_cache_groups (hybrid) or without?"""
        return self.groups == "any" or (self.groups == "hybrid") == hybrid


Check = TypeVar("Check", bound=Callable[..., list[Violation]])

CATALOGUE: dict[str, InvariantInfo] = {}
CHECKS: dict[str, Callable[..., list[Violation]]] = {}


def invariant(
    id: str, kind: Kind, profile: Profile, statement: str, groups: Groups = "any"
) -> Callable[[Check], Check]:
    """Register a predicate under its catalogue id."""

    def register(check: Check) -> Check:
        if id in CATALOGUE:
            raise ValueError(f"invariant {id} registered twice")
        CATALOGUE[id] = InvariantInfo(id, kind, profile, statement, groups)
        CHECKS[id] = check
        return check

    return register


def in_profile(info: InvariantInfo, profile: Profile) -> bool:
    """A family profile is safety plus that family's exact decisions."""
    return info.profile == "safety" or info.profile == profile


def family_of(profile: Profile) -> Family | None:
    """The policy family a profile pins down, or None for safety (any family)."""
    return next((f for f, p in FAMILY_PROFILES.items() if p == profile), None)


def ids_for(kind: Kind, profile: Profile, hybrid: bool = False) -> list[str]:
    """The invariants a run checks on `kind` under `profile`, for a config with
    kv_cache_groups (hybrid) or without."""
    return [
        i.id
        for i in CATALOGUE.values()
        if i.kind == kind and in_profile(i, profile) and i.applies_to(hybrid)
    ]
