#!/usr/bin/env bash
# Install vLLM's scheduler into a venv, for the vLLM adapter (schedspec.adapters.vllm.engine).
#
#   scripts/install_vllm.sh VENV_DIR                   the newest supported release (0.34.0)
#   scripts/install_vllm.sh --version 0.33.0 VENV_DIR  a release the adapter supports
#   VERSION=0.33.0 scripts/install_vllm.sh VENV_DIR    the same (--version wins)
# (the venv is created if it does not exist). Another version is refused with the supported
# range (SUPPORTED_VERSIONS); `--any-version` installs it anyway and lets the adapter run it
# as the nearest supported release, which is what scripts/try_newest_vllm.sh does with the
# newest release on PyPI. Installing another release into a venv replaces the one it has.
#
# Only vLLM's scheduler, its config classes and what building a model config imports are
# needed, not its kernels, so this does not take vLLM's dependency list whole (that pulls a
# CUDA torch and its kernels, gigabytes):
#   1. torch 2.13.0: kept if the venv has it (the CPU build, or a GPU user's CUDA build),
#      else its CPU build through scripts/install_torch_cpu.sh;
#   2. vllm==VERSION with --no-deps (~340 MB);
#   3. only the packages that building and stepping a VllmEngine imports (RUNTIME_PACKAGES),
#      held to vLLM's own version pins by a constraints file made from the wheel's
#      METADATA (Requires-Dist), vLLM's torch pins excepted;
#   4. xgrammar at vLLM's pin, with --no-deps (the scheduler's imports reach it; its own
#      dependencies add Triton);
#   5. vllm's and xgrammar's METADATA trimmed of the requirements left out on purpose
#      (lib/dist_requirements.py: the originals stay as METADATA.orig, the removed
#      lines are listed in LEFT_OUT), so that later `pip install`s into the venv and
#      `pip check` stay quiet about them and still check every other requirement.
# Then the probe: `python -m schedspec.properties.probe vllm` builds and steps a
# real VllmEngine for every config family the adapter supports (no drafts, n-gram and EAGLE
# drafts; fcfs, priority; prefix caching off, on; the release's knobs) with every per-user cache (vLLM's, Hugging
# Face's, the XDG folders) pointed at an empty temp folder: vLLM caches per user what it
# learns by importing a model's code in a subprocess, and a warm cache would hide a
# package only that import needs. The same probe runs first: a venv that passes it (and
# has vllm==VERSION, torch 2.13.0 and trimmed METADATA) needs nothing.
#
# In a checkout the probe imports schedspec from it (the script puts the checkout first on
# PYTHONPATH), so it tests the adapter next to the script, and where schedspec's own
# runtime dependencies (click, hypothesis, z3-solver, matplotlib) do not import in the venv
# it installs the checkout there (`pip install -e .`). Run by `schedspec install vllm`
# from an installed schedspec, the venv must have schedspec already.
#
# The steps are lib/engine_install.sh's, which install_sglang.sh shares.
# Downloads and time on a fresh machine: docs/INSTALL.md. Running it again
# is a probe (~20-30 s) and nothing else once the install works.
set -Eeuo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib/pip_install.sh
source "$HERE/lib/pip_install.sh"
# shellcheck source=lib/engine_install.sh
source "$HERE/lib/engine_install.sh"

SCRIPT=install_vllm.sh
DIST=vllm
# The releases the adapter runs, oldest first (schedspec/adapters/vllm/releases.py's
# SUPPORTED: tests/test_install_scripts.py holds the two lists equal); the newest is the
# default. Supporting a release: its version here, its knob values there.
SUPPORTED_VERSIONS=(0.33.0 0.34.0)
ANY_VERSION_VARIABLE=SCHEDSPEC_VLLM_ANY_RELEASE
TORCH_VERSION=2.13.0
# vLLM pins these to its CUDA torch 2.14.0; the venv keeps its torch 2.13.0, which vLLM's
# scheduler runs on (and installs no torchvision or torchaudio).
OVERRIDDEN=(torch torchvision torchaudio)
# What building and stepping a VllmEngine imports with vllm 0.33.0 and 0.34.0 alike, in
# the process or in vLLM's model-inspection subprocess (einops: the Llama and EAGLE model
# code): without any one of them the probe fails. A release that needs others changes
# the list in a `release_packages VERSION` function (lib/engine_install.sh).
RUNTIME_PACKAGES=(
    numpy packaging regex pydantic psutil cbor2 pyzmq requests transformers aiohttp
    oss-harmony openai msgspec cloudpickle pillow pybase64 cachetools uvloop py-cpuinfo
    prometheus_client fastapi partial_json_parser llguidance apache-tvm-ffi einops
)
NO_DEPS=(vllm xgrammar)
EXTRA_PINS=()
PROBE_ENGINE=vllm
PROBE_WHAT="a VllmEngine"

install_engine "$@"
