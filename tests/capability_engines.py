"""Adapters that declare capabilities, well or badly, loaded by name
(`tests.capability_engines:chunked_only`) as a user's adapter would be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from schedspec.adapters.reference import ReferenceEngine
from schedspec.engines.capabilities import Capability, needed_capabilities, refuses_drafts
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile


class ChunkedOnlyEngine(ReferenceEngine):
    """The reference declaring only chunked prefill: it refuses, at build, every config
    that asks for more (so a run that drew one fails on it), and records those it runs."""

    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities = frozenset({Capability.CHUNKED_PREFILL})
    built: list[SchedulerConfig] = []  # noqa: RUF012  (a record shared by the class)

    def __init__(self, config: SchedulerConfig) -> None:
        extra = needed_capabilities(config) - self.capabilities
        if extra:
            raise AssertionError(f"drawn a config needing {sorted(c.name for c in extra)}")
        ChunkedOnlyEngine.built.append(config)
        super().__init__(config)


def chunked_only(config: SchedulerConfig) -> ChunkedOnlyEngine:
    return ChunkedOnlyEngine(config)


class DraftsWithoutMethod(ReferenceEngine):
    """Declares drafts, but has no update_draft_token_ids."""

    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities = frozenset({Capability.DRAFTS})
    update_draft_token_ids = None  # type: ignore[assignment]


class UndeclaredWithoutMethod(ReferenceEngine):
    """Declares nothing (so every capability), and has no update_draft_token_ids."""

    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities = None  # type: ignore[assignment]
    update_draft_token_ids = None  # type: ignore[assignment]


class DraftsRefused(ReferenceEngine):
    """Declares drafts, but its update_draft_token_ids is marked as refusing them."""

    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities = frozenset({Capability.DRAFTS})

    @refuses_drafts
    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None:
        super().update_draft_token_ids(draft_token_ids)


class StringCapabilities(ReferenceEngine):
    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities = frozenset({"drafts"})  # type: ignore[arg-type]


class PaddingWithoutDrafts(ReferenceEngine):
    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities = frozenset({Capability.SPEC_DECODE_PADDING})


class TrustsItsDeclaration(ReferenceEngine):
    """Declares only chunked prefill, yet builds at any config, as an adapter that leaves
    the check of its declaration to schedspec would."""

    profiles: frozenset[Profile] = frozenset({"safety"})
    capabilities = frozenset({Capability.CHUNKED_PREFILL})


def trusts_its_declaration(config: SchedulerConfig) -> TrustsItsDeclaration:
    return TrustsItsDeclaration(config)
