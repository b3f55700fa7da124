"""`schedspec simulate`: latency, throughput and pictures of a scheduling policy.

The work is in schedspec/simulate/ (cost model, workloads, simulator,
metrics, plots); matplotlib is imported only when pictures are drawn.
Engines are loaded and guarded as for `check` (the working directory on the import
path, every call under --step-timeout and attributed to the engine when it fails),
and the exit codes are check's: 4 when the engine raised, 5 when it hung.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import click

from schedspec.cli.exit_codes import EXIT_CODES, Outcome, error_outcome
from schedspec.cli.loading import load_engine
from schedspec.cli.options import ENGINE_HELP, refuse_flags, step_timeout_option
from schedspec.cli.printing.progress import simulation_progress
from schedspec.engines.boundary import guarded
from schedspec.engines.errors import EngineHalt
from schedspec.engines.protocol import EngineFactory
from schedspec.engines.registry import named_engine
from schedspec.engines.watchdog import Watchdog
from schedspec.files import (
    OutputPathError,
    output_target,
    prepare_output_dir,
    require_free_space,
    write_atomically,
)
from schedspec.properties.failure_report import crash_report
from schedspec.simulate.configs import (
    COMPARE_PRESETS,
    CROSS_FAMILY_PRESETS,
    SGLANG_COMPARE_PRESETS,
    NamedConfig,
    parse_assignments,
    resolve_configs,
)
from schedspec.simulate.cost_model import CostModel
from schedspec.simulate.errors import SimulationInputError
from schedspec.simulate.experiment import format_trade_offs, trade_off
from schedspec.simulate.metrics import format_table
from schedspec.simulate.runs import (
    DEFAULT_OUT,
    FORMATS,
    ConfigRun,
    run_configs,
    runs_document,
    write_plots,
)
from schedspec.simulate.simulator import SimulationStalledError
from schedspec.simulate.trace_file import load_trace
from schedspec.simulate.workloads import (
    BUILTIN_WORKLOADS,
    LONG_PROMPT_ID,
    LengthDistribution,
    SyntheticWorkload,
    Workload,
    builtin_workload,
    with_fields,
)

# simulate's outputs land after the simulation, its expensive part: the folder must hold
# them first. summary.json of a 400-request run and its pictures take about 1 MiB; a
# run with several configs or many requests a few.
SUMMARY_NAME = "summary.json"
OUT_FREE_BYTES = 8 * 2**20


def _cost_model(cost_json: Path | None, cost: tuple[str, ...]) -> CostModel:
    model = CostModel.from_json(cost_json) if cost_json is not None else CostModel()
    for text in cost:
        model = model.with_fields(parse_assignments(text, "cost"), "--cost")
    return model


def _workload(name: str, seed: int, max_model_len: int, synthetic: dict[str, object]) -> Workload:
    given = {k: v for k, v in synthetic.items() if v is not None}
    if name in BUILTIN_WORKLOADS:
        if given and name != "mixed":
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise SimulationInputError("workload", f"{flags} shape(s) only the mixed workload")
        for field in ("prompt_len", "output_len"):
            if isinstance(given.get(field), str):
                given[field] = LengthDistribution.parse(str(given[field]), field)
        _warn_if_prefix_cut(given.get("prefix_len"), max_model_len)
        return builtin_workload(
            name, seed, max_model_len, with_fields(SyntheticWorkload(), **given)
        )
    if given:
        raise SimulationInputError("workload", "a trace file sets its own lengths and arrivals")
    return load_trace(Path(name), seed, max_model_len=max_model_len)


def _warn_if_prefix_cut(prefix_len: object, max_model_len: int) -> None:
    """A --prefix-len that the smallest config's max_model_len cuts (the workload keeps
    room for one output token) is said, not cut without a word."""
    room = max_model_len - 1
    if isinstance(prefix_len, int) and prefix_len > room:
        click.echo(
            f"warning: --prefix-len {prefix_len} is cut to {room} tokens: the smallest "
            f"config's max_model_len is {max_model_len}, and each request keeps one token "
            "for its output",
            err=True,
        )


def _trade_off_lines(runs: list[ConfigRun], workload: Workload) -> list[str]:
    long_len = next(len(r.prompt_token_ids) for r in workload if r.request_id == LONG_PROMPT_ID)
    return format_trade_offs([trade_off(r.result.name, r.metrics) for r in runs], long_len)


@click.command("simulate")
@click.option("--engine", default="reference", show_default=True, help=ENGINE_HELP)
@click.option(
    "--workload",
    default="mixed",
    show_default=True,
    help=f"{' | '.join(BUILTIN_WORKLOADS)} | a JSONL trace "
    "(arrival_time, prompt_tokens, output_tokens per line).",
)
@click.option("--num-requests", type=int, help="mixed workload: requests [400].")
@click.option("--rate", type=float, help="mixed workload: Poisson arrivals per second [20].")
@click.option(
    "--prompt-len",
    help="mixed: fixed:N | uniform:LO:HI | lognormal:MEDIAN:SIGMA[:MAX] [lognormal:400:0.8:2500].",
)
@click.option("--output-len", help="mixed: output lengths, same forms [lognormal:150:0.7:1000].")
@click.option("--prefix-groups", type=int, help="mixed: shared system prompts [4].")
@click.option("--prefix-len", type=int, help="mixed: tokens per shared system prompt [256].")
@click.option("--prefix-share", type=float, help="mixed: share of requests with one [0.5].")
@click.option(
    "--config",
    "config_specs",
    multiple=True,
    help="NAME[:field=value,...] (repeatable); NAME may be a preset: chunked, no-chunking, "
    "chunked-512, no-prefix-cache, spec-decode, small-kv; sglang (SGLang's family on the "
    "same deployment) or sglang-PRESET.",
)
@click.option(
    "--compare",
    is_flag=True,
    help=f"Compare the presets {', '.join(COMPARE_PRESETS)} on one workload, and "
    f"{', '.join(CROSS_FAMILY_PRESETS)} where the engine follows SGLang's family too "
    f"({', '.join(SGLANG_COMPARE_PRESETS)} where it follows only that) "
    "(not with --config or --experiment, which choose their own configs).",
)
@click.option(
    "--experiment",
    type=click.Choice(["chunked-prefill"]),
    help="The chunked-prefill trade-off: long-prompt workload, no-chunking vs chunked-512 "
    "(sglang-no-chunking vs sglang-chunked-512 on an engine of SGLang's family only).",
)
@click.option("--set", "common", multiple=True, help="field=value,... for every config.")
@click.option("--cost", multiple=True, help="Cost-model field=value,... (see docs/SIMULATE.md).")
@click.option(
    "--cost-json",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Cost-model fields from a JSON object.",
)
@click.option("--seed", default=0, show_default=True, help="Seeds the workload and the model.")
@click.option(
    "--max-steps",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Safety bound: fail if a config's workload has not drained after this many iterations.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Folder for the plots and summary.json.",
)
@click.option(
    "--format",
    "formats",
    multiple=True,
    type=click.Choice(FORMATS),
    help="Picture formats [png and svg].",
)
@click.option("--no-plots", is_flag=True, help="Skip the pictures.")
@step_timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document, not the table.")
@click.option("--progress", is_flag=True, help="Report progress on stderr even off a terminal.")
@click.pass_context
def simulate(
    ctx: click.Context,
    /,
    engine: str,
    workload: str,
    config_specs: tuple[str, ...],
    compare: bool,
    experiment: str | None,
    common: tuple[str, ...],
    cost: tuple[str, ...],
    cost_json: Path | None,
    seed: int,
    max_steps: int,
    out: Path,
    formats: tuple[str, ...],
    no_plots: bool,
    as_json: bool,
    progress: bool,
    step_timeout: float,
    **synthetic: object,
) -> None:
    """Simulate a workload through an engine with a step-time cost model.

    Prints per-config TTFT, TPOT, worst gap between tokens and E2E latency
    (p50/p90/p99), throughput, preemptions, recomputed tokens, prefix-cache hit
    rate and KV usage; writes Gantt, KV/queue and latency-CDF plots and
    summary.json (with every request's metrics) to --out.
    """
    if compare:
        refuse_flags(ctx, ["--config", "--experiment"], "--compare runs its own presets")
    try:
        prepare_output_dir(out)
        output_target(out / SUMMARY_NAME)  # a regular file or nothing
        require_free_space(out, OUT_FREE_BYTES)
    except OutputPathError as err:
        raise click.BadParameter(str(err), param_hint="'--out'") from None
    factory = load_engine(engine)
    try:
        cost_model = _cost_model(cost_json, cost)
        fields: dict[str, object] = {}
        for text in common:
            fields.update(parse_assignments(text, "set"))
        registered = named_engine(engine)
        families = registered.families if registered is not None else ("vllm",)
        configs = resolve_configs(
            config_specs, compare, experiment is not None, fields, cost_model, families
        )
        if experiment is not None and workload == "mixed":
            workload = "long-prompt"
        max_model_len = min(c.config.max_model_len for c in configs)
        requests = _workload(workload, seed, max_model_len, synthetic)
        with Watchdog(step_timeout) as watchdog:
            runs = _simulate(
                configs, requests, guarded(factory, watchdog), cost_model, seed, max_steps, progress
            )
    except SimulationInputError as err:  # names the field (and the line of a trace)
        raise click.UsageError(str(err)) from None
    except SimulationStalledError as err:
        raise click.ClickException(str(err)) from None
    document = runs_document(runs, seed, workload)
    paths, problems = _write_outputs(runs, out, document, [] if no_plots else formats or FORMATS)
    for problem in problems:  # as check and diff do: the files are lost, not the results
        click.echo(f"warning: {problem}", err=True)
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    for line in format_table([r.summary for r in runs]):
        click.echo(line)
    if workload == "long-prompt":
        click.echo()
        for line in _trade_off_lines(runs, requests):
            click.echo(line)
    click.echo()
    if not problems:
        click.echo(f"Wrote {out / SUMMARY_NAME}" + (f" and {len(paths)} pictures" if paths else ""))


def _write_outputs(
    runs: list[ConfigRun], out: Path, document: object, formats: Sequence[str]
) -> tuple[list[Path], list[str]]:
    """Write the pictures (none without formats) and summary.json; a write that fails (a
    disk filled during the simulation) is a line in the returned problems."""
    paths: list[Path] = []
    problems: list[str] = []
    try:
        if formats:
            paths = write_plots(runs, out, formats)
    except OSError as err:
        problems.append(f"could not write the pictures in {out}: {err.strerror or err}")
    try:
        write_atomically(out / SUMMARY_NAME, json.dumps(document, indent=2))
    except OSError as err:
        problems.append(f"could not write {out / SUMMARY_NAME}: {err.strerror or err}")
    return paths, problems


def _simulate(
    configs: list[NamedConfig],
    requests: Workload,
    factory: EngineFactory,
    cost_model: CostModel,
    seed: int,
    max_steps: int,
    progress: bool,
) -> list[ConfigRun]:
    """Run every config; an engine that raises, hangs or tries to exit ends the command
    with check's exit code for it (an error of schedspec's own goes on up: exit 6)."""
    try:
        with simulation_progress(len(requests) * len(configs), progress) as on_progress:
            return run_configs(configs, requests, factory, cost_model, seed, max_steps, on_progress)
    except (Exception, EngineHalt) as err:
        outcome = error_outcome(err)
        if outcome is Outcome.HARNESS_ERROR or isinstance(err, SimulationInputError):
            raise
        where = "".join(f" {note}" for note in getattr(err, "__notes__", []))
        click.echo(f"FAILED{where}: " + "\n".join(crash_report(err)))
        raise SystemExit(EXIT_CODES[outcome]) from None
