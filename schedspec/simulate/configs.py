"""The scheduler configs a simulation compares, named.

The base config is a vLLM-like deployment of the cost model's GPU: chunked
prefill with a 2048-token budget, prefix caching on, 128 sequences, 4096
tokens per request, and as many KV blocks as the memory left by the weights
holds (CostModel.default_num_blocks). A preset changes a few fields of it;
`--config NAME:field=value,...` starts from the preset NAME if there is one,
else from the base, and `--set field=value` changes every config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.errors import SimulationInputError
from schedspec.spec import ConfigError, SchedulerConfig

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
    "small-kv": lambda base: {"num_blocks": 512},
}
COMPARE_PRESETS = (
    "no-chunking",
    "chunked",
    "chunked-512",
    "no-prefix-cache",
    "spec-decode",
    "small-kv",
)
EXPERIMENT_PRESETS = ("no-chunking", "chunked-512")

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
    specs: Iterable[str], compare: bool, experiment: bool, common: Fields, cost_model: CostModel
) -> list[NamedConfig]:
    """The configs to run: --config specs, else the compare or experiment presets,
    else the base alone; `common` (from --set) applies to every one."""
    base = base_fields(cost_model, common)
    chosen = list(specs)
    if not chosen:
        chosen = list(
            EXPERIMENT_PRESETS if experiment else COMPARE_PRESETS if compare else ["chunked"]
        )
    configs = []
    for spec in chosen:
        name, _, assignments = spec.partition(":")
        name = name.strip()
        if not name:
            raise SimulationInputError("config", f"expected NAME[:field=value,...], got {spec!r}")
        fields = dict(base)
        if name in PRESETS:
            fields.update(PRESETS[name](base))
        fields.update(parse_assignments(assignments, "config"))
        configs.append(build_config(name, fields))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise SimulationInputError("config", f"config names must be distinct, got {names}")
    return configs
