"""The invariant catalogue: named pure predicates over abstract states and transitions.

Each predicate returns the list of violations it finds (empty when it holds).
Profiles, a folder each: `safety/` holds for any correct engine; `vllm/` (profile
vllm-v1) adds vLLM V1's exact decisions and `sglang/` SGLang's (an engine claims at most
one family profile).
The ids are the ones docs/SPEC.md, failure messages and traces use.
"""

# Importing a module registers its checks, and this order fixes the catalogue's: the
# order of the check table and of the violations a step reports.
# isort: off
from schedspec.spec.invariants.vllm import allocation  # noqa: F401  (imports vllm.policy)
from schedspec.spec.invariants.vllm import completeness  # noqa: F401
from schedspec.spec.invariants.vllm import freed  # noqa: F401
from schedspec.spec.invariants.safety import door  # noqa: F401
from schedspec.spec.invariants.safety import drafts  # noqa: F401
from schedspec.spec.invariants.vllm import drafts as vllm_drafts  # noqa: F401
from schedspec.spec.invariants.safety import liveness  # noqa: F401
from schedspec.spec.invariants.safety import pipeline  # noqa: F401
from schedspec.spec.invariants.safety import schedule  # noqa: F401
from schedspec.spec.invariants.sglang import policy as sglang_policy  # noqa: F401
from schedspec.spec.invariants.sglang import admission as sglang_admission  # noqa: F401
from schedspec.spec.invariants.sglang import lifecycle as sglang_lifecycle  # noqa: F401
from schedspec.spec.invariants.safety import state  # noqa: F401
from schedspec.spec.invariants.safety import connector  # noqa: F401
from schedspec.spec.invariants.safety import update  # noqa: F401
from schedspec.spec.invariants.vllm import split  # noqa: F401
from schedspec.spec.invariants.vllm import cache_aware  # noqa: F401
from schedspec.spec.invariants.vllm import mamba  # noqa: F401
from schedspec.spec.invariants.safety import hybrid  # noqa: F401
from schedspec.spec.invariants.vllm import hybrid_hit  # noqa: F401
from schedspec.spec.invariants.vllm import hybrid_cache  # noqa: F401
from schedspec.spec.invariants.vllm import hybrid_admission  # noqa: F401
from schedspec.spec.invariants.vllm import hybrid_alloc  # noqa: F401

# isort: on
from schedspec.spec.invariants.registry import (
    CATALOGUE,
    CHECKS,
    FAMILY_PROFILES,
    PROFILES,
    SPEC_DOC,
    FieldCheck,
    InvariantInfo,
    Kind,
    Profile,
    Violation,
    changed_fields,
    family_of,
    field_violations,
    holds_nothing,
    ids_for,
    in_profile,
    or_absent,
    outputs_changed,
    rule_anchor,
    rule_link,
    still_live,
)
from schedspec.spec.invariants.safety.liveness import (
    drain_step_bound,
    passed_over_after,
    passed_over_head,
    progress_step_bound,
)
from schedspec.spec.invariants.safety.update import expected_kept
from schedspec.spec.invariants.transitions import (
    AbortTransition,
    AddTransition,
    ChainHashes,
    Departures,
    DraftsTransition,
    DrainResult,
    PassedOver,
    ScheduleTransition,
    UpdateTransition,
    computed_before,
)
from schedspec.spec.invariants.vllm.policy import expected_free_queue
from schedspec.spec.invariants.vllm.reorder import WaitingPhase, waiting_phase

__all__ = [
    "CATALOGUE",
    "CHECKS",
    "FAMILY_PROFILES",
    "PROFILES",
    "SPEC_DOC",
    "AbortTransition",
    "AddTransition",
    "ChainHashes",
    "Departures",
    "DraftsTransition",
    "DrainResult",
    "FieldCheck",
    "InvariantInfo",
    "Kind",
    "PassedOver",
    "Profile",
    "ScheduleTransition",
    "UpdateTransition",
    "Violation",
    "WaitingPhase",
    "changed_fields",
    "computed_before",
    "drain_step_bound",
    "expected_free_queue",
    "expected_kept",
    "family_of",
    "field_violations",
    "holds_nothing",
    "ids_for",
    "in_profile",
    "or_absent",
    "outputs_changed",
    "passed_over_after",
    "passed_over_head",
    "progress_step_bound",
    "rule_anchor",
    "rule_link",
    "still_live",
    "waiting_phase",
]
