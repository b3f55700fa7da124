"""Memory of a long campaign: `schedspec check --long`, the resident set of each process sampled.

Runs the command as a user does (a fresh interpreter, `python -m schedspec check --long
--examples N --seed S --progress`), reads its VmRSS from /proc every --every seconds and
the example count from its progress lines, and prints one row per sample (seconds,
examples so far, RSS in MB), then the peak, the wall time and the verdict. Hypothesis
keeps a record of every example a run tried (about 0.23 MB per long example); the suite
runs the examples in chunks (suite.MAX_CHUNK_EXAMPLES), each a series of Hypothesis runs
of suite.EXAMPLES_PER_BURST, so the RSS should rise over the first runs and then stay
flat. Linux only (/proc). The numbers are for reading.

With --ray (a local Ray cluster, the ray extra) or --workers N, the chunks run in
workers: each row then also has the largest and the smallest RSS among the worker
processes running chunks at that moment (Ray's, which Ray reuses for up to
ray_workers.CHUNKS_PER_WORKER_PROCESS chunks; forked ones: a fresh process per chunk),
beside the driver's, and the RSS of each of those workers by process id. At the end it
prints whether the workers' memory stayed flat: the peak and the floor of the worker
samples over the first quarter of the samples and over the last quarter, and the ratio
last/first of each (1.00: flat).

    .venv/bin/python benchmarks/bench_long_memory.py                    # 20000 examples
    .venv/bin/python benchmarks/bench_long_memory.py --examples 5000    # a prefix
    .venv/bin/python benchmarks/bench_long_memory.py --configs MODULE:STRATEGY   # other configs
    .venv/bin/python benchmarks/bench_long_memory.py --ray --workers 2  # on a local Ray
    .venv/bin/python benchmarks/bench_long_memory.py --ray --workers 2 --duration 7d  # a campaign
    .venv/bin/python benchmarks/bench_long_memory.py --quick --examples 2000  # the CI profile
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

from schedspec.campaign.ray_reaper import process_table

PROGRESS = re.compile(r": (\d+) examples, (\d+) steps")


def rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, flags=re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for child, entry in process_table().items():
        children.setdefault(entry.parent, []).append(child)
    found: list[int] = []
    waiting = [pid]
    while waiting:
        parent = waiting.pop()
        for child in children.get(parent, []):
            found.append(child)
            waiting.append(child)
    return found


# The process title of a Ray worker while it runs a chunk (ray_workers._run_chunk); its
# agents, actors (the progress inbox) and idle workers have others.
RAY_CHUNK_TITLE = "ray::_run_chunk"


def workers_of(pid: int, on_ray: bool) -> list[int]:
    """The worker processes of the run running chunks: Ray's, or the forked ones."""
    found = []
    for child in descendants(pid):
        try:
            name = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if not on_ray or name.startswith(RAY_CHUNK_TITLE):
            found.append(child)
    return found


def quarters(samples: list[list[float]]) -> tuple[list[float], list[float]]:
    """The worker RSS samples of the first quarter of the rows and of the last quarter
    (at least one row each), rows with no worker running left out."""
    rows = [row for row in samples if row]
    if not rows:
        return [], []
    size = max(1, len(rows) // 4)
    return [m for row in rows[:size] for m in row], [m for row in rows[-size:] for m in row]


def flatness(samples: list[list[float]]) -> list[str]:
    """Lines saying how the workers' peak and floor moved from the first quarter of the
    run to the last: the ratio last/first of each."""
    first, last = quarters(samples)
    if not first:
        return ["no worker sampled"]
    lines = []
    for name, pick in (("peak", max), ("floor", min)):
        before, after = pick(first), pick(last)
        lines.append(
            f"worker {name}: {before:.1f} MB in the first quarter, {after:.1f} MB in the "
            f"last; last/first {after / before:.2f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument(
        "--configs",
        default=None,
        help="check's --configs (module:strategy)",
    )
    parser.add_argument("--workers", type=int, default=None, help="check's --workers")
    parser.add_argument(
        "--duration",
        default=None,
        help="check's --duration: a campaign (chunks of 200), capped by --examples",
    )
    parser.add_argument("--ray", action="store_true", help="on a local Ray cluster (--ray)")
    parser.add_argument(
        "--quick", action="store_true", help="the CI profile (40 actions an example), not --long"
    )
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "PYTHONPATH": str(repo)}
    command = [
        sys.executable, "-m", "schedspec", "check", "--examples", str(args.examples),
        "--seed", str(args.seed), "--progress", "--trace-dir", "/tmp",
    ]  # fmt: skip
    if not args.quick:
        command += ["--long"]
    if args.configs is not None:
        command += ["--configs", args.configs]
    if args.workers is not None:
        command += ["--workers", str(args.workers)]
    if args.ray:
        command += ["--ray"]
    if args.duration is not None:
        command += ["--duration", args.duration]
    sampled_workers = args.ray or (args.workers or 1) > 1
    print("$", " ".join(command[1:]), flush=True)
    started = time.monotonic()
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    examples = [0]

    def follow_progress() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            found = PROGRESS.search(line)
            if found:
                examples[0] = int(found.group(1))

    threading.Thread(target=follow_progress, daemon=True).start()
    peak = 0.0
    worker_peak = 0.0
    worker_samples: list[list[float]] = []  # per row, each running worker's RSS
    columns = f"{'seconds':>8} {'examples':>9} {'RSS MB':>8}"
    print(
        columns
        + (
            f" {'worker max':>10} {'worker min':>10} {'workers':>7}  pid:MB of each"
            if sampled_workers
            else ""
        )
    )
    while process.poll() is None:
        resident = rss_mb(process.pid)
        if resident is not None:
            peak = max(peak, resident)
            row = f"{time.monotonic() - started:8.0f} {examples[0]:9d} {resident:8.1f}"
            if sampled_workers:
                by_pid = {pid: rss_mb(pid) for pid in workers_of(process.pid, args.ray)}
                sizes = {pid: m for pid, m in by_pid.items() if m}
                worker_samples.append(list(sizes.values()))
                worker_peak = max([worker_peak, *sizes.values()])
                low, high = (min(sizes.values()), max(sizes.values())) if sizes else (0.0, 0.0)
                row += f" {high:10.1f} {low:10.1f} {len(sizes):7d}  "
                row += " ".join(f"{pid}:{m:.0f}" for pid, m in sorted(sizes.items()))
            print(row, flush=True)
        time.sleep(args.every)
    assert process.stdout is not None
    verdict = process.stdout.read().strip().splitlines()[-2:]
    wall = time.monotonic() - started
    # The kernel's own high-water mark of the child (ru_maxrss is in KB on Linux).
    high_water = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS {high_water:.1f} MB (the highest sample: {peak:.1f} MB); wall {wall:.0f} s")
    if sampled_workers:
        print(f"the largest worker sample: {worker_peak:.1f} MB")
        print(*flatness(worker_samples), sep="\n")
    print(f"exit {process.returncode}:", *verdict, sep="\n  ")


if __name__ == "__main__":
    main()
