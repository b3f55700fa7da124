"""Violations, the catalogue of invariants and the profiles that group them.

Every invariant has one id used everywhere: here, in docs/SPEC.md, in
failure messages and in traces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from schedspec.spec.config import Family

# safety: the engine-neutral core, which every engine keeps. Each family profile is
# safety plus one policy family's exact decisions; an engine claims at most one.
Profile = Literal["safety", "vllm-v1", "sglang"]
PROFILES: tuple[Profile, ...] = ("safety", "vllm-v1", "sglang")
FAMILY_PROFILES: dict[Family, Profile] = {"vllm": "vllm-v1", "sglang": "sglang"}

# When an invariant is checked: on any state, on add_request, on a schedule()
# transition, on an update_from_output() transition, on update_draft_token_ids()
# (the drafter's proposal), on an abort, or once the drain ends.
Kind = Literal["state", "add", "schedule", "update", "drafts", "abort", "drain"]


@dataclass(frozen=True)
class Violation:
    """One broken invariant, precise enough to act on."""

    invariant: str  # the catalogue id, e.g. "BUDGET"
    message: str
    request_id: str | None = None
    block_id: int | None = None
    expected: object = None
    actual: object = None

    def __str__(self) -> str:
        where = []
        if self.request_id is not None:
            where.append(f"request {self.request_id!r}")
        if self.block_id is not None:
            where.append(f"block {self.block_id}")
        text = f"[{self.invariant}] " + (", ".join(where) + ": " if where else "") + self.message
        if self.expected is not None or self.actual is not None:
            text += f" (expected {self.expected!r}, actual {self.actual!r})"
        return text


@dataclass(frozen=True)
class InvariantInfo:
    id: str
    kind: Kind
    profile: Profile  # the smallest profile that includes it
    statement: str


Check = TypeVar("Check", bound=Callable[..., list[Violation]])

CATALOGUE: dict[str, InvariantInfo] = {}
CHECKS: dict[str, Callable[..., list[Violation]]] = {}


def invariant(id: str, kind: Kind, profile: Profile, statement: str) -> Callable[[Check], Check]:
    """Register a predicate under its catalogue id."""

    def register(check: Check) -> Check:
        if id in CATALOGUE:
            raise ValueError(f"invariant {id} registered twice")
        CATALOGUE[id] = InvariantInfo(id, kind, profile, statement)
        CHECKS[id] = check
        return check

    return register


def in_profile(info: InvariantInfo, profile: Profile) -> bool:
    """A family profile is safety plus that family's exact decisions."""
    return info.profile == "safety" or info.profile == profile


def family_of(profile: Profile) -> Family | None:
    """The policy family a profile pins down, or None for safety (any family)."""
    return next((f for f, p in FAMILY_PROFILES.items() if p == profile), None)


def ids_for(kind: Kind, profile: Profile) -> list[str]:
    return [i.id for i in CATALOGUE.values() if i.kind == kind and in_profile(i, profile)]
