"""The conformance state machine: random workloads against any engine, every invariant checked.

One rule, `act`, applies a pair of actions, each one of: add a request,
abort, propose drafts, step the engine (several steps per action, since a
scheduler bug usually needs a few iterations to show). Every action applies in every state (no
assume, no precondition), so no example is thrown away and shrinking stays
aligned. Teardown drains the engine with no arrivals and checks the liveness
invariants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from schedspec.engines.capabilities import FAMILY_CAPABILITIES, within
from schedspec.engines.events import Abort, AddRequest, Drain, Event, ProposeDrafts, Step
from schedspec.engines.fake_model import StepDecisions
from schedspec.engines.protocol import EngineFactory
from schedspec.properties.checked_engine import CheckStats, InvariantViolationError
from schedspec.properties.connector_worker import WorkerClock
from schedspec.properties.harness import Harness, SingleEngine, Target
from schedspec.properties.strategies.actions import (
    DRAFT_COUNTS,
    Action,
    ArriveAction,
    CancelAction,
    DraftsAction,
    RequestDraw,
    StepAction,
    action_pairs,
    build_add_request,
    request_draws,
)
from schedspec.properties.strategies.configs import checked_configs, family_configs
from schedspec.properties.strategies.openings import Opening, sglang_openings
from schedspec.spec import RequestState, SchedulerConfig
from schedspec.spec.invariants import Profile, family_of
from schedspec.traces.divergence import DivergenceError
from schedspec.traces.trace import ModelParams, Trace

MAX_LIVE_REQUESTS = 32
# Every example starts with a few arrivals, so that no engine is stepped idle
# before anything arrived, and every action may bring its own steps (which
# spreads an action's cost in Hypothesis choices over more checked steps; 0,
# where shrinking goes, is the bare event).
MAX_INITIAL_ARRIVALS = 4
ACTIONS_PER_RULE = 2  # act applies a pair


@dataclass(frozen=True)
class Pace:
    """How a family's workloads load the engine: how many requests an example may start
    with, and whether an arrival brings engine steps of its own (ArriveAction.then_steps)."""

    max_initial_arrivals: int
    steps_after_arrival: bool


# vLLM's family: arrivals spaced by the steps they draw.
VLLM_PACE = Pace(MAX_INITIAL_ARRIVALS, steps_after_arrival=True)
# SGLang's family: requests come in bursts, as SGLang's event loop receives them (every
# request sent since the last iteration joins the queue before the next schedule). Its
# admission reserves each admitted request's whole future but the running requests'
# only at new_token_ratio, so it overcommits only when several requests queue at once,
# and only a retraction among many decodes (the corner two-victims) can need a second
# victim: the first, the request with the fewest outputs, has decoded least. Measured
# with the regime sglang-crowded (strategies/regimes.py), 30 examples, seeds 2-5: two
# or more victims in 27 steps with bursts of up to 8 first arrivals and none after;
# none with arrivals spaced by their steps (whatever the first burst), 2 with the
# first burst of up to 4.
SGLANG_PACE = Pace(2 * MAX_INITIAL_ARRIVALS, steps_after_arrival=False)


def rules_for(actions_per_example: int) -> int:
    """Hypothesis rules (stateful_step_count) for up to that many actions per example."""
    return max(1, -(-actions_per_example // ACTIONS_PER_RULE))


@dataclass
class SuiteRecorder:
    """What a whole suite run saw: merged check counts, examples, and the last failure.

    Hypothesis replays the shrunk failing example last, so the last trace
    recorded is the minimal one.
    """

    stats: CheckStats = field(default_factory=CheckStats)
    # Every example run: the search's, the few Hypothesis drops for outgrowing its
    # choice budget, and the many that shrinking a failure runs.
    examples: int = 0
    first_failure_example: int | None = None  # which example (1-based) failed first
    last_failure: Trace | None = None
    last_error: BaseException | None = None  # what the last failing example raised

    def failed(self, trace: Trace, error: BaseException) -> None:
        """The current example failed with `error`; `trace` is its events up to it."""
        self.last_failure = trace
        self.last_error = error
        if self.first_failure_example is None:
            self.first_failure_example = self.examples


# The initialize rule's draws besides the config, which is the run's (make_target_machine).
_MODEL_SEEDS = st.integers(0, 2**16)


@functools.cache
def _first_arrivals(max_size: int) -> st.SearchStrategy[Opening]:
    # A map draws nothing of its own: vLLM's examples draw what they drew before openings.
    return st.lists(request_draws, min_size=1, max_size=max_size).map(Opening.burst)


class SchedulerMachine(RuleBasedStateMachine):
    """The machine's rules, for any target; make_target_machine binds it to one run.

    A run's subclass sets the target, the recorder and the initialize rule around
    `start`, whose config strategy is the run's. Hypothesis runs only such subclasses:
    this class has no target, and no initialize rule.
    """

    target: ClassVar[Target]
    recorder: ClassVar[SuiteRecorder]
    pace: ClassVar[Pace] = VLLM_PACE
    checked: Harness | None = None
    failed = False

    def start(self, config: SchedulerConfig, seed: int, first: Opening) -> None:
        """The initialize rule: a fresh harness for the example, and its opening (its first
        arrivals, and for SGLang's family sometimes steps and late arrivals)."""
        self.recorder.examples += 1
        model = ModelParams(seed=seed)
        try:
            self.checked = self.target.start(config, model, self.recorder.stats)
        except KeyboardInterrupt:
            raise  # the run stops; this example did not fail
        except BaseException as err:
            # Failing before any event (two engines that disagree from the
            # start, an engine that cannot be built) still has a trace to show.
            self.failed = True
            self.recorder.failed(Trace(config, (), model, failure_note(err)), err)
            raise
        self.next_id = 0
        self.worker = WorkerClock()
        for drawn in first.first_arrivals(config):
            self._arrive(drawn)
            self._steps(first.stagger)
        if first.late:
            self._steps(first.then_steps)
            for drawn in first.late_arrivals(self.engine().state):
                self._arrive(drawn)

    def start_opened(self, opened: tuple[SchedulerConfig, Opening], seed: int) -> None:
        """SGLang's initialize rule: the config and the opening drawn for it."""
        self.start(opened[0], seed, opened[1])

    def engine(self) -> Harness:
        assert self.checked is not None
        return self.checked

    def apply(self, event: Event) -> None:
        try:
            self.engine().apply(event)
        except KeyboardInterrupt:
            self.failed = True  # no drain of a half-stepped engine in teardown
            raise
        except BaseException as err:
            # A finding, or an engine crash (or a hang or an exit: an EngineHalt
            # is no Exception). Mark it, so that teardown does not drain a
            # half-updated engine and report something else.
            self.failed = True
            self.recorder.failed(self.engine().trace(note=failure_note(err)), err)
            raise

    # One rule, always enabled: each action's first draw picks its kind
    # (strategies.action_pairs, which also does the swarm testing over
    # kinds), so Hypothesis spends no choices selecting among rules, nor
    # retrying rules that its own swarm testing switched off (with four
    # rules that was about half of all choices). Each kind draws a fixed
    # shape of choices and applies in every state, so shrinking can delete
    # actions freely. A rule applies ACTIONS_PER_RULE actions: Hypothesis
    # spends as much per rule as on a few choices, whatever the rule draws.

    @rule(pair=action_pairs())
    def act(self, pair: tuple[Action, Action]) -> None:
        for action in pair:
            self.take(action)

    def take(self, action: Action) -> None:
        if isinstance(action, StepAction):
            self.step(action)
        elif isinstance(action, ArriveAction):
            self.add_request(action)
        elif isinstance(action, CancelAction):
            self.cancel(action)
        else:
            self.propose_drafts(action)

    def step(self, action: StepAction) -> None:
        # The drawn decisions shape the action's first step; the rest run
        # with the defaults (no forced stop, greedy verification).
        self._steps(action.num_steps, self._step_event(self._decisions(action.code)))

    def add_request(self, action: ArriveAction) -> None:
        if len(self.engine().state.requests) >= MAX_LIVE_REQUESTS:
            self.apply(self._step_event())  # full: let the engine make room instead
            return
        self._arrive(action.drawn)
        self._steps(action.then_steps if self.pace.steps_after_arrival else 0)

    def _arrive(self, drawn: RequestDraw) -> None:
        checked = self.engine()
        live = checked.state.requests
        priorities = [r.priority for r in live.values()]
        event = build_add_request(checked.config, f"r{self.next_id}", live, drawn, priorities)
        self.worker.on_add(event)
        self.apply(event)
        self.next_id += 1

    def cancel(self, action: CancelAction) -> None:
        """Abort a live request (now and then with an unknown id, which is ignored),
        between engine steps or, with action.in_flight, while one runs (the engine's
        loop applies it: vLLM's just before that step's output lands); with
        action.retry, send the aborted request again under its id at once: its step may
        still be in flight, and its output must not reach the new one (DELIVERY)."""
        requests = self.engine().state.requests
        live = sorted(requests)
        picked = requests[live[action.pick % len(live)]] if live else None
        ids = (picked.request_id,) if picked is not None else ()
        if action.unknown == 3 or not ids:
            ids = (*ids, "no-such-request")
        self.apply(self._step_event(aborts=ids) if action.in_flight else Abort(ids))
        if action.retry and picked is not None:
            self.apply(resent(picked))
        self._steps(action.then_steps)

    def propose_drafts(self, action: DraftsAction) -> None:
        """The drafter proposes the same number of drafts for every running request
        (a synchronous engine only: see below).

        One count for all keeps the draw independent of which requests run,
        so deleting an earlier action while shrinking does not change it.
        """
        checked = self.engine()
        limit = checked.config.num_speculative_tokens
        # Under async scheduling the model runner proposes the drafts itself (as
        # placeholders): vLLM's engine core never calls update_draft_token_ids.
        if limit and not checked.config.async_scheduling:
            # Counts 0-6 propose 1-K drafts, 7 none. Wrapped (count mod K + 1),
            # a third to a half of the proposals were empty, and some CI runs never
            # proposed drafts for a request mid-prefill (corners.py, measured by
            # benchmarks/bench_corners.py).
            drafts = 0 if action.count == DRAFT_COUNTS - 1 else 1 + action.count % limit
            self.apply(ProposeDrafts(dict.fromkeys(checked.state.running, drafts)))
        self._steps(action.then_steps)

    def _steps(self, count: int, first: Step | None = None) -> None:
        """Up to `count` engine steps, stopping once the engine is idle: it has
        nothing more to show this rule. A step rule's own first step (`first`)
        runs even on an idle engine, which must then schedule nothing."""
        for index in range(count):
            if (index or first is None) and not self.engine().state.requests:
                break
            self.apply(first if index == 0 and first is not None else self._step_event())

    def _step_event(
        self, decisions: StepDecisions | None = None, aborts: tuple[str, ...] = ()
    ) -> Step:
        """A step, carrying the KV connector's worker reports due with it (WorkerClock)."""
        transfers = self.worker.transfers(self.engine().state)
        return Step(decisions if decisions is not None else StepDecisions(), aborts, transfers)

    def _decisions(self, code: int) -> StepDecisions:
        """Which running request emits a stop token, and how many drafts pass.

        Decoded from one drawn integer (cheap to draw; 0, where shrinking
        goes, means no forced stop and greedy verification): bits 0-1 == 3
        force a stop, on the stoppable running request picked by bits 4-6;
        bit 2 fixes every request's accepted drafts to bits 7-9 (capped).
        """
        checked = self.engine()
        running = [checked.state.requests[r] for r in checked.state.running]
        stops: dict[str, int] = {}
        stoppable = [r for r in running if r.eos_token_id is not None or r.stop_token_ids]
        if stoppable and code & 3 == 3:
            request = stoppable[(code >> 4 & 7) % len(stoppable)]
            stop = request.eos_token_id
            stops[request.request_id] = stop if stop is not None else request.stop_token_ids[0]
        accepted: dict[str, int] = {}
        if code & 4:
            count = min(code >> 7 & 7, checked.config.num_speculative_tokens)
            accepted = {r.request_id: count for r in running if r.spec_token_ids}
        return StepDecisions(stops=stops, accepted=accepted)

    def teardown(self) -> None:
        try:
            if self.checked is not None and not self.failed:
                self.apply(Drain())
        finally:
            # Hypothesis' per-example objects hold this machine in reference
            # cycles, which only the garbage collector undoes: let go of the
            # engine, its states and its events now, so that reference counting
            # frees them (the collector's scans were a tenth of a suite run).
            self.checked = None


def make_state_machine(
    factory: EngineFactory,
    profile: Profile,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    recorder: SuiteRecorder | None = None,
) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class checking `factory`'s engines against `profile`."""
    return make_target_machine(SingleEngine(factory, profile), config_strategy, recorder)


def make_target_machine(
    target: Target,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    recorder: SuiteRecorder | None = None,
) -> type[RuleBasedStateMachine]:
    """The same machine for any target: one engine, or two in lockstep (differential.py).

    Each call makes a SchedulerMachine subclass of its own, which carries the run's
    target, recorder and initialize rule (and which the pytest plugin renames).
    """
    family = family_of(target.profile) or "vllm"
    chosen_configs: st.SearchStrategy[SchedulerConfig] = (
        checked_configs(config_strategy) if config_strategy is not None else family_configs(family)
    )
    # Every config within what the engines have (engines/capabilities.py): the defaults,
    # and a --configs strategy's too (a knob the engine lacks would only fail it).
    capabilities = target.capabilities()
    if not capabilities >= FAMILY_CAPABILITIES[family]:
        chosen_configs = chosen_configs.map(functools.partial(within, capabilities))
    # @initialize takes its strategies when it makes the rule, and the configs are the
    # run's: so the rule around SchedulerMachine.start is made here, once per run.
    pace = SGLANG_PACE if family == "sglang" else VLLM_PACE
    if family == "sglang":
        # SGLang's opening is drawn after the config, whose knobs decide which shapes it
        # can show (strategies/openings.py).
        max_first = pace.max_initial_arrivals
        opened = chosen_configs.flatmap(
            lambda c: sglang_openings(max_first, c).map(lambda o: (c, o))
        )
        rule_name = "start_opened"
        begin = initialize(opened=opened, seed=_MODEL_SEEDS)(SchedulerMachine.start_opened)
    else:
        rule_name = "start"
        first = _first_arrivals(pace.max_initial_arrivals)
        start = initialize(config=chosen_configs, seed=_MODEL_SEEDS, first=first)
        begin = start(SchedulerMachine.start)
    run: dict[str, object] = {
        "target": target,
        "pace": pace,
        "recorder": recorder if recorder is not None else SuiteRecorder(),
        rule_name: begin,
    }
    # The subclass keeps the name Hypothesis prints in a failing example
    # (`state = SchedulerMachine()`).
    return type(SchedulerMachine.__name__, (SchedulerMachine,), run)


def resent(request: RequestState) -> AddRequest:
    """The same request again, as a client that cancelled it and retries sends it: the
    same id, prompt and sampling parameters, none of the first one's progress."""
    return AddRequest(
        request.request_id,
        request.prompt_token_ids,
        request.max_tokens,
        request.eos_token_id,
        request.stop_token_ids,
        request.priority,
        request.remote_kv,
    )


def failure_note(err: BaseException) -> str:
    """What a failure's trace says about it: a finding's own message, or the crash."""
    if isinstance(err, InvariantViolationError | DivergenceError):
        return str(err)
    return f"engine raised {type(err).__name__}: {err}"
