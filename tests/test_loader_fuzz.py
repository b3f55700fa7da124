"""Every loader, fuzzed: whatever the input (random bytes, valid documents with any value
anywhere, odd names), it loads or is refused with the loader's own error naming the
input, never another exception, a hang or a runaway allocation. What loads is usable:
a loaded trace replays on the reference without an error of the harness's own, a
loaded workload simulates.

The loaders: trace files (schedspec replay and friends), JSONL workloads and cost-model
JSON (schedspec simulate), and module:attribute names (--configs, --engine).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedspec.adapters.reference import reference_engine
from schedspec.engines.errors import EngineHalt, engine_call_of
from schedspec.engines.registry import load_config_strategy, load_engine_factory
from schedspec.engines.watchdog import Watchdog
from schedspec.properties.checked_engine import InvariantViolationError
from schedspec.properties.harness import SingleEngine, replay_target
from schedspec.simulate.cost_model import CostModel, CostModelError, StepWork
from schedspec.simulate.errors import SimulationInputError
from schedspec.simulate.trace_file import load_trace
from schedspec.traces.trace import Trace, TraceError, trace_from_json
from tests.sched_helpers import make_config
from tests.test_trace import EVENTS

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any JSON value, a few levels deep (past MAX_JSON_DEPTH only with the raw bytes below).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _valid_trace_document() -> dict[str, Any]:
    config = make_config(num_speculative_tokens=2, enable_prefix_caching=True, max_model_len=64)
    document: dict[str, Any] = json.loads(json.dumps(Trace(config, EVENTS).to_json()))
    return document


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document a value sits at (keys and indices from the root)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*prefix, index))
    return found


def _replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


DOCUMENT_PATHS = _paths(_valid_trace_document())


# --------------------------------------------------------------------- traces


@FUZZ
@given(content=st.binary(max_size=400))
def test_any_bytes_load_as_a_trace_or_a_trace_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fuzz.json"
    path.write_bytes(content)
    try:
        Trace.load(path)
    except TraceError as err:
        assert str(path) in str(err) or err.field != "trace"


@FUZZ
@given(where=st.sampled_from(DOCUMENT_PATHS), value=json_values)
def test_any_value_anywhere_in_a_trace_loads_or_is_named(
    where: tuple[Any, ...], value: Any
) -> None:
    """A valid trace with one value replaced: refused naming a field, or loaded and then
    replayable on the reference with no error of the harness's own."""
    document = _replaced(_valid_trace_document(), where, value)
    try:
        trace = trace_from_json(document)
    except TraceError as err:
        assert err.field  # names where it is
        return
    _replays_without_a_harness_error(trace)


@FUZZ
@given(
    drafts=st.integers(-(10**12), 10**12),
    accepted=st.integers(-(10**12), 10**12),
    stop=st.integers(-(2**70), 2**70),
)
def test_counts_out_of_their_bounds_are_refused(drafts: int, accepted: int, stop: int) -> None:
    """num_drafts 10**9 used to hang the harness, negative drafts and accepted counts were
    accepted: counts are bounded by num_speculative_tokens, stop tokens by the token ids."""
    document = _valid_trace_document()
    document["events"][3]["num_drafts"] = {"a": drafts}
    document["events"][4]["accepted"] = {"a": accepted}
    document["events"][4]["stops"] = {"b": stop}
    in_bounds = 0 <= drafts <= 2 and 0 <= accepted <= 2 and 0 <= stop < 2**63
    try:
        trace = trace_from_json(document)
    except TraceError as err:
        assert not in_bounds
        assert err.field in ("events[3].num_drafts", "events[4].accepted", "events[4].stops")
        assert "[0, num_speculative_tokens (2)]" in str(err) or "[0, 2**63)" in str(err)
        return
    assert in_bounds
    _replays_without_a_harness_error(trace)


def _replays_without_a_harness_error(trace: Trace) -> None:
    with Watchdog(10):
        try:
            replay_target(SingleEngine(reference_engine, "safety"), trace)
        except InvariantViolationError:
            pass  # a hand-made trace may ask for what the reference refuses to do
        except (Exception, EngineHalt) as err:
            assert engine_call_of(err) is not None, f"the harness raised: {err!r}"


# ------------------------------------------------------------ JSONL workloads

RECORD_FIELDS = ("arrival_time", "prompt_tokens", "output_tokens", "request_id", "priority")
good_records = st.fixed_dictionaries(
    {
        "arrival_time": st.floats(0, 1e12),
        "prompt_tokens": st.integers(1, 40)
        | st.lists(st.integers(0, 50_000), min_size=1, max_size=40),
        "output_tokens": st.integers(1, 20),
    }
)
odd_records = st.dictionaries(
    st.sampled_from(RECORD_FIELDS) | st.text(max_size=5), json_values, max_size=6
)


@FUZZ
@given(content=st.binary(max_size=400))
def test_any_bytes_load_as_a_workload_or_a_record_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(content)
    try:
        workload = load_trace(path, 0, max_model_len=64)
    except SimulationInputError as err:
        assert str(path) in str(err)
        return
    assert len(list(workload)) == len(workload)


@FUZZ
@given(records=st.lists(good_records | odd_records, min_size=1, max_size=6))
def test_any_records_load_or_name_their_line(tmp_path: Path, records: list[Any]) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    try:
        workload = load_trace(path, 0, max_model_len=64)
    except SimulationInputError as err:
        assert str(path) in str(err) and err.field
        return
    requests = list(workload)
    assert [r.arrival_time for r in requests] == sorted(r.arrival_time for r in requests)
    assert requests[0].arrival_time == 0.0
    assert all(1 <= len(r.prompt_token_ids) < 64 for r in requests)


# ------------------------------------------------------------- cost model JSON


@FUZZ
@given(content=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_cost_file_loads_or_names_the_field(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "cost.json"
    path.write_bytes(content)
    try:
        model = CostModel.from_json(path)
    except CostModelError as err:
        assert err.field
        return
    assert math.isfinite(model.step_time(StepWork(1, 1, 10**6)))


@FUZZ
@given(
    fields=st.dictionaries(
        st.sampled_from(["weight_bytes", "peak_flops", "step_overhead_s"]), json_values, max_size=3
    )
)
def test_any_cost_values_are_accepted_finite_or_refused(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(fields))
    try:
        model = CostModel.from_json(path)
    except CostModelError as err:
        assert err.field in (*fields, "kv_bytes_per_token", "flops_per_token", "cost_json")
        return
    assert math.isfinite(model.step_time(StepWork(1, 1, 10**6)))


# ---------------------------------------------------- module:attribute names

SAFE_MODULES = (
    "schedspec.properties.strategies.configs",
    "schedspec.adapters.reference",
    "tests.test_loader_fuzz",
    "no_such_module_anywhere",
    "schedspec",
)
ATTRIBUTES = (
    "configs",
    "sync_configs",
    "reference_engine",
    "nothing",
    "not_a_strategy",
    "calls_raise",
    "draws_ints",
)
# Characters that make a name no module path: a fuzzed name never imports a real module.
ODD = st.text(alphabet=" :./-\\\n\t\x00é1", max_size=6)
names = st.builds(
    lambda module, separator, attribute: module + separator + attribute,
    st.sampled_from(SAFE_MODULES) | ODD,
    st.sampled_from([":", "::", "", ".", ": "]) | ODD,
    st.sampled_from(ATTRIBUTES) | ODD,
)


@FUZZ
@given(name=names)
def test_any_configs_name_loads_a_strategy_or_says_why_not(name: str) -> None:
    try:
        strategy = load_config_strategy(name)
    except ValueError as err:
        assert str(err).startswith("configs: ")
        return
    assert not strategy.is_empty


@FUZZ
@given(name=names)
def test_any_engine_name_loads_a_factory_or_says_why_not(name: str) -> None:
    assume(not name.startswith("tests.test_loader_fuzz"))  # its attributes build nothing
    try:
        factory = load_engine_factory(name)
    except ValueError as err:
        assert str(err).startswith("engine: ")
        return
    assert callable(factory)


nothing = st.nothing()
not_a_strategy = 42
draws_ints = st.integers()  # loads: what it draws is refused only while the suite runs


def calls_raise() -> object:
    raise RuntimeError("a strategy factory that fails")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("tests.test_loader_fuzz:nothing", "can draw nothing"),
        ("tests.test_loader_fuzz:not_a_strategy", "is not a Hypothesis strategy"),
        ("tests.test_loader_fuzz:calls_raise", "raised RuntimeError when called"),
        (".relative:configs", "expected 'module:strategy'"),
        ("a b:configs", "expected 'module:strategy'"),
    ],
)
def test_configs_names_refused_with_the_reason(name: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        load_config_strategy(name)
    assert says in str(err.value)


def test_a_config_strategy_drawing_no_configs_is_a_usage_error_of_the_run() -> None:
    from click.testing import CliRunner

    from schedspec.cli.main import main

    result = CliRunner().invoke(
        main, ["check", "--configs", "tests.test_loader_fuzz:draws_ints", "--examples", "2"]
    )
    assert result.exit_code == 2, result.output
    assert "the config strategy drew" in result.output and "not a SchedulerConfig" in result.output


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("raise RuntimeError('planted')", "importing 'fuzz_configs' raised RuntimeError: planted"),
        ("import sys\nsys.exit(0)", "importing 'fuzz_configs' raised SystemExit: 0"),
    ],
    ids=["raises", "exits"],
)
def test_a_configs_module_failing_at_import_is_named(
    source: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --configs module is the caller's own: its failure is a usage error, never the
    engine's (exit 4) nor an exit of the whole run."""
    (tmp_path / "fuzz_configs.py").write_text(source + "\n")
    monkeypatch.syspath_prepend(tmp_path)
    with pytest.raises(ValueError) as err:
        load_config_strategy("fuzz_configs:configs")
    assert says in str(err.value)
