"""Shared set-ups of the gpu_impl tests."""

from __future__ import annotations

from schedspec.gpu_impl.swarm_workload import WorkloadShape
from schedspec.spec import SchedulerConfig


def busy_swarm(policy: str) -> tuple[SchedulerConfig, WorkloadShape]:
    """A tight, busy swarm (caching, drafts, a watermark): it reaches preemption."""
    config = SchedulerConfig(
        block_size=4,
        num_blocks=24,
        max_num_batched_tokens=48,
        max_num_seqs=6,
        max_model_len=64,
        long_prefill_token_threshold=16,
        enable_prefix_caching=True,
        watermark=0.1,
        num_speculative_tokens=2,
        policy=policy,  # type: ignore[arg-type]
    )
    return config, WorkloadShape(add_chance=700)
