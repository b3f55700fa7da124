"""An engine under the harness: every event applied, every invariant of a profile checked.

The state machine, trace replay and the differential runner all drive
engines through this one class, so a trace found by one replays in the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schedspec.engines.boundary import guarded
from schedspec.engines.contract import malformed_output, malformed_state
from schedspec.engines.errors import EngineContractError, engine_call_of
from schedspec.engines.events import (
    Abort,
    AddRequest,
    Drain,
    Event,
    KVTransfers,
    ProposeDrafts,
    Step,
)
from schedspec.engines.fake_model import FakeModel, StepDecisions
from schedspec.engines.pipeline import BatchQueue
from schedspec.engines.profiles import choose_profile, claimed_profiles
from schedspec.engines.protocol import EngineAdapter, EngineFactory
from schedspec.properties import corners
from schedspec.properties.connector_worker import reports_pending, worker_output
from schedspec.properties.kv_oracle import KVContentOracle, ScheduledStep
from schedspec.spec import SchedulerConfig, SchedulerOutput, State
from schedspec.spec.invariants import (
    CATALOGUE,
    CHECKS,
    AbortTransition,
    AddTransition,
    ChainHashes,
    Departures,
    DraftsTransition,
    DrainResult,
    Kind,
    PassedOver,
    Profile,
    ScheduleTransition,
    UpdateTransition,
    Violation,
    drain_step_bound,
    ids_for,
    passed_over_after,
)
from schedspec.spec.invariants.safety import state_fast_path
from schedspec.traces.trace import ModelParams, Trace

DEFAULT_MODEL = ModelParams()
NO_TRANSFERS = KVTransfers()


class InvariantViolationError(AssertionError):
    """Raised at the first event after which some invariant fails."""

    def __init__(self, event_index: int, event: Event, violations: Sequence[Violation]) -> None:
        lines = [f"after event {event_index} ({type(event).__name__}):"]
        lines += [f"  {v}" for v in violations]
        super().__init__("\n".join(lines))
        self.event_index = event_index
        self.event = event
        self.violations = tuple(violations)


@dataclass
class CheckStats:
    """What a run checked: how often each invariant ran, steps and events."""

    # Counted per kind (each run of a kind runs all its invariants): cheaper
    # than one counter per invariant in the hot loop.
    # Keyed by kind, profile and whether the config was hybrid (kv_cache_groups): the
    # invariants a run of a kind checks depend on all three.
    kind_runs: dict[tuple[Kind, Profile, bool], int] = field(default_factory=dict)
    steps: int = 0
    events: int = 0
    # Named corner (corners.CORNERS) -> times the run reached it.
    corners: dict[str, int] = field(default_factory=dict)

    @property
    def hybrid_seen(self) -> frozenset[bool]:
        """Whether the run's configs had kv_cache_groups: {False}, {True} or both
        ({False} before anything ran, the default config's)."""
        return frozenset(hybrid for _, _, hybrid in self.kind_runs) or frozenset({False})

    @property
    def checks(self) -> dict[str, int]:
        """Invariant id -> times checked."""
        counts: dict[str, int] = {}
        for (kind, profile, hybrid), runs in self.kind_runs.items():
            for invariant_id in ids_for(kind, profile, hybrid):
                counts[invariant_id] = counts.get(invariant_id, 0) + runs
        return counts


class CheckedEngine:
    def __init__(
        self,
        engine: EngineAdapter,
        config: SchedulerConfig,
        profile: Profile,
        model: ModelParams = DEFAULT_MODEL,
        stats: CheckStats | None = None,
    ) -> None:
        choose_profile([claimed_profiles(engine)], profile)
        self.engine = engine
        self.config = config
        self.profile = profile
        self.model_params = model
        self.model = FakeModel(
            seed=model.seed,
            vocab_size=model.vocab_size,
            draft_acceptance=model.draft_acceptance,
            num_speculative_tokens=config.num_speculative_tokens,
        )
        self.events: list[Event] = []  # every event applied, for the trace
        self.stats = stats if stats is not None else CheckStats()
        # What the engine returned during the current event, (call, value): read only
        # when the harness fails, to tell a malformed return from a harness bug.
        self._returned: list[tuple[str, object]] = []
        self.state = self._snapshot()
        self._hashes = ChainHashes(config.block_size)
        self._kv_content = KVContentOracle(self._hashes)
        self._departures = Departures()
        # The waiting head and how often steps passed it over while nothing ran: the
        # history PROGRESS judges each step against (liveness.passed_over_after).
        self._head_passed_over: PassedOver | None = None
        self._in_flight: BatchQueue[ScheduledStep] = BatchQueue(config)
        # Requests whose send, once they finish, the connector's worker never reports.
        self._sends_never_finish: set[str] = set()
        self._hybrid = bool(config.kv_cache_groups)
        self._checks = {
            kind: [CHECKS[i] for i in ids_for(kind, profile, self._hybrid)]
            for kind in CATALOGUE_KINDS
        }
        # The fused fast path, walking again only what changed since the last state it
        # vouched for.
        self._state_fast_path = state_fast_path.StateFastPath()
        # What still runs on a state the fused fast path vouched for. The fast path is
        # the single group's (it reads block_ids at config.block_size): a hybrid state
        # runs the named predicates.
        self._unfused_state_checks = [
            CHECKS[i]
            for i in ids_for("state", profile, self._hybrid)
            if i not in state_fast_path.FAST_PATH_IDS
        ]

    @staticmethod
    def from_factory(
        factory: EngineFactory,
        config: SchedulerConfig,
        profile: Profile,
        model: ModelParams = DEFAULT_MODEL,
        stats: CheckStats | None = None,
    ) -> CheckedEngine:
        """The factory's engine, built and called through engine_boundary's door (so
        whatever it raises is attributed to it), under the harness."""
        return CheckedEngine(guarded(factory)(config), config, profile, model, stats)

    def trace(self, note: str = "") -> Trace:
        return Trace(self.config, tuple(self.events), self.model_params, note)

    # ------------------------------------------------------------------ events

    def apply(self, event: Event) -> None:
        """Apply one event and check every invariant it concerns; raise InvariantViolationError.

        Anything else raised outside an engine call is checked against what the engine
        returned during the event: a malformed State or SchedulerOutput makes it the
        engine's error (EngineContractError), otherwise it is the harness's own."""
        self.events.append(event)
        self.stats.events += 1
        self._returned.clear()
        try:
            violations = self._dispatch(event)
        except Exception as err:
            if engine_call_of(err) is None:
                lie = self._malformed_return()
                if lie is not None:
                    raise lie from err
            raise
        if violations:
            raise InvariantViolationError(len(self.events) - 1, event, violations)

    def _snapshot(self) -> State:
        state = self.engine.snapshot()
        self._returned.append(("snapshot()", state))
        return state

    def _malformed_return(self) -> EngineContractError | None:
        """The first malformed value the engine returned during the event, as an error."""
        for index, (call, value) in enumerate(self._returned):
            if call == "schedule()":
                after = next((v for c, v in self._returned[index + 1 :] if c == "snapshot()"), None)
                usable = after if isinstance(after, State) and not malformed_state(after) else None
                found = malformed_output(value, usable)
            else:
                found = malformed_state(value)
            if found is not None:
                return EngineContractError(call, f"returned a malformed value: it {found}")
        return None

    def _dispatch(self, event: Event) -> list[Violation]:
        if isinstance(event, AddRequest):
            return self._add(event)
        if isinstance(event, Abort):
            return self._abort(event)
        if isinstance(event, ProposeDrafts):
            return self._propose(event)
        if isinstance(event, Step):
            return self._step(event)
        return self._drain(event)

    def _run(self, kind: Kind, subject: object) -> list[Violation]:
        key = (kind, self.profile, self._hybrid)
        runs = self.stats.kind_runs
        runs[key] = runs.get(key, 0) + 1
        checks = self._checks[kind]
        # One fused pass vouches for most state invariants; only when it cannot
        # do the named predicates run (and word what they find).
        if (
            kind == "state" and not self._hybrid and self._state_fast_path.holds(subject)  # type: ignore[arg-type]
        ):
            checks = self._unfused_state_checks
        # Almost every check finds nothing: a plain loop that only extends on a find
        # costs less per check than a nested comprehension (the verdicts, in the same
        # order, are the same).
        violations: list[Violation] = []
        for check in checks:
            found = check(subject)
            if found:
                violations.extend(found)
        return violations

    def _add(self, event: AddRequest) -> list[Violation]:
        pre = self.state
        refusal: Exception | None = None
        try:
            # The engine gets its own object (it sets the arrival index on it);
            # the DOOR invariant judges the request as it was offered.
            self.engine.add_request(event.to_request())
        except Exception as err:  # the DOOR invariant judges the refusal
            # Its type and message, that is: without the traceback, whose frames (this
            # one among them) would hold the exception in a reference cycle, and with
            # it the whole example until the garbage collector ran.
            refusal = err.with_traceback(None)
        self.state = self._snapshot()
        offered = event.to_request()
        if refusal is None and event.remote_kv is not None and event.remote_kv.send_never_finishes:
            self._sends_never_finish.add(event.request_id)
        return self._run("add", AddTransition(pre, offered, refusal, self.state)) + self._run(
            "state", self.state
        )

    def _abort(self, event: Abort) -> list[Violation]:
        return self._finish(event.request_ids)

    def _finish(
        self, request_ids: tuple[str, ...], landing: SchedulerOutput | None = None
    ) -> list[Violation]:
        """finish_requests (an abort), between engine steps or inside one (Step.aborts;
        `landing`: the step whose output lands next, already out of the queue)."""
        pre = self.state
        self.engine.finish_requests(request_ids)
        self.state = self._snapshot()
        self._departures.note_abort(pre, self.state, request_ids)
        transition = AbortTransition(pre, request_ids, self.state)
        found = self._run("abort", transition) + self._run("state", self.state)
        # Any step still in flight counts: vLLM's batch queue and SGLang's overlap
        # loop both apply an abort that arrives between engine steps with one there.
        in_flight = [step.output for step in self._in_flight]
        if landing is not None:
            in_flight.append(landing)
        corners.count_reached(
            corners.count_abort_in_flight,
            bool(found),
            self.stats.corners,
            in_flight,
            request_ids,
            pre,
        )
        return found

    def _propose(self, event: ProposeDrafts) -> list[Violation]:
        if self.config.async_scheduling:
            # vLLM's engine core never calls update_draft_token_ids under async
            # scheduling: the model runner fills the placeholder drafts itself.
            return []
        drafts = {rid: tuple(self.model.drafts_for(rid, k)) for rid, k in event.num_drafts.items()}
        pre = self.state
        self.engine.update_draft_token_ids(drafts)
        self.state = self._snapshot()
        transition = DraftsTransition(pre, drafts, self.state)
        corners.count_drafts(self.stats.corners, transition)
        return self._run("drafts", transition) + self._run("state", self.state)

    def _step(self, event: Step, drain: bool = False) -> list[Violation]:
        """One engine step, in the engine core's order (pipeline.BatchQueue): schedule
        (a synchronous step always does), then land the oldest step in flight once the
        queue is full or nothing more can be scheduled. The step's decisions shape the
        output that lands; its aborts apply where the engine's loop applies them
        (events.Step): in vLLM's, just before the landing step's update_from_output,
        otherwise after the step."""
        at_landing = event.aborts if self.config.family == "vllm" else ()
        queue = self._in_flight
        if queue.schedules(self._has_requests()):
            scheduled, found = self._schedule()
            if found:
                return found  # the model cannot answer an output that broke the rules
            executed = scheduled.output.total_num_scheduled_tokens > 0
            if not queue.push(scheduled, executed, self._has_requests()):
                return self._finish(event.aborts) if event.aborts else []
        elif not queue:
            return self._finish(event.aborts) if event.aborts else []
        transfers = None if drain else event.kv
        found = self._land(queue.pop(), event.decisions, at_landing, transfers)
        if found or not event.aborts or at_landing:
            return found
        return self._finish(event.aborts)

    def _has_requests(self) -> bool:
        """vLLM's has_requests: unfinished requests, finished ones not yet reported, or
        finished ones whose blocks the KV connector still holds for a report to come."""
        # (A send that is never reported would keep vLLM's loop stepping for ever: the
        # harness stops stepping for it.)
        held = reports_pending(self.state, frozenset(self._sends_never_finish))
        return bool(self.state.requests or self._departures.finished or held)

    def _schedule(self) -> tuple[ScheduledStep, list[Violation]]:
        self.stats.steps += 1
        pre = self.state
        output = self.engine.schedule()
        self._returned.append(("schedule()", output))
        mid = self._snapshot()
        self._kv_content.on_sync_loads(output, mid)
        scheduled = ScheduleTransition(
            pre,
            output,
            mid,
            self._hashes,
            frozenset(self._departures.finished),
            self._kv_content.written,
            dict(self._departures.left_running),
            self._departures.last_step,
            self._head_passed_over,
            frozenset(self._departures.aborted),
        )
        found = self._run("schedule", scheduled) + self._run("state", mid)
        self.state = mid
        deferred: frozenset[str] = frozenset()
        corners.count_reached(corners.count_schedule, bool(found), self.stats.corners, scheduled)
        if not found:
            self._head_passed_over = passed_over_after(scheduled)
            self._departures.on_schedule(pre, output, mid)
            deferred = self._kv_content.on_schedule(scheduled)
        return ScheduledStep.of(output, mid, deferred), found

    def _land(
        self,
        step: ScheduledStep,
        decisions: StepDecisions,
        aborts: tuple[str, ...] = (),
        transfers: KVTransfers | None = NO_TRANSFERS,
    ) -> list[Violation]:
        """Run the model on the oldest step in flight, apply the aborts that arrived while
        it ran, then apply its output, with the KV connector's worker reports
        (connector_worker.worker_output; transfers None: a drain's, every one due)."""
        output = step.output
        model_output = self.model.execute(output, decisions)
        if aborts:
            found = self._finish(aborts, landing=output)
            if found:
                return found
        report = worker_output(transfers, self.state, frozenset(self._sends_never_finish))
        if report is not None:
            model_output = dataclasses.replace(model_output, kv_connector_output=report)
        pre = self.state
        request_outputs = self.engine.update_from_output(output, model_output)
        post = self._snapshot()
        sampled_at = self.model.sampled_at
        self._kv_content.on_land(step, pre, model_output, sampled_at)
        if report is not None and report.finished_recving:
            self._kv_content.on_loads_landed(pre, post, report.finished_recving)
        if len(self._in_flight) == 1:  # the step after this one now starts where it is sure
            (following,) = self._in_flight
            self._kv_content.on_start_certain(following, pre, post, model_output, sampled_at)
        self._departures.note(pre, post)
        self.state = post
        updated = UpdateTransition(
            pre,
            output,
            model_output,
            post,
            request_outputs,
            step.arrivals,
            dict(self.model.sampled_at),
            self._hashes,
        )
        corners.count_update(self.stats.corners, updated)
        return self._run("update", updated) + self._run("state", post)

    def _drain(self, event: Drain) -> list[Violation]:
        initial = self.state
        unready = [
            r.remote_kv.num_unready_queries for r in initial.requests.values() if r.remote_kv
        ]
        bound = drain_step_bound(self.config, len(initial.requests), max(unready, default=0))
        steps = 0
        never = frozenset(self._sends_never_finish)
        while (
            self.state.requests or self._in_flight or reports_pending(self.state, never)
        ) and steps <= bound:
            found = self._step(Step(), drain=True)
            steps += 1
            if found:
                return found
        return self._run("drain", DrainResult(initial, self.state, steps, bound, never))


CATALOGUE_KINDS: tuple[Kind, ...] = (
    "state",
    "add",
    "schedule",
    "update",
    "drafts",
    "abort",
    "drain",
)
assert {i.kind for i in CATALOGUE.values()} <= set(CATALOGUE_KINDS)


def replay(
    trace: Trace,
    factory: EngineFactory,
    profile: Profile,
    on_event: Callable[[int, Event], None] | None = None,
) -> CheckedEngine:
    """Re-run a trace on an engine; raises InvariantViolationError at the first broken event."""
    checked = CheckedEngine.from_factory(factory, trace.config, profile, trace.model)
    for index, event in enumerate(trace.events):
        if on_event is not None:
            on_event(index, event)
        checked.apply(event)
    return checked
