"""Adapters that put real engines under schedspec.

Each adapter lives in its own module and imports its engine only there, so
that importing schedspec never needs an engine installed:

- `schedspec.adapters.vllm.engine`: vLLM V1's `Scheduler` (with its own
  KVCacheManager and BlockPool), driven on CPU with no model download
  (`schedspec check --engine vllm`; engines.py names it). Install vLLM first
  with `scripts/install_vllm.sh VENV_DIR`; `python -m
  schedspec.adapters.vllm.probe` tells whether an environment can
  build and step one.
- `schedspec.adapters.gpu`: the torch implementation with B = 1
  (`--engine gpu`; needs torch, the `gpu` extra).
"""
