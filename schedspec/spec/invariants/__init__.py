"""The invariant catalogue: named pure predicates over abstract states and transitions.

Each predicate returns the list of violations it finds (empty when it holds).
Profiles: `safety` holds for any correct engine; `vllm-v1` adds vLLM V1's exact
decisions and `sglang` SGLang's (an engine claims at most one family profile).
The ids are the ones docs/SPEC.md, failure messages and traces use.
"""

from schedspec.spec.invariants import (  # noqa: F401  (importing registers the checks)
    allocation_invariants,
    completeness_invariants,
    door_invariants,
    draft_invariants,
    liveness_invariants,
    pipeline_invariants,
    policy_invariants,
    schedule_invariants,
    sglang_invariants,
    state_fast_path,
    state_invariants,
    update_invariants,
    vllm_split_invariants,
)
from schedspec.spec.invariants.liveness_invariants import drain_step_bound
from schedspec.spec.invariants.policy_invariants import expected_free_queue
from schedspec.spec.invariants.registry import (
    CATALOGUE,
    CHECKS,
    FAMILY_PROFILES,
    PROFILES,
    InvariantInfo,
    Kind,
    Profile,
    Violation,
    family_of,
    ids_for,
    in_profile,
)
from schedspec.spec.invariants.transitions import (
    AbortTransition,
    AddTransition,
    ChainHashes,
    DraftsTransition,
    DrainResult,
    ScheduleTransition,
    UpdateTransition,
    computed_before,
)
from schedspec.spec.invariants.update_invariants import expected_kept

__all__ = [
    "CATALOGUE",
    "CHECKS",
    "FAMILY_PROFILES",
    "PROFILES",
    "AbortTransition",
    "AddTransition",
    "ChainHashes",
    "DraftsTransition",
    "DrainResult",
    "InvariantInfo",
    "Kind",
    "Profile",
    "ScheduleTransition",
    "UpdateTransition",
    "Violation",
    "computed_before",
    "drain_step_bound",
    "expected_free_queue",
    "expected_kept",
    "family_of",
    "ids_for",
    "in_profile",
]
