"""Builders for the invariant tests: real reference runs captured as the transitions the
predicates take, ways to corrupt them, and the case registry that proves no invariant is
vacuous.

A `Case` pairs a state or transition on which an invariant holds (usually a real snapshot
of the reference scheduler) with a corrupted copy on which it must fail, naming the
request or block at fault. Each test module registers its cases in a `CaseRegistry`; the
meta-test checks that every catalogue id has at least one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from schedspec.properties.kv_oracle import KVContentOracle, ScheduledStep
from schedspec.reference import Scheduler, SGLangScheduler
from schedspec.spec import (
    BlockHash,
    KVConnectorOutput,
    KVState,
    ModelRunnerOutput,
    Request,
    SchedulerConfig,
    State,
)
from schedspec.spec.invariants import (
    CATALOGUE,
    CHECKS,
    FAMILY_PROFILES,
    AbortTransition,
    AddTransition,
    ChainHashes,
    Departures,
    DraftsTransition,
    DrainResult,
    Profile,
    ScheduleTransition,
    UpdateTransition,
    Violation,
    drain_step_bound,
    ids_for,
)
from tests.sched_helpers import make_config

DEFAULT_TOKEN = 7  # what a request samples unless a test says otherwise
UNCHECKED: Any = object()  # a Case field the test does not pin down

# ------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Case:
    """One invariant both ways: `good` holds, `bad` breaks it exactly as described.

    message is a fragment the violation's message must contain; request_id and
    block_id (None: none named) and expected / actual (UNCHECKED: not pinned) must
    match the violation exactly. `good` must also pass every other invariant of the
    same kind: it is a real, consistent snapshot, so this guards against false positives.
    """

    invariant: str
    good: object
    bad: object
    message: str
    request_id: str | None = None
    block_id: int | None = None
    expected: Any = UNCHECKED
    actual: Any = UNCHECKED


CaseBuilder = Callable[[], Case]
B = TypeVar("B", bound=CaseBuilder)


class CaseRegistry:
    """The bad-state cases of one test module, keyed by the invariant they exercise."""

    def __init__(self) -> None:
        self.builders: list[tuple[str, CaseBuilder]] = []
        # Cases whose bad half shows a defect of the predicate itself (reported, not
        # fixed here): their "fires" test is a strict xfail, so a fix turns it red.
        self.known_issues: dict[CaseBuilder, str] = {}

    def __call__(self, invariant_id: str, known_issue: str | None = None) -> Callable[[B], B]:
        if invariant_id not in CATALOGUE:
            raise KeyError(f"{invariant_id} is not a catalogue id")

        def register(builder: B) -> B:
            self.builders.append((invariant_id, builder))
            if known_issue is not None:
                self.known_issues[builder] = known_issue
            return builder

        return register

    def ids(self) -> set[str]:
        return {invariant_id for invariant_id, _ in self.builders}

    def params(self, bad: bool = False) -> list[Any]:
        """One pytest param per case; for the bad half, known issues are strict xfails."""
        params = []
        for invariant_id, builder in self.builders:
            issue = self.known_issues.get(builder) if bad else None
            marks = [pytest.mark.xfail(strict=True, reason=issue)] if issue else []
            name = f"{invariant_id}:{builder.__name__.removeprefix('case_')}"
            params.append(pytest.param(builder, id=name, marks=marks))
        return params


def check(invariant_id: str, subject: object) -> list[Violation]:
    found = CHECKS[invariant_id](subject)
    strangers = [v for v in found if v.invariant != invariant_id]
    assert not strangers, f"{invariant_id} returned violations of other ids: {strangers}"
    return found


def _family_profile(subject: object) -> Profile:
    """The family profile of the config a state or transition was taken under."""
    state = subject if isinstance(subject, State) else getattr(subject, "pre", None)
    if state is None:
        state = getattr(subject, "initial")  # noqa: B009  (a DrainResult)
    assert isinstance(state, State)
    return FAMILY_PROFILES[state.config.family]


def _hybrid(subject: object) -> bool:
    """Was the state or transition taken under a config with kv_cache_groups?"""
    state = subject if isinstance(subject, State) else getattr(subject, "pre", None)
    return isinstance(state, State) and bool(state.config.kv_cache_groups)


def assert_holds(case: Case) -> None:
    assert check(case.invariant, case.good) == []
    kind = CATALOGUE[case.invariant].kind
    for other in ids_for(kind, _family_profile(case.good), _hybrid(case.good)):
        assert CHECKS[other](case.good) == [], f"good case of {case.invariant} breaks {other}"


def assert_actionable(violation: Violation) -> None:
    """Every violation says what the spec required, what the engine produced, and where the
    rule is stated, in its fields and in its text."""
    assert violation.expected is not None, f"no expected value: {violation}"
    assert violation.actual is not None, f"no actual value: {violation}"
    assert violation.expected != violation.actual, f"expected equals actual: {violation}"
    assert violation.rule == f"docs/SPEC.md#{violation.invariant.lower()}"
    text = str(violation)
    assert f"expected {violation.expected!r}, actual {violation.actual!r}" in text
    assert violation.rule in text


def assert_caught(case: Case) -> Violation:
    """The bad subject yields a violation of the case's id matching every pinned field."""
    found = check(case.invariant, case.bad)
    assert found, f"{case.invariant} did not fire"
    for violation in found:
        assert_actionable(violation)
    for violation in found:
        if (
            case.message in violation.message
            and violation.request_id == case.request_id
            and violation.block_id == case.block_id
            and (case.expected is UNCHECKED or violation.expected == case.expected)
            and (case.actual is UNCHECKED or violation.actual == case.actual)
        ):
            text = str(violation)
            assert text.startswith(f"[{case.invariant}] ")
            if case.request_id is not None:
                assert f"request {case.request_id!r}" in text
            if case.block_id is not None:
                assert f"block {case.block_id}" in text
            return violation
    pinned = (case.message, case.request_id, case.block_id, case.expected, case.actual)
    raise AssertionError(f"no violation matches {pinned}; got {[str(v) for v in found]}")


# --------------------------------------------------------------- the driver


def tokens(first: int, n: int) -> tuple[int, ...]:
    return tuple(range(first, first + n))


class Driver:
    """The reference scheduler driven by hand; each call returns the transition record the
    invariant predicates take, built the way CheckedEngine builds it.

    Requests sample DEFAULT_TOKEN unless told otherwise; a step that stops inside the
    known tokens (a prefill chunk) samples nothing.
    """

    def __init__(self, **config: Any) -> None:
        self.config: SchedulerConfig = make_config(**config)
        self.scheduler: Scheduler | SGLangScheduler = (
            SGLangScheduler(self.config)
            if self.config.family == "sglang"
            else Scheduler(self.config)
        )
        self.hashes = ChainHashes(self.config.block_size)
        self.kv_content = KVContentOracle(self.hashes)
        self.departures = Departures()

    @property
    def state(self) -> State:
        return self.scheduler.snapshot()

    def add(
        self,
        request_id: str,
        num_prompt_tokens: int = 8,
        *,
        prompt: Sequence[int] | None = None,
        max_tokens: int = 100,
        **kwargs: Any,
    ) -> AddTransition:
        """Add a request; its prompt defaults to distinct tokens per id."""
        if prompt is None:
            prompt = tokens(1000 * (1 + sum(map(ord, request_id))), num_prompt_tokens)
        pre = self.state
        refusal: Exception | None = None
        try:
            self.scheduler.add_request(Request(request_id, prompt, max_tokens, **kwargs))
        except ValueError as err:
            refusal = err
        # The transition holds the request as offered: the scheduler stamps its own copy.
        offered = Request(request_id, prompt, max_tokens, **kwargs)
        return AddTransition(pre, offered, refusal, self.state)

    def schedule(self) -> ScheduleTransition:
        pre = self.state
        output = self.scheduler.schedule()
        post = self.state
        transition = ScheduleTransition(
            pre,
            output,
            post,
            self.hashes,
            frozenset(self.departures.finished),
            dict(self.kv_content.written),
            dict(self.departures.left_running),
            self.departures.last_step,
            None,
            frozenset(self.departures.aborted),
        )
        self.departures.on_schedule(pre, output, post)
        self.kv_content.on_schedule(transition)
        return transition

    def update(
        self,
        scheduled: ScheduleTransition,
        sampled: Mapping[str, Sequence[int]] | None = None,
        report: KVConnectorOutput | None = None,
    ) -> UpdateTransition:
        """Answer a schedule() (with async scheduling, possibly after the next one):
        `sampled` overrides the DEFAULT_TOKEN of any request whose step samples; `report`
        is the KV connector's worker report landing with it."""
        given = dict(sampled or {})
        output = scheduled.output
        pre = self.state
        arrivals = {
            rid: scheduled.post.requests[rid].arrival for rid in output.num_scheduled_tokens
        }
        answer: dict[str, Sequence[int]] = {}
        sampled_at: dict[str, int] = {}
        for rid in output.num_scheduled_tokens:
            request = pre.requests.get(rid)
            if request is None or scheduled.post.requests[rid].is_prefill_chunk:
                continue  # finished meanwhile, or a prefill chunk: nothing sampled
            answer[rid] = given.get(rid, [DEFAULT_TOKEN])
            sampled_at[rid] = request.num_tokens
        model_output = ModelRunnerOutput(sampled_token_ids=answer, kv_connector_output=report)
        reported = self.scheduler.update_from_output(output, model_output)
        post = self.state
        self.kv_content.on_land(
            ScheduledStep.of(output, scheduled.post), pre, model_output, sampled_at
        )
        self.departures.note(pre, post)
        return UpdateTransition(
            pre, output, model_output, post, reported, arrivals, sampled_at, self.hashes
        )

    def step(
        self,
        sampled: Mapping[str, Sequence[int]] | None = None,
        report: KVConnectorOutput | None = None,
    ) -> tuple[ScheduleTransition, UpdateTransition]:
        scheduled = self.schedule()
        return scheduled, self.update(scheduled, sampled, report)

    def steps(self, n: int) -> ScheduleTransition:
        """n steps; the last one's schedule transition."""
        last = None
        for _ in range(n):
            last, _ = self.step()
        assert last is not None
        return last

    def propose(self, drafts: Mapping[str, Sequence[int]]) -> DraftsTransition:
        pre = self.state
        self.scheduler.update_draft_token_ids(drafts)
        proposed = {rid: tuple(d) for rid, d in drafts.items()}
        return DraftsTransition(pre, proposed, self.state)

    def abort(self, *request_ids: str) -> AbortTransition:
        pre = self.state
        self.scheduler.finish_requests(request_ids)
        post = self.state
        self.departures.note_abort(pre, post, request_ids)
        return AbortTransition(pre, request_ids, post)

    def drain(self) -> DrainResult:
        initial = self.state
        bound = drain_step_bound(self.config, len(initial.requests))
        num_steps = 0
        while self.scheduler.has_unfinished_requests() and num_steps <= bound:
            self.step()
            num_steps += 1
        return DrainResult(initial, self.state, num_steps, bound)


# --------------------------------------------------------- shared scenarios

# The SGLang family's chunked-prefill worked examples: token slots as blocks, 8-token
# chunks, the radix cache on.
SGLANG_CHUNKED = {
    "family": "sglang",
    "block_size": 1,
    "num_blocks": 64,
    "max_num_batched_tokens": 8,
    "max_num_seqs": 4,
    "max_model_len": 64,
    "enable_prefix_caching": True,
}


def sglang_refresh_pass_admits_the_head() -> ScheduleTransition:
    """a (5 7) and b (3 4) finish and stay cached (f and g after them bring the pass count
    on); h (5), c (3 9) and e (5 9) wait behind a 57-token prompt chunked two tokens a
    step, with two seats. The 32nd pass refreshes e's prefix, c's, then h's: h touches
    a's first page (block 0) last; then the prompt's last chunk leaves a token of budget
    and h is admitted, its one-token match locking nothing. Block 0 stays evictable as
    recent as h's place, the head's, though e further back starts with it too."""
    driver = Driver(**{**SGLANG_CHUNKED, "max_num_batched_tokens": 2, "max_num_seqs": 2})
    driver.add("a", prompt=(5, 7), max_tokens=1)
    driver.add("b", prompt=(3, 4), max_tokens=1)
    driver.steps(8)
    driver.add("f", prompt=(6, 8), max_tokens=1)
    driver.steps(3)
    driver.add("g", prompt=(7, 8), max_tokens=1)
    driver.steps(3)
    driver.add("long", prompt=(0,) * 57, max_tokens=1)
    for rid, prompt in (("h", (5,)), ("c", (3, 9)), ("e", (5, 9))):
        driver.add(rid, prompt=prompt, max_tokens=1)
    driver.steps(28)
    assert driver.state.sglang is not None and driver.state.sglang.prefill_passes == 32
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"long": 1, "h": 1}
    assert t.post.waiting == ("c", "e")
    return t


def two_running_and_an_admission() -> ScheduleTransition:
    """A and B decoding, C admitted with a 10-token prefill: budget 16 (A 1, B 1, C 10)."""
    driver = Driver(max_num_batched_tokens=16, max_num_seqs=4)
    driver.add("A", 6)
    driver.add("B", 6)
    driver.step()
    driver.add("C", 10)
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"A": 1, "B": 1, "C": 10}
    return t


def preemption_step(policy: str = "fcfs", priorities: tuple[int, int, int] = (0, 0, 0)) -> Driver:
    """A and B decoding in 6 blocks of 4, C waiting; the next schedule() preempts.

    Both prompts are 8 tokens; after 5 steps each holds 3 full blocks (12 computed of
    13 tokens) and the cache is full, so the next step's 13th slot needs a victim.
    """
    driver = Driver(num_blocks=6, max_model_len=24, max_num_seqs=4, policy=policy)
    driver.add("A", 8, priority=priorities[0])
    driver.add("B", 8, priority=priorities[1])
    driver.steps(5)
    driver.add("C", 4, priority=priorities[2])
    assert not driver.state.kv.free_block_ids
    return driver


def served_victim_with_a_chunk_in_flight() -> ScheduleTransition:
    """Async, priority: V (priority 1) prefills 16 tokens in chunks of 10 and 6; A
    (priority 0) is admitted beside V's second chunk. The next step, scheduled before
    that chunk lands, serves V first, then preempts it (max priority) for A's block.
    V's four prompt blocks were all registered when their chunks were scheduled."""
    driver = Driver(
        async_scheduling=True,
        policy="priority",
        enable_prefix_caching=True,
        num_blocks=6,
        max_model_len=24,
        max_num_batched_tokens=10,
        max_num_seqs=4,
    )
    driver.add("V", 16, priority=1)
    first = driver.schedule()
    driver.add("A", 4, priority=0)
    second = driver.schedule()
    assert dict(second.output.num_scheduled_tokens) == {"V": 6, "A": 4}
    driver.update(first)
    t = driver.schedule()
    assert t.output.preempted_req_ids == {"V"}
    return t


def served_victim_with_a_decode_in_flight() -> ScheduleTransition:
    """Async, priority, 4 blocks of 4: V (priority 1, 7-token prompt) prefills; A
    (priority 0, 4 tokens) is admitted beside V's first decode, scheduled before the
    prefill lands. Once it lands, V's block 1 (tokens 4-7) is full of known tokens, but
    the decode in flight still writes position 7, so the landing does not register it.
    The next step serves V first (its position 8 takes the last free block), which
    registers block 1; then A's position 4 needs a block and V, the least urgent, is
    preempted. Its block 1 keeps the registration: its KV is being written."""
    driver = Driver(
        async_scheduling=True,
        policy="priority",
        enable_prefix_caching=True,
        num_blocks=4,
        max_model_len=16,
        max_num_seqs=4,
    )
    driver.add("V", 7, priority=1)
    first = driver.schedule()
    driver.add("A", 4, priority=0)
    second = driver.schedule()
    assert dict(second.output.num_scheduled_tokens) == {"V": 1, "A": 4}
    driver.update(first)
    t = driver.schedule()
    assert dict(t.output.num_scheduled_tokens) == {"A": 1}
    assert t.output.preempted_req_ids == {"V"}
    v = t.pre.requests["V"]
    assert (v.num_computed_tokens, v.num_in_flight_tokens, v.num_tokens) == (8, 1, 8)
    assert t.pre.kv.block_hashes[v.block_ids[1]] is None
    return t


def fcfs_preemption() -> ScheduleTransition:
    """fcfs: A's new block preempts B (running[-1]); C waits behind B."""
    t = preemption_step().schedule()
    assert t.output.preempted_req_ids == {"B"}
    assert dict(t.output.num_scheduled_tokens) == {"A": 1}
    assert t.post.waiting == ("B", "C")
    return t


# --------------------------------------------------------------- corruption


def with_request(state: State, request_id: str, **changes: Any) -> State:
    """The state with one request's fields replaced."""
    requests = dict(state.requests)
    requests[request_id] = dataclasses.replace(requests[request_id], **changes)
    return dataclasses.replace(state, requests=requests)


def without_request(state: State, request_id: str) -> State:
    requests = {rid: r for rid, r in state.requests.items() if rid != request_id}
    return dataclasses.replace(
        state,
        requests=requests,
        waiting=tuple(r for r in state.waiting if r != request_id),
        running=tuple(r for r in state.running if r != request_id),
    )


def with_kv(state: State, **changes: Any) -> State:
    return dataclasses.replace(state, kv=dataclasses.replace(state.kv, **changes))


def with_config(state: State, **changes: Any) -> State:
    """The state seen under another config (validated like any config)."""
    return dataclasses.replace(state, config=dataclasses.replace(state.config, **changes))


def with_ref_count(kv: KVState, block: int, ref: int) -> tuple[int, ...]:
    refs = list(kv.ref_counts)
    refs[block] = ref
    return tuple(refs)


def with_block_hash(kv: KVState, block: int, block_hash: BlockHash | None) -> tuple[Any, ...]:
    hashes = list(kv.block_hashes)
    hashes[block] = block_hash
    return tuple(hashes)


def with_output(t: ScheduleTransition, **changes: Any) -> ScheduleTransition:
    return dataclasses.replace(t, output=dataclasses.replace(t.output, **changes))


def with_scheduled(t: ScheduleTransition, num_scheduled: Mapping[str, int]) -> ScheduleTransition:
    """num_scheduled_tokens replaced (in the given order) and the total kept consistent."""
    return with_output(
        t,
        num_scheduled_tokens=dict(num_scheduled),
        total_num_scheduled_tokens=sum(num_scheduled.values()),
    )


def reordered(items: Iterable[str], first: str) -> tuple[str, ...]:
    """`first` moved to the front."""
    rest = [i for i in items if i != first]
    return (first, *rest)


def _refresh_behind_a_chunked_prompt(
    cached: tuple[tuple[int, ...], tuple[int, ...]],
    waiting: tuple[tuple[int, ...], tuple[int, ...]],
) -> ScheduleTransition:
    """a and b (`cached`) finish and stay cached; c and d (`waiting`) then wait behind a
    50-token prompt chunked a token a step, one pass a step, until the pass that finds 32
    passes counted refreshes the waiting prefixes (d's first, then c's): that step."""
    driver = Driver(**{**SGLANG_CHUNKED, "max_num_batched_tokens": 1, "max_num_seqs": 1})
    for rid, prompt in zip("ab", cached, strict=True):
        driver.add(rid, prompt=prompt, max_tokens=1)
    driver.steps(8)
    driver.add("long", prompt=(0,) * 50, max_tokens=1)
    driver.step()
    for rid, prompt in zip("cd", waiting, strict=True):
        driver.add(rid, prompt=prompt, max_tokens=1)
    # 28 steps bring the count from 4 to 32.
    driver.steps(28)
    assert driver.state.sglang is not None and driver.state.sglang.prefill_passes == 32
    t = driver.schedule()
    assert t.post.waiting == ("c", "d")
    return t


def evictable_blocks(state: State) -> list[int]:
    """The free blocks with a hash (SGLang's evictable tail), in free-queue order."""
    kv = state.kv
    return [b for b in kv.free_block_ids if kv.block_hashes[b] is not None]


def sglang_waiting_prefix_refresh() -> ScheduleTransition:
    """a (prompt 1 2) and b (3 4) cached, c (1 9) and d (3 9) waiting: the refresh leaves
    b's first page (block 2, d's) to be evicted before a's (block 0, c's)."""
    t = _refresh_behind_a_chunked_prompt(((1, 2), (3, 4)), ((1, 9), (3, 9)))
    assert evictable_blocks(t.post) == [1, 3, 2, 0]
    return t


def sglang_refresh_of_deeper_pages() -> ScheduleTransition:
    """a (prompt 1 2) and b (1 3) cached, sharing their first page; c (1 2 9) and d
    (1 3 9) waiting: the refresh leaves b's second page (block 2, d's alone) to be
    evicted before a's (block 1, c's), and the shared first page (block 0, c's at the
    head) last."""
    t = _refresh_behind_a_chunked_prompt(((1, 2), (1, 3)), ((1, 2, 9), (1, 3, 9)))
    assert evictable_blocks(t.post) == [2, 1, 0]
    return t
