"""Adapters that put engines under schedspec, each behind the EngineAdapter protocol.

Each real engine lives in a folder of its own and is imported only when one is built,
so that importing schedspec never needs an engine installed. A folder is split by job:
runtime.py imports the engine (once, offline and quiet, with its tiny model folders:
engine_import.py is what every engine's import shares), config.py translates the spec's
config into the engine's and says what it refuses and why, engine.py is the adapter and
what it does per call, output.py (vLLM) translates what the engine schedules, and
probe.py is the plan of its install probe (probe_plan.py; schedspec.properties.probe runs
it). What every adapter derives the same way (a RequestState from the few fields an
engine gives, what is in flight, a step's SchedulerOutput from the states around it,
block-hash translation) is the adapter kit's (`schedspec.adapters.kit`), which
docs/ADAPTERS.md teaches with examples/toyserve_adapter.py.

- `schedspec.adapters.vllm`: vLLM V1's `Scheduler` (with its own KVCacheManager and
  BlockPool), driven on CPU with no model download (`--engine vllm`). Install vLLM with
  `schedspec install vllm`; `python -m schedspec.properties.probe vllm` tells
  whether an environment can build and step one.
- `schedspec.adapters.sglang`: SGLang's `Scheduler`, likewise (`--engine sglang`;
  `schedspec install sglang VENV`, a venv of its own; kv.py and requests.py read
  its pool, radix cache and requests as the spec's).
- `schedspec.adapters.gpu`: the torch implementation with B = 1 (`--engine gpu`; needs
  torch, the `gpu` extra).
- `schedspec.adapters.reference`: the reference scheduler, which speaks the spec already.
- in_flight.py: what the vLLM and SGLang adapters check when the harness lands a step.
- kit/: the adapter kit (its __init__ says what is where).
"""
