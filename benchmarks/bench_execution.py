"""Throughput of the paged runner against the dense baseline, on one workload, in one run.

Both generate the same requests with the same tiny model: the paged runner
as a scheduler batches them (the reference scheduler: chunked prefill, a
token budget, paged KV), the dense baseline one request at a time with a
contiguous KV cache. Output tokens per second of each, and their ratio, are
measured here in one process; the paged run's outputs are also compared with
the dense ones, so a fast wrong run cannot pass unnoticed.

Two paged timings: end to end (schedule + execute + update, what a user
waits for) and the runner alone (execute_model only).

    .venv/bin/python benchmarks/bench_execution.py                 # CPU, float64
    .venv/bin/python benchmarks/bench_execution.py --quick         # smoke run (seconds)
    .venv/bin/python benchmarks/bench_execution.py --device cuda   # a GPU, when one is present

The numbers are for reading, never for asserting: nothing here checks a time.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.execution import (
    Arrival,
    PagedModelRunner,
    TinyModel,
    TinyModelConfig,
    compare_outputs,
    dense_outputs,
    execute_run,
)
from schedspec.reference import Scheduler
from schedspec.spec import ModelRunnerOutput, Request, SchedulerConfig, SchedulerOutput


@dataclass(frozen=True)
class Timed:
    seconds: float
    runner_seconds: float  # execute_model alone (the paged run only)
    outputs: dict[str, list[int]]

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.outputs.values())


def workload(num_requests: int, prompt_len: int, max_tokens: int, vocab: int) -> list[Request]:
    rng = random.Random(0)
    return [
        Request(
            f"r{i}",
            [rng.randrange(vocab) for _ in range(rng.randint(prompt_len // 2, prompt_len))],
            max_tokens,
        )
        for i in range(num_requests)
    ]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class TimedRunner(PagedModelRunner):
    """Adds up the wall time of execute_model (synchronized on CUDA)."""

    elapsed = 0.0

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        start = time.perf_counter()
        out = super().execute_model(scheduler_output)
        sync(self.model.device)
        self.elapsed += time.perf_counter() - start
        return out


def time_paged(
    model: TinyModel, config: SchedulerConfig, requests: Callable[[], list[Request]]
) -> Timed:
    runner = TimedRunner(model, config)
    arrivals = [Arrival(1, r) for r in requests()]
    sync(model.device)
    start = time.perf_counter()
    run = execute_run(Scheduler(config), arrivals, runner)
    sync(model.device)
    return Timed(time.perf_counter() - start, runner.elapsed, run.outputs)


def time_dense(
    model: TinyModel, config: SchedulerConfig, requests: Callable[[], list[Request]]
) -> Timed:
    sync(model.device)
    start = time.perf_counter()
    outputs = dense_outputs(model, requests(), config.max_model_len)
    sync(model.device)
    seconds = time.perf_counter() - start
    return Timed(seconds, seconds, outputs)


# (name, longest prompt, outputs per request): serving is mostly decode; a
# prefill-heavy mix shows where batching buys little on a compute-bound CPU.
SHAPES = (("decode-heavy", 64, 128), ("prefill-heavy", 256, 16))


def bench_shape(
    args: argparse.Namespace, model: TinyModel, prompt_len: int, max_tokens: int
) -> tuple[float, float, float, int, int]:
    """(dense s, paged end-to-end s, paged runner s, output tokens, requests differing)."""
    max_model_len = prompt_len + max_tokens
    block_size = 16
    config = SchedulerConfig(
        block_size=block_size,
        num_blocks=args.requests * -(-max_model_len // block_size),  # no preemption
        max_num_batched_tokens=max(args.budget, args.requests),
        max_num_seqs=args.requests,
        max_model_len=max_model_len,
        long_prefill_token_threshold=min(256, max_model_len),
    )
    vocab = model.config.vocab_size

    def requests() -> list[Request]:
        return workload(args.requests, prompt_len, max_tokens, vocab)

    paged = time_paged(model, config, requests)
    dense = time_dense(model, config, requests)
    differ = len(compare_outputs(paged.outputs, dense.outputs))
    return dense.seconds, paged.seconds, paged.runner_seconds, dense.num_tokens, differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Paged runner vs dense baseline, tokens/s.")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--budget", type=int, default=1024, help="max_num_batched_tokens")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--quick", action="store_true", help="8 requests, shapes quartered")
    args = parser.parse_args(argv)
    scale = 4 if args.quick else 1
    if args.quick:
        args.requests = 8
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    model_config = TinyModelConfig(
        hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads
    )
    model = TinyModel(model_config, device=device, dtype=dtype)
    warm = SchedulerConfig(
        block_size=16, num_blocks=8, max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64
    )
    time_paged(model, warm, lambda: workload(2, 32, 4, model_config.vocab_size))  # CUDA init
    time_dense(model, warm, lambda: workload(2, 32, 4, model_config.vocab_size))
    print(f"python {platform.python_version()}, torch {torch.__version__}, {device}, {dtype}")
    print(
        f"model: {args.layers} layers, {args.heads} heads, hidden {args.hidden}, "
        f"vocab {model_config.vocab_size}; {args.requests} requests per workload, "
        f"budget {max(args.budget, args.requests)} tokens, prompts of len/2..len tokens"
    )
    print(
        f"{'workload':28s} {'dense tok/s':>12s} {'paged e2e':>10s} {'runner':>10s} "
        f"{'e2e x':>6s} {'runner x':>8s} {'differ':>6s}"
    )
    failed = False
    for name, prompt_len, max_tokens in SHAPES:
        prompt_len, max_tokens = prompt_len // scale, max_tokens // scale
        dense_s, paged_s, runner_s, tokens, differ = bench_shape(
            args, model, prompt_len, max_tokens
        )
        failed |= differ > 0
        label = f"{name} ({prompt_len}+{max_tokens})"
        print(
            f"{label:28s} {tokens / dense_s:12.1f} {tokens / paged_s:10.1f} "
            f"{tokens / runner_s:10.1f} {dense_s / paged_s:6.2f} {dense_s / runner_s:8.2f} "
            f"{differ:6d}"
        )
    print("x = paged tokens/s over dense tokens/s, measured in this run; differ = requests")
    print("whose paged outputs differ from the dense run (must be 0)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
