"""Memory of a long campaign: `schedspec check --long` on one worker, its resident set sampled.

Runs the command as a user does (a fresh interpreter, `python -m schedspec check --long
--examples N --seed S --progress`), reads its VmRSS from /proc every --every seconds and
the example count from its progress lines, and prints one row per sample (seconds,
examples so far, RSS in MB), then the peak, the wall time and the verdict. Hypothesis
keeps a record of every example a run tried (about 0.23 MB per long example); the suite
runs the examples in chunks (suite.MAX_CHUNK_EXAMPLES), so the RSS should rise over the
first chunk and then stay flat. Linux only (/proc). The numbers are for reading.

    .venv/bin/python benchmarks/bench_long_memory.py                    # 20000 examples
    .venv/bin/python benchmarks/bench_long_memory.py --examples 5000    # a prefix
    .venv/bin/python benchmarks/bench_long_memory.py --configs MODULE:STRATEGY   # other configs
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

PROGRESS = re.compile(r": (\d+) examples, (\d+) steps")


def rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, flags=re.MULTILINE)
    return int(match.group(1)) / 1024 if match else None


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
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "PYTHONPATH": str(repo)}
    command = [
        sys.executable, "-m", "schedspec", "check", "--long", "--examples", str(args.examples),
        "--seed", str(args.seed), "--progress", "--trace-dir", "/tmp",
    ]  # fmt: skip
    if args.configs is not None:
        command += ["--configs", args.configs]
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
    print(f"{'seconds':>8} {'examples':>9} {'RSS MB':>8}")
    while process.poll() is None:
        resident = rss_mb(process.pid)
        if resident is not None:
            peak = max(peak, resident)
            print(f"{time.monotonic() - started:8.0f} {examples[0]:9d} {resident:8.1f}", flush=True)
        time.sleep(args.every)
    assert process.stdout is not None
    verdict = process.stdout.read().strip().splitlines()[-2:]
    wall = time.monotonic() - started
    # The kernel's own high-water mark of the child (ru_maxrss is in KB on Linux).
    high_water = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS {high_water:.1f} MB (the highest sample: {peak:.1f} MB); wall {wall:.0f} s")
    print(f"exit {process.returncode}:", *verdict, sep="\n  ")


if __name__ == "__main__":
    main()
