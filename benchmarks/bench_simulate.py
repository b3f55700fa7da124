"""How fast `schedspec simulate` runs: simulated requests per wall-clock second.

A 10,000-request trace (the built-in mixed workload's shape: Poisson arrivals
at 20/s, lognormal prompts and outputs, half the requests behind one of four
shared system prompts) is written as JSONL, loaded back through the trace
loader, and run through the reference scheduler with the default cost model
(Llama-2-7B on one H100), then summarized. Every phase is timed in this one
run (wall clock, and this process's CPU time); the figures to read are
requests/s, iterations/s and how much faster than real time the simulated
clock runs.

    .venv/bin/python benchmarks/bench_simulate.py            # 10,000 requests
    .venv/bin/python benchmarks/bench_simulate.py --quick    # 1,000 (seconds)

The numbers are for reading, never for asserting: nothing here checks a time.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from schedspec.engines.registry import ENGINE_FORMS, load_engine_factory
from schedspec.simulate.configs import resolve_configs
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.metrics import request_metrics, summarize
from schedspec.simulate.simulator import simulate
from schedspec.simulate.trace_file import load_trace, write_trace
from schedspec.simulate.workloads import SyntheticWorkload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 requests instead of 10,000")
    parser.add_argument("--engine", default="reference", help=ENGINE_FORMS)
    parser.add_argument("--config", default="chunked", help="a preset or NAME:field=value,...")
    args = parser.parse_args()
    num_requests = 1_000 if args.quick else 10_000

    cost = CostModel()
    (named,) = resolve_configs([args.config], False, False, {}, cost)
    factory = load_engine_factory(args.engine)
    workload = SyntheticWorkload(num_requests=num_requests)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.jsonl"
        write_trace(path, workload.generate(0, named.config.max_model_len))
        started, cpu_started = time.perf_counter(), time.process_time()
        requests = load_trace(path, seed=0, max_model_len=named.config.max_model_len)
        loaded = time.perf_counter()
    result = simulate(named.name, factory, named.config, requests, cost, 0, 10**8)
    simulated = time.perf_counter()
    summary = summarize(result, [request_metrics(t) for t in result.requests.values()])
    summarized, cpu = time.perf_counter(), time.process_time() - cpu_started

    load_s, sim_s, sum_s = loaded - started, simulated - loaded, summarized - simulated
    total = summarized - started
    clock = result.steps[-1].start + result.steps[-1].duration
    print(f"python {platform.python_version()} on {platform.machine()}, engine {args.engine}")
    print(
        f"trace: {num_requests} requests, "
        f"{sum(len(r.prompt_token_ids) for r in requests)} prompt tokens, "
        f"config {named.name} ({named.config.num_blocks} KV blocks)"
    )
    print(f"load JSONL       {load_s:7.2f} s")
    print(f"simulate         {sim_s:7.2f} s  ({len(result.steps)} iterations)")
    print(f"metrics          {sum_s:7.2f} s")
    # CPU time too: on a shared machine the wall clock also counts other processes.
    print(f"CPU time (this process)  {cpu:7.2f} s of {total:.2f} s wall")
    print(f"simulated requests per CPU second:  {num_requests / cpu:,.0f} end to end")
    print(f"simulated requests per wall second: {num_requests / total:,.0f} end to end")
    print(f"                                    {num_requests / sim_s:,.0f} simulation alone")
    print(f"iterations per wall second:         {len(result.steps) / sim_s:,.0f}")
    print(f"simulated clock / wall clock:       {clock / total:.1f}x ({clock:.0f} s simulated)")
    print(
        f"(TTFT p50 {summary.ttft_s.p50 and summary.ttft_s.p50 * 1000:.1f} ms, "
        f"{summary.output_tokens_per_s:.0f} output tokens/s simulated)"
    )


if __name__ == "__main__":
    main()
