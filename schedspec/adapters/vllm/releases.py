"""The vLLM releases the adapter runs, each as values of the spec's knobs.

A release is a set of knob values (DESIGN.md, "Third wave"): the spec states what vLLM
does through SchedulerConfig knobs with vLLM's names, and each supported release maps
to values of them. Two kinds of difference between releases:

- Behaviour with nothing to detect is named here, per release, as knob values:
  - `long_prefill_needs_chunked_prefill`: 0.33.0's `Scheduler.schedule` caps a long
    prefill whenever more than one request is eligible (False); 0.34.0's only with
    chunked prefill on as well (True).
  - `cache_aware_admission`: 0.34.0's SchedulerConfig has
    `cache_aware_admission_window` and `..._threshold`
    (`Scheduler._reorder_waiting_by_cached_prefix`), passed through as the spec's
    knobs; 0.33.0 has neither, so its window is 0.
  - `inflight_kv_load_cap`: 0.34.0's SchedulerConfig has `max_num_inflight_kv_loads`
    (and with it the async-load queue, async_kv_waiting, and connectors'
    may_load_async); 0.33.0 has none, so it runs no cap. A config that sets one is
    refused there (`refusal`): without the cap vLLM would not run what it describes,
    and unlike the other knobs no harness default stands for "the release's rule".
- API shapes are found by feature detection where the adapter reads vLLM: the output
  layout (output.py), ModelRunnerOutput's fields and the prefix-cache map (runtime.py,
  engine.py), `use_v2_model_runner` (config.py). A release that only moves those
  needs no entry of its own beyond its version.

The installed release is the `vllm` distribution's version (importlib.metadata, so
vLLM is not imported to learn it; a local label such as "+cpu" is ignored). One not in
SUPPORTED is refused with UnsupportedVllmError when an engine is built, naming it and
the range, unless ANY_RELEASE_VARIABLE is set to 1 (scripts/try_newest_vllm.sh sets it
to learn what a new release breaks): then it runs with the knobs of the nearest
supported release.

Supporting the next release: a Release in SUPPORTED with its knob values (and the
knobs it adds, in the spec's SchedulerConfig, with their translation in config.py),
its version in schedspec/install/install_vllm.sh's SUPPORTED_VERSIONS (and its runtime packages
there if they differ); what its API moved, scripts/try_newest_vllm.sh shows first.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from dataclasses import dataclass, replace

from schedspec.adapters.vllm.runtime import VllmMissingError
from schedspec.install import install_command
from schedspec.spec import ConfigError, SchedulerConfig

# Set to 1: an installed release outside SUPPORTED runs as the nearest supported one.
ANY_RELEASE_VARIABLE = "SCHEDSPEC_VLLM_ANY_RELEASE"
INSTALL_HINT = install_command("vllm", version="VERSION")


class UnsupportedVllmError(VllmMissingError):
    """The installed vLLM is not a release the adapter supports (an ImportError, as a
    missing vLLM is: the fix is the same install step)."""


@dataclass(frozen=True)
class Release:
    """One vLLM release as the spec's knob values."""

    version: str
    # The long-prefill cap only with chunked prefill on (0.34.0's rule), or whenever
    # more than one request is eligible (0.33.0's).
    long_prefill_needs_chunked_prefill: bool
    # Whether its SchedulerConfig has cache_aware_admission_window and _threshold.
    cache_aware_admission: bool
    # Whether its SchedulerConfig has max_num_inflight_kv_loads.
    inflight_kv_load_cap: bool

    def knobs(self, config: SchedulerConfig) -> SchedulerConfig:
        """The config with this release's knob values: the long-prefill rule it has,
        and no cache-aware admission or cap on KV loads in flight where it has none."""
        rule = self.long_prefill_needs_chunked_prefill
        config = replace(config, long_prefill_needs_chunked_prefill=rule)
        if not self.inflight_kv_load_cap:
            config = replace(config, max_num_inflight_kv_loads=None)
        if self.cache_aware_admission:
            return config
        # SchedulerConfig's defaults: off.
        return replace(config, cache_aware_admission_window=0, cache_aware_admission_threshold=0.5)

    def refusal(self, config: SchedulerConfig) -> ConfigError | None:
        """Why this release cannot run the config (the knob and why), or None."""
        cap = config.max_num_inflight_kv_loads
        if cap is not None and not self.inflight_kv_load_cap:
            return ConfigError(
                "max_num_inflight_kv_loads",
                f"{cap}: vLLM {self.version} has no cap on KV loads in flight (it came "
                "with 0.34.0); it must be None there",
            )
        return None

    def mismatch(self, config: SchedulerConfig) -> ConfigError | None:
        """Where the config's knobs do not describe this release (the knob and why), or
        None where they do.

        A knob counts only where its value decides something: the long-prefill rules
        differ only with chunked prefill off and a cap > 0, and a window only acts under
        fcfs with prefix caching, so elsewhere either value describes this release. A
        mismatch is no refusal: vLLM runs the config its own way (that is what a diff
        between two releases compares), and the engine then claims safety, not vllm-v1
        (adapters/vllm/engine.py)."""
        rule = config.long_prefill_needs_chunked_prefill
        capped_unchunked = config.long_prefill_token_threshold > 0 and (
            not config.enable_chunked_prefill
        )
        if capped_unchunked and rule != self.long_prefill_needs_chunked_prefill:
            which = "only with chunked prefill on" if not rule else "with chunked prefill off too"
            return ConfigError(
                "long_prefill_needs_chunked_prefill",
                f"{rule} with chunked prefill off and long_prefill_token_threshold="
                f"{config.long_prefill_token_threshold}: vLLM {self.version} applies the cap "
                f"{which} (it is {self.long_prefill_needs_chunked_prefill})",
            )
        window_acts = config.policy == "fcfs" and config.enable_prefix_caching
        if not self.cache_aware_admission and config.cache_aware_admission_window and window_acts:
            return ConfigError(
                "cache_aware_admission_window",
                f"{config.cache_aware_admission_window}: vLLM {self.version} has no "
                "cache-aware admission (it came with 0.34.0); its window is 0",
            )
        return None


# Oldest first; the last is what `schedspec install vllm` installs by default.
SUPPORTED: tuple[Release, ...] = (
    Release(
        "0.33.0",
        long_prefill_needs_chunked_prefill=False,
        cache_aware_admission=False,
        inflight_kv_load_cap=False,
    ),
    Release(
        "0.34.0",
        long_prefill_needs_chunked_prefill=True,
        cache_aware_admission=True,
        inflight_kv_load_cap=True,
    ),
)
NEWEST = SUPPORTED[-1]


def supported_range() -> str:
    """The range as messages say it: "0.33.0 to 0.34.0" (one version while there is one)."""
    first, last = SUPPORTED[0].version, SUPPORTED[-1].version
    return first if first == last else f"{first} to {last}"


def installed_version() -> str | None:
    """The installed vllm distribution's version, or None where there is none."""
    return _distribution_version()


@functools.cache
def _distribution_version() -> str | None:
    # Read once per process: each read parses the distribution's METADATA file, and
    # every vLLM engine built asked three times (about a quarter of a build).
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_of(version: str) -> Release:
    """The supported release `version` is (a local label like "+cpu" ignored); else
    UnsupportedVllmError naming it and the supported range, or, with
    ANY_RELEASE_VARIABLE=1, the nearest supported release."""
    public = _public(version)
    for release in SUPPORTED:
        if release.version == public:
            return release
    nearest = _nearest(public)
    if os.environ.get(ANY_RELEASE_VARIABLE) == "1":
        return nearest
    raise UnsupportedVllmError(
        f"vLLM {version} is installed; schedspec supports {supported_range()} "
        f"({INSTALL_HINT}; or set {ANY_RELEASE_VARIABLE}=1 to try it anyway as "
        f"{nearest.version})"
    )


def current_release() -> Release:
    """The installed release (release_of), or NEWEST where vLLM is not installed: what
    `schedspec install vllm` would install, so configs drawn without vLLM are its."""
    version = installed_version()
    return NEWEST if version is None else release_of(version)


def describe_installed() -> str:
    """The installed vLLM for messages, never raising: "vLLM 0.34.0", or how an
    unsupported one runs ("vLLM 0.35.0 (unsupported, run as 0.34.0)"), or "vLLM (not
    installed)"."""
    version = installed_version()
    if version is None:
        return "vLLM (not installed)"
    try:
        release = release_of(version)
    except UnsupportedVllmError:
        return f"vLLM {version} (unsupported)"
    if release.version == _public(version):
        return f"vLLM {version}"
    return f"vLLM {version} (unsupported, run as {release.version})"


def _public(version: str) -> str:
    """The version without its local label ("0.34.0+cpu" -> "0.34.0")."""
    return version.split("+", 1)[0]


def _nearest(public: str) -> Release:
    """The supported release nearest an unsupported version: the oldest for an older
    one, else the newest."""
    return SUPPORTED[0] if _numbers(public) < _numbers(SUPPORTED[0].version) else NEWEST


def _numbers(version: str) -> tuple[int, ...]:
    """The leading dotted numbers of a version ("0.35.0rc1" -> (0, 35, 0))."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else ()
