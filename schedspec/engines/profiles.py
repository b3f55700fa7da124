"""Which profile a run checks: what an engine claims, the default, and the one asked for.

The checked engine, every command and the pytest plugin decide through these
functions, so they agree on the default and on what is refused. Refusals are
ProfileError, whose `field` says what was wrong: "profile" (the one asked for)
or "profiles" (what the adapter declares).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from schedspec.engines.capabilities import (
    ALL_CAPABILITIES,
    Capability,
    CapabilityError,
    claimed_capabilities,
)
from schedspec.engines.errors import EngineHalt
from schedspec.spec import Family, SchedulerConfig, SpecInputError, shown
from schedspec.spec.config import MIN_SGLANG_MAX_MODEL_LEN
from schedspec.spec.invariants import FAMILY_PROFILES, PROFILES, Profile, family_of

if TYPE_CHECKING:
    from schedspec.engines.protocol import EngineFactory

# The smallest config the spec accepts: enough to build an engine and read
# the profiles it claims before any checking starts.
PROBE_CONFIG = SchedulerConfig(
    block_size=1, num_blocks=2, max_num_batched_tokens=2, max_num_seqs=1, max_model_len=2
)
# The same in family "sglang", whose door needs a longer context to admit anything.
_SGLANG_PROBE_CONFIG = replace(
    PROBE_CONFIG,
    family="sglang",
    num_blocks=MIN_SGLANG_MAX_MODEL_LEN,
    max_num_batched_tokens=MIN_SGLANG_MAX_MODEL_LEN,
    max_model_len=MIN_SGLANG_MAX_MODEL_LEN,
)


class ProfileError(SpecInputError):
    """The engine does not claim the profile asked for, or declares none."""


def claimed_profiles(engine: object) -> frozenset[Profile]:
    """The profiles an adapter declares in its `profiles` attribute, checked."""
    profiles = getattr(engine, "profiles", None)
    if profiles is None:
        raise ProfileError(
            "profiles",
            f"the adapter {type(engine).__qualname__} has no `profiles` attribute: an "
            "EngineAdapter declares the profiles it claims, e.g. "
            "profiles = frozenset({'safety'}) (add 'vllm-v1' if it makes vLLM V1's exact choices)",
        )
    if not isinstance(profiles, set | frozenset) or not profiles or not profiles <= set(PROFILES):
        raise ProfileError(
            "profiles",
            f"the adapter {type(engine).__qualname__} claims {shown(profiles)}: "
            f"expected a non-empty set of {', '.join(map(repr, PROFILES))}",
        )
    families = sorted(profiles & set(FAMILY_PROFILES.values()))
    if len(families) > 1:
        # One step cannot make two families' exact decisions: they disagree.
        raise ProfileError(
            "profiles",
            f"the adapter {type(engine).__qualname__} claims {families}: an engine follows "
            "at most one family's policy (claim the one of the config it was built with)",
        )
    return frozenset(profiles)


def probe_config(family: Family) -> SchedulerConfig:
    """The smallest config of the given policy family (PROBE_CONFIG for vLLM's)."""
    return _SGLANG_PROBE_CONFIG if family == "sglang" else PROBE_CONFIG


def probe_profiles(factory: EngineFactory, family: Family = "vllm") -> frozenset[Profile]:
    """The profiles the engine a factory builds for `family` claims; raises what
    building it raises (an engine that does not follow that family refuses the config)."""
    return claimed_profiles(factory(probe_config(family)))


def probe_capabilities(factories: Sequence[EngineFactory], family: Family) -> frozenset[Capability]:
    """The capabilities every engine the factories build for `family` declares (the
    intersection: a run drives them all on the same configs). A refusal of the
    declaration (CapabilityError) is raised; an engine that cannot even be built is
    taken to have every capability: the run itself then reports why it cannot be built."""
    found = ALL_CAPABILITIES
    for factory in factories:
        try:
            engine = factory(probe_config(family))
        except CapabilityError:
            raise
        except (Exception, EngineHalt):
            continue
        found &= claimed_capabilities(engine)
    return found


def default_profile(claimed: frozenset[Profile]) -> Profile:
    """The exact decisions of the family the engine claims, else safety."""
    return next((p for p in FAMILY_PROFILES.values() if p in claimed), "safety")


def choose_profile(
    claimed: Sequence[frozenset[Profile]],
    requested: Profile | None,
    sides: Sequence[str] = ("",),
) -> Profile:
    """The profile asked for, which every engine must claim, or by default the family
    profile all of them claim, else safety. `sides` names the engines in a refusal
    ("left", "right" for a pair; one unnamed engine by default)."""
    if requested is None:
        return default_profile(frozenset.intersection(*claimed))
    for side, profiles in zip(sides, claimed, strict=True):
        if requested not in profiles:
            engine = f"the {side} engine" if side else "the engine"
            raise ProfileError(
                "profile",
                f"{engine} claims {sorted(profiles)}, not {requested!r}; {how_to_claim(requested)}",
            )
    return requested


def how_to_claim(profile: Profile) -> str:
    """How an adapter claims a profile it does not: what to set, and where the rules are."""
    family = family_of(profile)
    if family is None:  # every adapter claims safety; one that does not is refused at load
        return "an adapter claims a profile in its `profiles` attribute"
    return (
        f"an adapter claims it by setting its `profiles` attribute, e.g. "
        f"profiles = frozenset({{'safety', {profile!r}}}), once its engine makes the {family} "
        f"family's exact decisions (docs/SPEC.md#two-families; the rules are the {profile} "
        "sections of docs/SPEC.md); until then check it under the safety profile"
    )
