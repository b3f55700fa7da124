"""Simulation: what a scheduling policy does to latency, measured and drawn.

An engine (the reference by default, any adapter otherwise) runs a timed
workload (workloads.py, trace_file.py) under a step-time cost model
(cost_model.py); simulator.py keeps the clock and each request's timeline,
metrics.py turns them into TTFT/TPOT/E2E percentiles, plots.py into
pictures, experiment.py into the chunked-prefill trade-off; runs.py runs the
configs of `schedspec simulate` (cli/simulate.py) on an engine.
"""
