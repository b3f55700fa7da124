"""How long one engine iteration takes: a roofline of the work the scheduler chose.

The scheduler decides how many prefill and decode tokens run in a step and
therefore how much KV each request's attention reads. The step time is

    step_overhead_s
    + max(weight_bytes / hbm_bandwidth,                        # read every weight once
          (prefill_tokens + decode_tokens) * flops_per_token / peak_flops)   # matmuls
    + kv_tokens_read * kv_bytes_per_token / hbm_bandwidth      # attention reads the KV

The first term is the floor of any step: a decode batch is memory bound and
costs at least one pass over the weights; a big prefill is compute bound.
Attention's own FLOPs and everything below the roofline (kernel launches,
sampling, the CPU side) are left out, so this is a lower bound: set
step_overhead_s or lower peak_flops to fit a measured engine.

step_overhead_s is the CPU's share of a step (scheduling, preparing inputs). A
synchronous engine pays it before every step; under async scheduling the CPU
prepares the next step while the GPU runs this one, so a step takes the longer
of the two rather than their sum (overlapped=True).

Defaults: Llama-2-7B in bf16 on one NVIDIA H100 SXM 80 GB.
- Llama-2-7B: 6.74e9 parameters (Touvron et al. 2023, table 1), 32 layers,
  hidden size 4096, 32 KV heads (no grouped-query attention). Weights:
  6.74e9 * 2 bytes = 13.48 GB; a forward pass: 2 FLOPs per parameter per
  token = 13.48 GFLOP; KV per token: 2 (K and V) * 32 layers * 4096 * 2 bytes
  = 524,288 bytes.
- H100 SXM (NVIDIA H100 Tensor Core GPU datasheet): 3.35 TB/s HBM3,
  989 TFLOPS dense BF16 (the sheet's 1,979 is with 2:4 sparsity), 80 GB.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from schedspec.files import InputFileError, parse_json, read_input_text
from schedspec.simulate.errors import SimulationInputError
from schedspec.spec import named, shown
from schedspec.spec.config import MAX_NUM_BLOCKS

# A cost model is a handful of numbers; a file far larger is not one.
MAX_COST_JSON_BYTES = 2**20
LLAMA2_7B_PARAMS = 6.74e9
BF16_BYTES = 2


class CostModelError(SimulationInputError):
    """A cost-model field out of range; `field` names it."""


@dataclass(frozen=True)
class StepWork:
    """What the scheduler asked the model to do in one iteration."""

    prefill_tokens: int  # prompt chunks and recomputation after preemption
    decode_tokens: int  # one per decoding request, plus drafts to verify
    kv_tokens_read: int  # sum over scheduled requests of the context attention reads


@dataclass(frozen=True)
class CostModel:
    weight_bytes: float = LLAMA2_7B_PARAMS * BF16_BYTES
    flops_per_token: float = 2 * LLAMA2_7B_PARAMS
    kv_bytes_per_token: float = 2 * 32 * 4096 * BF16_BYTES
    hbm_bandwidth: float = 3.35e12  # bytes/s
    peak_flops: float = 989e12  # FLOP/s
    step_overhead_s: float = 0.0
    # For default_num_blocks: the KV cache gets what the weights leave of
    # this share of GPU memory (vLLM's gpu_memory_utilization defaults to 0.9).
    gpu_memory_bytes: float = 80e9
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise CostModelError(f.name, f"must be a number, got {shown(value)}")
            if not _is_finite(value):
                raise CostModelError(f.name, f"must be finite, got {shown(value)}")
            if f.name == "step_overhead_s":
                if value < 0:
                    raise CostModelError(f.name, f"must be >= 0, got {value}")
            elif value <= 0:
                raise CostModelError(f.name, f"must be > 0, got {value}")
        if self.gpu_memory_utilization > 1:
            raise CostModelError(
                "gpu_memory_utilization", f"must be <= 1, got {self.gpu_memory_utilization}"
            )
        # Each term of the roofline must be a finite time, or every step lasts forever.
        for numerator, denominator in (
            ("weight_bytes", "hbm_bandwidth"),
            ("flops_per_token", "peak_flops"),
            ("kv_bytes_per_token", "hbm_bandwidth"),
        ):
            seconds = getattr(self, numerator) / getattr(self, denominator)
            if not _is_finite(seconds):
                raise CostModelError(
                    numerator,
                    f"{numerator} / {denominator} is not a finite number of seconds "
                    f"({getattr(self, numerator):.3g} / {getattr(self, denominator):.3g})",
                )

    def step_time(self, work: StepWork, overlapped: bool = False) -> float:
        """Seconds one iteration takes (the formula in the module docstring); with the
        CPU's share overlapped with the GPU's (async scheduling), the longer of the two."""
        weights = self.weight_bytes / self.hbm_bandwidth
        compute = (work.prefill_tokens + work.decode_tokens) * self.flops_per_token
        attention = work.kv_tokens_read * self.kv_bytes_per_token / self.hbm_bandwidth
        gpu = max(weights, compute / self.peak_flops) + attention
        if overlapped:
            return max(self.step_overhead_s, gpu)
        return self.step_overhead_s + gpu

    def default_num_blocks(self, block_size: int) -> int:
        """KV blocks that fit in the memory the weights leave free."""
        free = self.gpu_memory_bytes * self.gpu_memory_utilization - self.weight_bytes
        if free <= 0:
            raise CostModelError(
                "weight_bytes",
                f"the weights ({self.weight_bytes:.3g} B) leave no KV memory in "
                f"gpu_memory_bytes * gpu_memory_utilization",
            )
        blocks = int(free // (self.kv_bytes_per_token * block_size))
        if blocks > MAX_NUM_BLOCKS:
            # More than a scheduler config may hold (for memory): the KV size is off.
            raise CostModelError(
                "kv_bytes_per_token",
                f"{self.kv_bytes_per_token:.3g} B leaves room for {blocks} KV blocks, over "
                f"{MAX_NUM_BLOCKS}; set num_blocks yourself (--set num_blocks=N)",
            )
        return max(1, blocks)

    def with_fields(self, fields: dict[str, object], where: str) -> CostModel:
        """A copy with these fields replaced; unknown names are an error naming `where`."""
        known = {f.name for f in dataclasses.fields(self)}
        for name in fields:
            if name not in known:
                raise CostModelError(
                    named(name),
                    f"{where}: unknown cost-model field; known: {', '.join(sorted(known))}",
                )
        try:
            return dataclasses.replace(self, **fields)  # type: ignore[arg-type]
        except CostModelError as err:
            raise CostModelError(err.field, f"{where}: {err.detail}") from None

    @classmethod
    def from_json(cls, path: Path) -> CostModel:
        """The defaults with the fields of a JSON object file (UTF-8, at most
        MAX_COST_JSON_BYTES) replaced."""
        try:
            document = parse_json(read_input_text(path, MAX_COST_JSON_BYTES), str(path))
        except InputFileError as err:
            raise CostModelError("cost_json", str(err)) from None
        if not isinstance(document, dict):
            raise CostModelError("cost_json", f"{path}: expected a JSON object of fields")
        return cls().with_fields(document, str(path))

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def _is_finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond a float's range
        return False
