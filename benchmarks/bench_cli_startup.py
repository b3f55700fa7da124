"""How long `schedspec --help` takes: the median wall time of several fresh processes,
beside a bare `python -c pass` measured in the same run, and their ratio.

`--help` lists every command with one line each; it must not import the commands (and
with them Hypothesis, z3, torch) to print that line (issue 32 asks for under 0.3 s).
The interpreter's own start is the floor, which is why the bare start is measured too:
the ratio tells what schedspec adds on this machine, whatever its speed.

    .venv/bin/python benchmarks/bench_cli_startup.py             # 15 runs of each
    .venv/bin/python benchmarks/bench_cli_startup.py --runs 31

The numbers are for reading, never for asserting: nothing here checks a time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "schedspec --help": [sys.executable, "-m", "schedspec", "--help"],
    "schedspec --version": [sys.executable, "-m", "schedspec", "--version"],
}


def wall_seconds(argv: Sequence[str]) -> float:
    """One fresh process's wall time, its output discarded; a failure is an error."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def medians(runs: int) -> dict[str, float]:
    """Each command's median over `runs`, the commands interleaved so that a burst of load
    on a shared machine falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for argv in COMMANDS.values():  # warm the file cache before measuring
        wall_seconds(argv)
    for _ in range(runs):
        for name, argv in COMMANDS.items():
            times[name].append(wall_seconds(argv))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="processes per command")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    result = medians(args.runs)
    bare = result["python -c pass"]
    print(f"{sys.executable}, median of {args.runs} runs each")
    print(f"{'command':<22} {'median s':>9} {'x bare python':>14}")
    for name, seconds in result.items():
        print(f"{name:<22} {seconds:>9.3f} {seconds / bare:>14.2f}")


if __name__ == "__main__":
    main()
