"""The conformance state machine: random workloads against any engine, every invariant checked.

Rules add requests, abort, propose drafts and step the engine (several
steps per rule, since a scheduler bug usually needs a few iterations to
show). Every rule always applies (preconditions, never assume), so no
example is thrown away. Teardown drains the engine with no arrivals and
checks the liveness invariants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from schedspec.properties.adapter import EngineFactory
from schedspec.properties.checked_engine import (
    CheckedEngine,
    CheckStats,
    InvariantViolationError,
)
from schedspec.properties.events import Abort, Drain, Event, ProposeDrafts, Step
from schedspec.properties.fake_model import StepDecisions
from schedspec.properties.strategies import add_request_events, configs
from schedspec.properties.trace import ModelParams, Trace
from schedspec.spec import SchedulerConfig
from schedspec.spec.invariants import Profile

MAX_LIVE_REQUESTS = 32
MAX_STEPS_PER_RULE = 12


@dataclass
class SuiteRecorder:
    """What a whole suite run saw: merged check counts, examples, and the last failure.

    Hypothesis replays the shrunk failing example last, so the last trace
    recorded is the minimal one.
    """

    stats: CheckStats = field(default_factory=CheckStats)
    examples: int = 0
    last_failure: Trace | None = None


def make_state_machine(
    factory: EngineFactory,
    profile: Profile,
    config_strategy: st.SearchStrategy[SchedulerConfig] | None = None,
    recorder: SuiteRecorder | None = None,
) -> type[RuleBasedStateMachine]:
    """A RuleBasedStateMachine class checking `factory`'s engines against `profile`."""
    chosen_configs: st.SearchStrategy[SchedulerConfig] = (
        config_strategy if config_strategy is not None else configs()
    )
    record = recorder if recorder is not None else SuiteRecorder()

    class SchedulerMachine(RuleBasedStateMachine):
        checked: CheckedEngine | None = None
        failed = False

        @initialize(config=chosen_configs, seed=st.integers(0, 2**16))
        def start(self, config: SchedulerConfig, seed: int) -> None:
            record.examples += 1
            self.checked = CheckedEngine.from_factory(
                factory, config, profile, ModelParams(seed=seed), record.stats
            )
            self.next_id = 0

        def engine(self) -> CheckedEngine:
            assert self.checked is not None
            return self.checked

        def apply(self, event: Event) -> None:
            try:
                self.engine().apply(event)
            except InvariantViolationError as err:
                self.failed = True
                record.last_failure = self.engine().trace(note=str(err))
                raise

        @precondition(lambda self: len(self.engine().state.requests) < MAX_LIVE_REQUESTS)
        @rule(data=st.data())
        def add_request(self, data: st.DataObject) -> None:
            checked = self.engine()
            event = data.draw(
                add_request_events(checked.config, f"r{self.next_id}", checked.state.requests)
            )
            self.next_id += 1
            self.apply(event)

        @precondition(lambda self: bool(self.engine().state.requests))
        @rule(data=st.data())
        def abort(self, data: st.DataObject) -> None:
            ids = sorted(self.engine().state.requests)
            victim = data.draw(st.sampled_from(ids))
            # Now and then an id the engine does not know: it must be ignored.
            unknown = data.draw(st.sampled_from(["", "", "", "no-such-request"]))
            self.apply(Abort((victim, unknown) if unknown else (victim,)))

        @precondition(
            lambda self: (
                self.engine().config.num_speculative_tokens > 0
                and bool(self.engine().state.running)
            )
        )
        @rule(data=st.data())
        def propose_drafts(self, data: st.DataObject) -> None:
            checked = self.engine()
            limit = checked.config.num_speculative_tokens
            chosen = data.draw(
                st.lists(
                    st.sampled_from(checked.state.running), min_size=1, max_size=4, unique=True
                )
            )
            counts = {rid: data.draw(st.integers(0, limit)) for rid in chosen}
            self.apply(ProposeDrafts(counts))

        @rule(
            num_steps=st.integers(1, MAX_STEPS_PER_RULE),
            codes=st.integers(0, 2 ** (10 * MAX_STEPS_PER_RULE) - 1),
        )
        def step(self, num_steps: int, codes: int) -> None:
            for _ in range(num_steps):
                self.apply(Step(self._decisions(codes & 0x3FF)))
                codes >>= 10

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
            if self.checked is not None and not self.failed:
                self.apply(Drain())

    return SchedulerMachine
