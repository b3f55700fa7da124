"""Does a real engine's scheduler work in this environment? Build and step it.

    python -m schedspec.properties.probe vllm
    python -m schedspec.properties.probe sglang

builds the engine for every config family its adapter's probe plan declares
(adapters/vllm/probe.py, adapters/sglang/probe.py) and steps each one under the harness
(the engine core's order of calls, the safety invariants checked) until its requests
finish, with every per-user cache the plan names pointed at a new empty folder. Exit
status 0 when all of them work; 1, with the family and the error, when one does not; 2
when the command line names no engine with a plan.

Why empty caches: an engine's install probe must fail where the venv lacks a package,
and a cache warmed by another venv can hide one (vLLM caches what importing a model's
code told it; SGLang and Triton cache compiled kernels); each plan says which of its
engine's caches and why.

The install scripts (`schedspec install vllm|sglang`: schedspec/install/lib/engine_install.sh)
run this before installing (a venv that passes needs nothing) and after (the install is
done only when it passes). Meant for a fresh process (`python -m`): the engines and
huggingface_hub read some of the cache variables once, when first imported.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence

from schedspec.adapters.probe_plan import ProbeFamily, ProbePlan
from schedspec.adapters.sglang.probe import PLAN as SGLANG_PLAN
from schedspec.adapters.vllm.probe import PLAN as VLLM_PLAN
from schedspec.engines.events import AddRequest, Drain, ProposeDrafts, Step
from schedspec.engines.protocol import EngineFactory
from schedspec.environment import environment_set
from schedspec.properties.checked_engine import CheckedEngine, InvariantViolationError

# By the engine's registered name (engines/registry.py).
PLANS: dict[str, ProbePlan] = {"vllm": VLLM_PLAN, "sglang": SGLANG_PLAN}
USAGE = f"usage: python -m schedspec.properties.probe {{{','.join(PLANS)}}}"
# Steps before the drain runs the requests to the end, with drafts proposed after each
# where the family speculates (a synchronous engine core's drafter): the first prefills,
# the second decodes, or prefills the second request (SGLang's prefill-first rule).
NUM_STEPS = 2


class ProbeError(RuntimeError):
    """A family's engine was built but did not do its work."""


def step_family(build: EngineFactory, family: ProbeFamily) -> int:
    """Build the family's engine and run two requests that share a prefix to the end
    under the harness; return the schedule() calls it took. Raises whatever the engine
    raises, or ProbeError when an invariant breaks (a request left unfinished among
    them)."""
    config = family.config()
    checked = CheckedEngine(build(config), config, "safety")
    # Over two blocks of 16 tokens (ten pages of 4): the second request's prefix-cache hit.
    shared = tuple(range(40))
    try:
        checked.apply(AddRequest("a", (*shared, 7, 8), max_tokens=3, priority=1))
        checked.apply(AddRequest("b", (*shared, 9), max_tokens=3, priority=0))
        for _ in range(NUM_STEPS):
            checked.apply(Step())
            if config.num_speculative_tokens:
                # The harness skips this under async scheduling, as vLLM's engine core does.
                k = config.num_speculative_tokens
                checked.apply(ProposeDrafts(dict.fromkeys(checked.state.running, k)))
        checked.apply(Drain())
    except InvariantViolationError as err:
        raise ProbeError(f"{family}: {err}") from err
    return checked.stats.steps


@contextlib.contextmanager
def empty_caches(variables: Sequence[str], prefix: str) -> Iterator[str]:
    """Each of `variables` names its own new empty folder (under the folder yielded,
    whose name starts with `prefix`) until the block ends; then the folders go and the
    variables are as they were."""
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        folders = {name: os.path.join(root, name.lower()) for name in variables}
        for folder in folders.values():
            os.mkdir(folder)
        with environment_set(folders):
            yield root


def probe(plan: ProbePlan) -> None:
    """Step every family's engine in this process; raise ProbeError on the first that
    fails, naming the family."""
    for family in plan.families:
        try:
            step_family(plan.build, family)
        except Exception as err:
            raise ProbeError(f"{family}: {type(err).__name__}: {err}") from err


def main(argv: Sequence[str]) -> int:
    """The probe of the engine `argv` names, with empty caches: 0 if every family
    works, 1 (and why) if not, 2 (and the usage) for a command line naming no plan."""
    if len(argv) != 1 or argv[0] not in PLANS:
        print(USAGE, file=sys.stderr)
        return 2
    name = argv[0]
    plan = PLANS[name]
    start = time.monotonic()
    with empty_caches(plan.cache_variables, f"schedspec-{name}-probe-"):
        try:
            probe(plan)
        except ProbeError:
            traceback.print_exc()
            print(
                f"{plan.engine} probe: FAILED (the last line of the traceback names the "
                "config family)"
            )
            return 1
    print(
        f"{plan.engine} probe: built and stepped {len(plan.families)} {plan.built} "
        f"({plan.spans}) with empty caches in {time.monotonic() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
