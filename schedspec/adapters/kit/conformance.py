"""The adapter's own protocol, checked before any invariant: what an adapter author runs first.

The invariant suite assumes the adapter speaks the protocol: a snapshot is a
well-formed State of the config the engine was built with, requests are keyed by their
own ids, statuses agree with the queues, block hashes are the spec's, add_request
refuses what the spec refuses and changes nothing when it does. When an adapter breaks
one of these, the suite's first report is an invariant about scheduling, which sends
its author looking in the wrong place. `conform` drives a fresh engine through a short
fixed script (build, look, refuse, add, step, land, abort) and stops at the first
broken promise with a ConformanceError naming the adapter method at fault and the
check. `schedspec conform --engine module:factory` prints the same, check by check.

The script runs on a small config within the capabilities the adapter declares (prefix
caching on where it has it, so the hash check has something to look at), in the
policy family asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import NoReturn, TypeVar

from schedspec.engines.capabilities import (
    Capability,
    CapabilityError,
    claimed_capabilities,
    within,
)
from schedspec.engines.contract import malformed_output, malformed_state
from schedspec.engines.profiles import ProfileError, claimed_profiles, probe_config
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.spec import (
    Family,
    ModelRunnerOutput,
    Request,
    RequestOutput,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    State,
    extend_block_hashes,
    shown,
)

T = TypeVar("T")
_PROTOCOL_METHODS = ("add_request", "schedule", "update_from_output", "finish_requests", "snapshot")
_PROMPT = (11, 12, 13, 14, 15)  # two full blocks of two tokens, and one more
_SAMPLED = 7


class ConformanceError(AssertionError):
    """The adapter broke its own protocol: `method` is the adapter member at fault,
    `check` the step of the script that found it."""

    def __init__(self, check: str, method: str, message: str) -> None:
        super().__init__(f"[{check}] {method}: {message}")
        self.check = check
        self.method = method
        self.message = message
        self.passed: tuple[str, ...] = ()  # the checks passed before it (conform sets them)


@dataclass
class _Script:
    """One run of the script: the engine, its config, and the checks passed so far."""

    engine: EngineAdapter
    config: SchedulerConfig
    capabilities: frozenset[Capability]
    passed: list[str]
    check: str = "load"

    def call(self, method: str, function: Callable[..., T], *args: object) -> T:
        """An adapter call; whatever it raises is that method's failure."""
        try:
            return function(*args)
        except Exception as err:
            self.fail(method, f"raised {type(err).__name__}: {err}")

    def fail(self, method: str, message: str) -> NoReturn:
        raise ConformanceError(self.check, method, message)

    def look(self) -> State:
        """A snapshot, held to the shape and the queue rules."""
        state = self.call("snapshot", self.engine.snapshot)
        wrong = malformed_state(state)
        if wrong is not None:
            self.fail("snapshot", f"the State {wrong}")
        if state.config != self.config:
            self.fail("snapshot", "State.config is not the config the engine was built with")
        if state.kv.num_blocks != self.config.num_blocks:
            self.fail(
                "snapshot",
                f"kv.num_blocks is {state.kv.num_blocks}, the config says "
                f"{self.config.num_blocks} (leave out blocks the engine reserves for itself)",
            )
        self._queues_match(state)
        return state

    def _queues_match(self, state: State) -> None:
        for name in ("waiting", "running"):
            queue = getattr(state, name)
            if len(set(queue)) != len(queue):
                self.fail("snapshot", f"{name} lists a request twice: {list(queue)}")
        both = set(state.waiting) & set(state.running)
        if both:
            self.fail("snapshot", f"{sorted(both)} in both waiting and running")
        for rid, request in state.requests.items():
            running = request.status is RequestStatus.RUNNING
            queued = request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            if running != (rid in state.running) or queued != (rid in state.waiting):
                where = "running" if rid in state.running else "waiting" if queued else "no queue"
                self.fail(
                    "snapshot",
                    f"request {rid!r} has status {request.status.name} but is in {where}: "
                    "RUNNING requests are in running, WAITING and PREEMPTED ones in waiting",
                )

    def done(self) -> None:
        self.passed.append(self.check)


def conformance_config(capabilities: frozenset[Capability], family: Family) -> SchedulerConfig:
    """The config the script runs on: small, prefix caching on, within the capabilities."""
    base = replace(
        probe_config(family),
        block_size=2,
        num_blocks=32,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=32,
        enable_prefix_caching=True,
    )
    return within(capabilities, base)


def conform(factory: EngineFactory, family: Family = "vllm") -> list[str]:
    """Run the script on engines `factory` builds; return the checks passed, in order.
    Raises ConformanceError at the first promise broken."""
    script = _load(factory, family)
    for check, step in _CHECKS:
        script.check = check
        try:
            step(script)
        except ConformanceError as err:
            err.passed = tuple(script.passed)
            raise
        script.done()
    return script.passed


def _load(factory: EngineFactory, family: Family) -> _Script:
    """Build once at the smallest config to read the claims, then at the script's."""
    passed: list[str] = []
    probe = _build(factory, probe_config(family))
    try:
        claimed_profiles(probe)
    except ProfileError as err:
        raise ConformanceError("load", "profiles", str(err)) from None
    try:
        capabilities = claimed_capabilities(probe)
    except CapabilityError as err:
        raise ConformanceError("load", "capabilities", str(err)) from None
    for method in _PROTOCOL_METHODS:
        if not callable(getattr(probe, method, None)):
            raise ConformanceError("load", method, "missing, or not a method")
    config = conformance_config(capabilities, family)
    passed.append("load")
    return _Script(_build(factory, config), config, capabilities, passed)


def _build(factory: EngineFactory, config: SchedulerConfig) -> EngineAdapter:
    try:
        return factory(config)
    except Exception as err:
        raise ConformanceError(
            "load", "__init__", f"building it for {config} raised {type(err).__name__}: {err}"
        ) from None


def _fresh(s: _Script) -> None:
    state = s.look()
    if state.requests or state.waiting or state.running:
        s.fail("snapshot", "a fresh engine's State must hold no request")
    kv = state.kv
    if sorted(kv.free_block_ids) != list(range(kv.num_blocks)) or any(kv.ref_counts):
        s.fail("snapshot", "a fresh engine's blocks must all be free, each once, ref count 0")
    if kv.prefix_cache or any(h is not None for h in kv.block_hashes):
        s.fail("snapshot", "a fresh engine caches nothing: no block hash, an empty prefix_cache")


def _request(rid: str, prompt: tuple[int, ...] = _PROMPT, max_tokens: int = 3) -> Request:
    return Request(rid, prompt, max_tokens, stop_token_ids=(99,), priority=0)


def _refusals(s: _Script) -> None:
    before = s.look()
    bad = {
        "an empty prompt": _request("bad", ()),
        "a prompt of max_model_len tokens": _request("bad", (1,) * s.config.max_model_len),
        "max_tokens 0": _request("bad", max_tokens=0),
        "a negative token id": _request("bad", (1, -1)),
    }
    for what, request in bad.items():
        try:
            s.engine.add_request(request)
        except ValueError:
            pass
        except Exception as err:
            s.fail("add_request", f"refused {what} with {type(err).__name__}, not a ValueError")
        else:
            s.fail("add_request", f"accepted {what}, which the spec refuses (raise ValueError)")
        if s.look() != before:
            s.fail("add_request", f"refusing {what} changed the engine's state")


def _added(s: _Script) -> None:
    given = _request("a")
    s.call("add_request", s.engine.add_request, given)
    state = s.look()
    if "a" not in state.requests:
        keys = sorted(state.requests)
        s.fail("snapshot", f"request 'a' was added, but State.requests is keyed {keys}")
    a = state.requests["a"]
    if a.status is not RequestStatus.WAITING or state.waiting != ("a",):
        s.fail("snapshot", f"a new request is WAITING in waiting, got {a.status.name}")
    for name in ("prompt_token_ids", "max_tokens", "stop_token_ids", "priority"):
        if getattr(a, name) != getattr(given, name):
            s.fail(
                "snapshot",
                f"request 'a' has {name} {shown(getattr(a, name))}, as given: "
                f"{shown(getattr(given, name))} (the kit's Given keeps what was given)",
            )
    if a.block_ids or a.num_computed_tokens or a.num_preemptions:
        s.fail("snapshot", "a new request holds no block, has nothing computed, never preempted")
    try:
        s.engine.add_request(_request("a"))
    except ValueError:
        return
    except Exception as err:
        s.fail("add_request", f"refused a duplicate id with {type(err).__name__}, not ValueError")
    s.fail("add_request", "accepted a second request 'a' while 'a' lives (raise ValueError)")


def _step(s: _Script) -> tuple[State, SchedulerOutput]:
    """One schedule(), held to its shape; the states after it and its output."""
    pre = s.look()
    output = s.call("schedule", s.engine.schedule)
    post = s.look()
    wrong = malformed_output(output, post)
    if wrong is not None:
        s.fail("schedule", f"the SchedulerOutput {wrong}")
    if not output.num_scheduled_tokens and pre.requests:
        s.fail("schedule", "scheduled nothing, with requests waiting and the cache free")
    for rid, num_tokens in output.num_scheduled_tokens.items():
        request = post.requests[rid]
        if request.status is not RequestStatus.RUNNING:
            s.fail("snapshot", f"{rid!r} was scheduled but is {request.status.name} after")
        if len(request.block_ids) * s.config.block_size < request.num_computed_tokens:
            s.fail("snapshot", f"{rid!r}'s block table does not cover its computed tokens")
        if num_tokens < 1:
            s.fail("schedule", f"schedules {num_tokens} tokens for {rid!r}")
    return post, output


def _scheduled(s: _Script) -> None:
    post, output = _step(s)
    if "a" not in output.num_scheduled_tokens:
        s.fail("schedule", "did not schedule 'a', the only request, in an empty cache")
    _hashes(s, post)
    _land(s, post, output)


def _land(s: _Script, pre: State, output: SchedulerOutput) -> None:
    """update_from_output with a token for each request whose step reaches its end."""
    sampled = {}
    for rid in output.num_scheduled_tokens:
        request = pre.requests[rid]
        if request.num_computed_tokens >= request.num_tokens:
            sampled[rid] = [_SAMPLED]
    model = ModelRunnerOutput(sampled_token_ids=sampled)
    reported = s.call("update_from_output", s.engine.update_from_output, output, model)
    post = s.look()
    for rid in sampled:
        outputs = post.requests[rid].output_token_ids if rid in post.requests else None
        if outputs is not None and outputs[-1:] != (_SAMPLED,):
            s.fail("snapshot", f"{rid!r} sampled {_SAMPLED}, its outputs are {list(outputs)}")
    if reported is not None and not _reports(reported, sampled):
        s.fail(
            "update_from_output",
            f"returned {shown(reported)}: return None, or a "
            "RequestOutput per request that sampled, keyed by its id",
        )


def _reports(reported: object, sampled: Mapping[str, object]) -> bool:
    return isinstance(reported, Mapping) and all(
        isinstance(o, RequestOutput) and o.request_id == rid and rid in sampled
        for rid, o in reported.items()
    )


def _hashes(s: _Script, state: State) -> None:
    """Every cached block of a request carries the spec's hash of that request's prefix."""
    size = s.config.block_size
    for rid, request in state.requests.items():
        tokens = (*request.prompt_token_ids, *request.output_token_ids)
        own = extend_block_hashes([], tokens, size)
        for index, block in enumerate(request.block_ids[: len(own)]):
            carried = state.kv.block_hashes[block]
            if carried is not None and carried != own[index]:
                s.fail(
                    "snapshot",
                    f"block {block} (index {index} of {rid!r}) carries hash {carried}, not the "
                    f"spec's {own[index]} for its content: translate the engine's hashes "
                    "(schedspec.adapters.kit.HashTranslator)",
                )
    for key, blocks in state.kv.prefix_cache:
        for block in blocks:
            if state.kv.block_hashes[block] != key:
                s.fail("snapshot", f"prefix_cache lists block {block} under a hash it lacks")


def _second_request(s: _Script) -> None:
    """Another request with the same prompt: a prefix hit, if the engine caches."""
    s.call("add_request", s.engine.add_request, _request("b"))
    post, output = _step(s)
    _hashes(s, post)
    _land(s, post, output)


def _aborts(s: _Script) -> None:
    s.call("finish_requests", s.engine.finish_requests, ["a", "no-such-request"])
    state = s.look()
    if "a" in state.requests and not state.requests["a"].abort_pending:
        s.fail("finish_requests", "aborted 'a', but it is still in the State, not pending")
    s.call("finish_requests", s.engine.finish_requests, list(state.requests))
    # An engine that defers a running request's abort (abort_pending) ends it with the
    # next step that runs it.
    for _ in range(4):
        state = s.look()
        if not state.requests:
            break
        if not all(r.abort_pending for r in state.requests.values()):
            s.fail("finish_requests", f"aborted every request, yet {sorted(state.requests)} live")
        post, output = _step(s)
        _land(s, post, output)
    kv = s.look().kv
    held = [b for b, refs in enumerate(kv.ref_counts) if refs]
    if held or len(kv.free_block_ids) != kv.num_blocks:
        s.fail("finish_requests", f"every request aborted, yet blocks {held} are still held")


_CHECKS: tuple[tuple[str, Callable[[_Script], None]], ...] = (
    ("fresh snapshot", _fresh),
    ("refusals", _refusals),
    ("add a request", _added),
    ("schedule and land", _scheduled),
    ("block hashes", _second_request),
    ("aborts", _aborts),
)
