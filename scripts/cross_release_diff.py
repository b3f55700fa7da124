"""What changed in vLLM's scheduler between two releases? Diff them step by step.

    NEW_VENV/bin/python scripts/cross_release_diff.py --other-python OLD_VENV/bin/python \
        [--seeds 1-10] [--examples 100] [--out DIR]

Each venv has its release installed (scripts/install_vllm.sh --version X VENV). The
release of the Python running this script is the left engine, in this process; the
other is the right, in its own interpreter (engines/remote/). Both run under the safety
profile (each release holds it whatever it decides), on three families of configs from
properties/strategies/engine_configs.py:

- neutral: the knobs describe both releases (Release.mismatch is None for each), so a
  difference is one no knob states: a regression, or a rule the spec lacks;
- long-prefill: chunked prefill off with a cap, where the long-prefill rules part;
- cache-aware: a cache-aware window acting, where 0.34.0 reorders admission.

Each divergence is shrunk and written as a trace (OUT/FAMILY/seed-S/), then judged: the
reference replays it under each release's knob values (Release.knobs) in lockstep with
that release, in its own interpreter (`schedspec diff-replay --left reference --right
vllm --profile vllm-v1 --compare-block-ids`). When both agree at every step, the knobs
explain the difference; when either parts, it is unexplained, and the table says so.
Exit status 0 when every difference is explained (and the neutral family found none),
1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from schedspec.adapters.vllm.releases import Release, release_of
from schedspec.traces.trace import Trace

CONFIGS = "schedspec.properties.strategies.engine_configs"
FAMILIES = {
    "neutral": f"{CONFIGS}:vllm_release_neutral_configs",
    "long-prefill": f"{CONFIGS}:vllm_long_prefill_rule_configs",
    "cache-aware": f"{CONFIGS}:vllm_cache_aware_configs",
}
RELEASE_OF = "from schedspec.adapters.vllm import releases; print(releases.installed_version())"
DIVERGED = re.compile(r"FAILED: the engines diverged on (\S+)")
STEPS = re.compile(r"steps checked: (\d+)")
EXIT_PASSED, EXIT_DIVERGED = 0, 3


@dataclass(frozen=True)
class Difference:
    family: str
    seed: int
    field: str  # what diverged first: num_scheduled_tokens, a state field, ...
    trace: Path
    events: int
    explained: bool  # the reference, under each release's knobs, agrees with each


def release_in(python: str) -> Release:
    """The vLLM release installed beside `python` (its venv)."""
    done = subprocess.run([python, "-c", RELEASE_OF], capture_output=True, text=True, check=True)
    return release_of(done.stdout.strip())


def schedspec_of(python: str) -> str:
    """The schedspec command of the venv `python` lives in."""
    return str(Path(python).with_name("schedspec"))


def diff_family(
    family: str, seed: int, other: str, examples: int, out: Path
) -> tuple[int, str, Path | None]:
    """One `schedspec diff` of this release (left) and the other's (right) on a family's
    configs: its exit status, its output, and the trace written on a divergence."""
    trace_dir = out / family / f"seed-{seed}"
    command = [
        schedspec_of(sys.executable),
        "diff",
        "--left",
        "vllm",
        "--right",
        "vllm",
        "--right-python",
        other,
        "--profile",
        "safety",
        "--compare-block-ids",
        "--configs",
        FAMILIES[family],
        "--seed",
        str(seed),
        "--examples",
        str(examples),
        "--trace-dir",
        str(trace_dir),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (EXIT_PASSED, EXIT_DIVERGED):
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    traces = sorted(trace_dir.glob("schedspec-diff-*.json"))
    return done.returncode, done.stdout, traces[-1] if traces else None


def agrees_under_knobs(trace: Trace, release: Release, python: str, scratch: Path) -> bool:
    """Whether the reference, with the release's knob values, agrees with that release
    at every step of the trace (and both hold vllm-v1)."""
    path = scratch / f"as-{release.version}.json"
    replace(trace, config=release.knobs(trace.config)).save(path)
    command = [
        schedspec_of(python),
        "diff-replay",
        str(path),
        "--left",
        "reference",
        "--right",
        "vllm",
        "--profile",
        "vllm-v1",
        "--compare-block-ids",
    ]
    return subprocess.run(command, capture_output=True, text=True, check=False).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other-python", required=True, help="the other release's venv python")
    parser.add_argument("--seeds", default="1-10", help="a range, e.g. 1-10 [default: 1-10]")
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--out", type=Path, default=Path("cross-release-out"))
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last or first) + 1)
    here, other = release_in(sys.executable), release_in(args.other_python)
    print(f"left: vLLM {here.version} (here); right: vLLM {other.version} ({args.other_python})")
    differences: list[Difference] = []
    agreed = steps = 0
    for family in args.families.split(","):
        for seed in seeds:
            status, output, trace_path = diff_family(
                family, seed, args.other_python, args.examples, args.out
            )
            counted = STEPS.search(output)
            run_steps = int(counted.group(1)) if counted else 0
            steps += run_steps
            if status == EXIT_PASSED:
                agreed += 1
                print(f"{family:<13} seed {seed:>3}: agreed at every step ({run_steps} steps)")
                continue
            assert trace_path is not None, output
            trace = Trace.load(trace_path)
            found = DIVERGED.search(output)
            explained = all(
                agrees_under_knobs(trace, release, python, trace_path.parent)
                for release, python in ((here, sys.executable), (other, args.other_python))
            )
            difference = Difference(
                family,
                seed,
                found.group(1) if found else "?",
                trace_path,
                len(trace.events),
                explained,
            )
            differences.append(difference)
            verdict = "explained by the knobs" if explained else "NOT explained by the knobs"
            print(
                f"{family:<13} seed {seed:>3}: diverged on {difference.field} "
                f"({difference.events} events, {trace_path}): {verdict}"
            )
    unexplained = [d for d in differences if not d.explained or d.family == "neutral"]
    print(
        f"{agreed} runs agreed, {len(differences)} diverged, {steps} steps diffed "
        f"({len(differences) - len(unexplained)} explained by the knobs, "
        f"{len(unexplained)} not)"
    )
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
