#!/usr/bin/env bash
# Install SGLang's scheduler into a venv of its own, for the SGLang adapter
# (schedspec.adapters.sglang.engine).
#
#   scripts/install_sglang.sh VENV_DIR      (the venv is created if it does not exist)
#
# Its own venv, not vLLM's: SGLang 0.5.23 and vLLM 0.33.0 pin the same packages to
# versions that exclude each other (openai ==2.8.0 against >=2.25.0, compressed-tensors
# ==0.18.0 against ==0.17.0, xgrammar ==0.2.7 against ==0.2.8), so one venv would run
# one of them on dependencies it was not released with. docs/ENGINES.md's set-up line
# names the venv .venv-sglang.
#
# Only SGLang's scheduler stack is needed (Scheduler, PrefillAdder, ScheduleBatch, the
# radix cache and the token pools, with the TpModelWorker that builds them), not its
# kernels, so this does not take SGLang's dependency list whole (torch 2.14.1 CUDA,
# flashinfer, sgl-kernel, flash-attn, deep-gemm...: gigabytes, none of it imported):
#   1. torch 2.13.0: kept if the venv has it, else its CPU build through
#      scripts/install_torch_cpu.sh;
#   2. sglang==0.5.23 with --no-deps (a 39 MB wheel);
#   3. the packages the scheduler's import chain needs (RUNTIME_PACKAGES, found by
#      importing until nothing was missing), held to SGLang's own version pins by a
#      constraints file made from the wheel's METADATA (Requires-Dist), SGLang's torch
#      pins excepted, and Triton at TRITON_VERSION (SGLang does not name it: a CUDA torch
#      brings it; SGLang defines Triton kernels at import time and never runs them here);
#   4. compressed-tensors at SGLang's pin, with --no-deps (imported by the model config
#      code; its own dependencies would bring a second torch);
#   5. sglang's and compressed-tensors' METADATA trimmed of the requirements left out
#      on purpose (lib/dist_requirements.py), so that later `pip install`s into
#      the venv and `pip check` stay quiet about them and still check every other one.
# No torchvision: PyPI's wheels need a CUDA torch and do not load against the CPU one;
# the adapter stubs the one import of it that SGLang's config code makes.
#
# Then the probe: `python -m schedspec.properties.probe sglang` builds SGLang's
# real Scheduler for every config family the adapter supports (plain and overlap loops,
# radix cache on and off, page sizes 1 and 4, mixed chunk) and steps each under the
# harness, with every per-user cache (Hugging Face's, SGLang's, Triton's, the XDG
# folders) pointed at an empty temp folder, so no cache can stand in for a missing
# package. The same probe runs first: a venv that passes it (and has sglang==0.5.23,
# torch 2.13.0 and trimmed METADATA) needs nothing.
#
# In a checkout the probe imports schedspec from it (the script puts the checkout first on
# PYTHONPATH), and where schedspec's own runtime dependencies do not import in the venv it
# installs the checkout there (`pip install -e .`). Run by `schedspec install sglang` from
# an installed schedspec, the venv must have schedspec already.
#
# The steps are lib/engine_install.sh's, which install_vllm.sh shares.
# Downloads and time on a fresh machine: docs/INSTALL.md. Running it again
# is a probe (about a minute) and nothing else once the install works.
set -Eeuo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib/pip_install.sh
source "$HERE/lib/pip_install.sh"
# shellcheck source=lib/engine_install.sh
source "$HERE/lib/engine_install.sh"

SCRIPT=install_sglang.sh
DIST=sglang
VERSION=0.5.23
TORCH_VERSION=2.13.0
# SGLang pins these to its CUDA torch 2.14.1; the venv keeps its torch 2.13.0, which
# SGLang's scheduler runs on (and installs no torchvision or torchaudio).
OVERRIDDEN=(torch torchvision torchaudio)
# What `import sglang.srt.managers.scheduler` and building a Scheduler import with
# sglang 0.5.23 on this CPU path: without any one of them the probe fails. Triton too:
# SGLang defines Triton kernels at import time (and never runs them here); it does not
# name Triton (a CUDA torch brings it), so its pin is EXTRA_PINS'.
RUNTIME_PACKAGES=(
    numpy packaging psutil pydantic requests pyzmq setproctitle msgspec orjson pybase64
    regex tqdm transformers pillow starlette IPython aiohttp apache-tvm-ffi dill
    sentencepiece gguf openai partial_json_parser einops uvicorn fastapi loguru triton
)
NO_DEPS=(sglang compressed-tensors)
EXTRA_PINS=(triton==3.9.0)
PROBE_ENGINE=sglang
PROBE_WHAT="SGLang's Scheduler"

install_engine "$@"
