"""The scheduler configs a simulation compares, named.

The base config is a vLLM-like deployment of the cost model's GPU: chunked
prefill with a 2048-token budget, prefix caching on, 128 sequences, 4096
tokens per request, and as many KV blocks as the memory left by the weights
holds (CostModel.default_num_blocks). A preset changes a few fields of it;
`--config NAME:field=value,...` starts from the preset NAME if there is one,
else from the base, and `--set field=value` changes every config.

SGLang's family (docs/SPEC.md, "Two families") has presets of its own: `sglang` is
the base deployment as SGLang runs it (the same KV memory in token slots, page size 1,
SGLang's default; the same budget as its chunked_prefill_size, the same running cap and
context; vLLM's knobs at the defaults that family keeps), and `sglang-P` is vLLM's
preset P on that base (every one but spec-decode: the family has no drafts). An engine
that follows SGLang's family only (`--engine sglang`) runs those by default; one that
follows both (the reference) compares both families in one picture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.errors import SimulationInputError
from schedspec.spec import ConfigError, Family, SchedulerConfig

Fields = dict[str, object]


@dataclass(frozen=True)
class NamedConfig:
    name: str
    config: SchedulerConfig


def base_fields(cost_model: CostModel, common: Fields) -> Fields:
    """The base config with `common` (--set) applied; the KV pool is sized from
    the cost model only when --set does not give num_blocks."""
    block_size = common.get("block_size", 16)
    fields: Fields = {
        "block_size": 16,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "max_model_len": 4096,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "enable_prefix_caching": True,
        "watermark": 0.01,
        "policy": "fcfs",
        "num_speculative_tokens": 0,
        **common,
    }
    if "num_blocks" not in common:
        valid = isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 1
        # A bad block_size is left for SchedulerConfig to name; any count will do then.
        fields["num_blocks"] = cost_model.default_num_blocks(block_size) if valid else 1  # type: ignore[arg-type]
    return fields


# Each preset maps the base fields to the changed ones.
PRESETS: dict[str, Callable[[Fields], Fields]] = {
    "chunked": lambda base: {},
    # Without chunking a prompt runs whole, so the budget must hold the longest.
    "no-chunking": lambda base: {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": base["max_model_len"],
    },
    "chunked-512": lambda base: {"max_num_batched_tokens": 512},
    "no-prefix-cache": lambda base: {"enable_prefix_caching": False},
    "spec-decode": lambda base: {"num_speculative_tokens": 2},
    # A quarter of a 24 GB card's worth of KV: admissions wait and decodes preempt.
    "small-kv": lambda base: {"num_blocks": _blocks_of(SMALL_KV_TOKENS, base)},
}
# 512 blocks of 16 tokens.
SMALL_KV_TOKENS = 8192
COMPARE_PRESETS = (
    "no-chunking",
    "chunked",
    "chunked-512",
    "no-prefix-cache",
    "spec-decode",
    "small-kv",
)
EXPERIMENT_PRESETS = ("no-chunking", "chunked-512")

# SGLang's family: its base, and vLLM's presets on it ("sglang-" + the preset's name).
SGLANG: Family = "sglang"
SGLANG_PAGE_SIZE = 1  # SGLang's default page_size
# The presets whose changes are knobs of vLLM's family only.
VLLM_ONLY_PRESETS = ("spec-decode",)
SGLANG_COMPARE_PRESETS = (
    "sglang-no-chunking",
    SGLANG,
    "sglang-chunked-512",
    "sglang-no-prefix-cache",
    "sglang-small-kv",
)
SGLANG_EXPERIMENT_PRESETS = ("sglang-no-chunking", "sglang-chunked-512")
# What --compare adds for an engine that follows both families: SGLang's policy on the
# base deployment and on the small KV cache, next to vLLM's.
CROSS_FAMILY_PRESETS = (SGLANG, "sglang-small-kv")


def _knobs_sglang_leaves_at_default() -> tuple[tuple[str, object], ...]:
    """vLLM's knobs with their defaults: the fields an SGLang-family config does not
    count as its own (SchedulerConfig.own_fields), the family itself aside."""
    smallest = SchedulerConfig(
        family=SGLANG,
        block_size=1,
        num_blocks=8,
        max_num_batched_tokens=8,
        max_num_seqs=1,
        max_model_len=8,
    )
    own = smallest.own_fields()
    return tuple(
        (f.name, f.default) for f in dataclasses.fields(SchedulerConfig) if f.name not in own
    )


VLLM_ONLY_KNOBS = _knobs_sglang_leaves_at_default()


def _blocks_of(tokens: int, base: Fields) -> object:
    """`tokens` of KV in the base's blocks (a bad block_size is left for
    SchedulerConfig to name)."""
    block_size = base.get("block_size")
    if isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 1:
        return max(1, tokens // block_size)
    return tokens


def sglang_base(base: Fields, common: Fields) -> Fields:
    """The base deployment in SGLang's family (module docstring): `base` is the vLLM
    one, `common` what --set gives every config (a page size among it)."""
    fields: Fields = {**base, "family": SGLANG, "block_size": SGLANG_PAGE_SIZE}
    for name, default in VLLM_ONLY_KNOBS:
        fields[name] = default
    fields.update(common)
    tokens = base["num_blocks"]
    if isinstance(tokens, int) and isinstance(base["block_size"], int):
        fields["num_blocks"] = _blocks_of(tokens * base["block_size"], fields)
    return fields


def preset_fields(name: str, base: Fields, common: Fields) -> Fields | None:
    """The fields of preset `name` (None: not a preset)."""
    if name == SGLANG or name.startswith(SGLANG + "-"):
        preset = name.removeprefix(SGLANG).removeprefix("-") or "chunked"
        if preset not in PRESETS or preset in VLLM_ONLY_PRESETS:
            return None
        family_base = sglang_base(base, common)
        return {**family_base, **PRESETS[preset](family_base)}
    if name not in PRESETS:
        return None
    return {**base, **PRESETS[name](base)}


def default_presets(compare: bool, experiment: bool, families: Sequence[Family]) -> list[str]:
    """The presets run without --config, for an engine that follows `families`."""
    if "vllm" not in families:
        if experiment:
            return list(SGLANG_EXPERIMENT_PRESETS)
        return list(SGLANG_COMPARE_PRESETS) if compare else [SGLANG]
    if experiment:
        return list(EXPERIMENT_PRESETS)
    if not compare:
        return ["chunked"]
    return [*COMPARE_PRESETS, *(CROSS_FAMILY_PRESETS if SGLANG in families else ())]


CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(SchedulerConfig))


def _value(text: str) -> object:
    """A flag's value: true/false, an int, a float, else the text itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_assignments(text: str, flag: str) -> Fields:
    """`field=value,field=value` -> fields; errors name the flag and the field."""
    fields: Fields = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise SimulationInputError(flag, f"expected field=value, got {part!r}")
        fields[name] = _value(value.strip())
    return fields


def build_config(name: str, fields: Fields) -> NamedConfig:
    """Validate against SchedulerConfig; an error names the config and the field."""
    for field in fields:
        if field not in CONFIG_FIELDS:
            raise SimulationInputError(
                field, f"config {name!r}: unknown field; known: {', '.join(CONFIG_FIELDS)}"
            )
    try:
        return NamedConfig(name, SchedulerConfig(**fields))  # type: ignore[arg-type]
    except ConfigError as err:
        raise SimulationInputError(err.field, f"config {name!r}: {err}") from None


def resolve_configs(
    specs: Iterable[str],
    compare: bool,
    experiment: bool,
    common: Fields,
    cost_model: CostModel,
    families: Sequence[Family] = ("vllm",),
) -> list[NamedConfig]:
    """The configs to run: --config specs, else the compare or experiment presets of
    the engine's `families` (default_presets), else the base alone; `common` (from
    --set) applies to every one."""
    base = base_fields(cost_model, common)
    chosen = list(specs) or default_presets(compare, experiment, families)
    configs = []
    for spec in chosen:
        name, _, assignments = spec.partition(":")
        name = name.strip()
        if not name:
            raise SimulationInputError("config", f"expected NAME[:field=value,...], got {spec!r}")
        fields = preset_fields(name, base, common) or dict(base)
        fields.update(parse_assignments(assignments, "config"))
        configs.append(build_config(name, fields))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise SimulationInputError("config", f"config names must be distinct, got {names}")
    return configs
