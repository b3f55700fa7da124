"""The adapter kit: what every adapter derives the same way, in one place.

An adapter maps its engine's state to the spec's (the refinement mapping). Most of that
mapping is the same for every engine, and lives here:

- given.py: what the harness said about each request (prompt, priority, arrival,
  max_tokens, EOS and stop tokens), which the adapter keeps so the engine need not.
- request_state.py: a RequestState from the five fields only the engine knows.
- pipeline.py: what each request has in flight, counted from the steps scheduled and
  landed.
- step_output.py: the spec's SchedulerOutput from what the engine scheduled and the
  states around the call; the requests finished since the last step.
- block_hashes.py: the engine's block hashes as the spec's.
- base.py: KitAdapter, an EngineAdapter built from those: a subclass translates the
  calls to its engine and reads its state, and everything else is derived.
- conformance.py: the adapter's own protocol checked before any invariant
  (`schedspec conform`), naming the method at fault.

The vLLM and SGLang adapters use the parts; docs/ADAPTERS.md walks through an adapter
built on KitAdapter (examples/toyserve_adapter.py).
"""

from schedspec.adapters.kit.base import KitAdapter
from schedspec.adapters.kit.block_hashes import HashCollisionError, HashTranslator, OwnHashes
from schedspec.adapters.kit.given import Given
from schedspec.adapters.kit.pipeline import InFlight, Pipeline, ScheduledRow
from schedspec.adapters.kit.request_state import EngineRequest, request_state
from schedspec.adapters.kit.step_output import FinishedSince, step_output

__all__ = [
    "EngineRequest",
    "FinishedSince",
    "Given",
    "HashCollisionError",
    "HashTranslator",
    "InFlight",
    "KitAdapter",
    "OwnHashes",
    "Pipeline",
    "ScheduledRow",
    "request_state",
    "step_output",
]
