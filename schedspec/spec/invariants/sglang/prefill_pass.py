"""SGLang's prefill pass, recounted from a schedule transition: what its PrefillAdder
reserved and what its budgets had left before each admission, bounded both ways.

The `sglang` profile's admission invariants (sglang/admission.py) judge a step by
these figures: an admission must have fitted (the upper bounds), and a refusal must
have had a reason (the lower bounds). A figure is exact where the abstract state
shows all it depends on; it is an interval where the state leaves something open:
- which running requests SGLang's overlap loop already left out of the running batch
  (those whose result in flight reaches their max_new_tokens; docs/SPEC.md, "Async
  scheduling");
- the free slots the step's start may add (a pending abort of the chunked request,
  duplicates its cached chunk frees);
- the evictable slots the admissions' matched prefixes lock.
The arithmetic is spec.sglang_arithmetic's, which the reference's SGLang family runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedspec.spec.arithmetic import cdiv
from schedspec.spec.block_hash import BlockHash
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.invariants.transitions import ScheduleTransition
from schedspec.spec.request import RequestStatus, sglang_max_new_tokens
from schedspec.spec.sglang_arithmetic import (
    CLIP_MAX_NEW_TOKENS,
    prefill_budgets,
    running_reservation,
)
from schedspec.spec.state import RequestState, SGLangState

# Float sums in another order than the engine's may differ in the last bits.
TOLERANCE = 1e-9


@dataclass(frozen=True)
class Span:
    """A figure the pass worked with, between lo and hi."""

    lo: float
    hi: float

    def __add__(self, other: float | Span) -> Span:
        if isinstance(other, Span):
            return Span(self.lo + other.lo, self.hi + other.hi)
        return Span(self.lo + other, self.hi + other)

    def __sub__(self, other: float | Span) -> Span:
        if isinstance(other, Span):
            return Span(self.lo - other.hi, self.hi - other.lo)
        return Span(self.lo - other, self.hi - other)


@dataclass(frozen=True)
class Before:
    """The adder's figures just before it considers one waiting request."""

    # What the pass reserved so far (SGLang's total_offset): running requests at the
    # ratio, the mixed step's decodes, the chunked request's chunk, earlier admissions.
    reserved: Span
    # Whether every reserved term is a whole number: then the engine's float sum is
    # exact, and so is its strict fit test.
    reserved_exact: bool
    # rem_input_tokens and rem_chunk_tokens (None: chunked prefill is off).
    rem_input: Span
    rem_chunk: Span | None
    # Requests in the adder's can_run_list so far (the chunked request's chunk first).
    num_can_run: int
    # Evictable blocks that the matched prefixes of earlier admissions locked.
    locked: frozenset[int]

    def charged(self, extend: int, page: int, future: int, locked: frozenset[int]) -> Before:
        """The figures after the adder takes an extend (_update_prefill_budget): its
        page-ceiled extend and a page reserved now and `future` tokens later, the
        budgets paying the page-ceiled extend; `locked` adds to what is locked."""
        paged = ceil_paged(extend, page)
        rem_chunk = self.rem_chunk - paged if self.rem_chunk is not None else None
        return Before(
            self.reserved + (paged + page + future),
            self.reserved_exact,
            self.rem_input - paged,
            rem_chunk,
            self.num_can_run + 1,
            self.locked | locked,
        )


def ceil_paged(tokens: int, page: int) -> int:
    return cdiv(tokens, page) * page


def max_new_tokens(config: SchedulerConfig, request: RequestState) -> int:
    """SGLang's max_new_tokens for the request: its max_tokens, except where SGLang
    clipped it to 0 (the state shows at least 1)."""
    if sglang_max_new_tokens(config, len(request.prompt_token_ids), request.max_tokens) == 0:
        return 0
    return request.max_tokens


def reserved_new_tokens(config: SchedulerConfig, request: RequestState) -> int:
    """What admission reserves for a request's outputs once its prefill is whole: its
    whole max_new_tokens (clipped), whatever it already decoded."""
    return min(max_new_tokens(config, request), CLIP_MAX_NEW_TOKENS)


def remaining_new_tokens(config: SchedulerConfig, request: RequestState) -> int:
    """What the fit test counts of a waiting request's future outputs."""
    left = max_new_tokens(config, request) - len(request.output_token_ids)
    return min(max(left, 0), CLIP_MAX_NEW_TOKENS)


def maybe_out_of_batch(config: SchedulerConfig, request: RequestState) -> bool:
    """Could SGLang's overlap loop have left this running request out of its running
    batch (its result in flight reaches max_new_tokens)?"""
    in_flight = request.num_output_placeholders
    return len(request.output_token_ids) + in_flight >= max_new_tokens(config, request)


@dataclass(frozen=True)
class RunningBatch:
    """The running batch the pass starts from: pre.running less the chunked request,
    split into the requests surely in it and those the overlap loop may have left out.

    A request the previous step scheduled is in it (the loop leaves a request out at
    the step that would decode it); one the previous decode or mixed step did not
    schedule was left out (such a step decodes its whole batch); otherwise only a
    result in flight that reaches max_new_tokens makes it uncertain."""

    sure: tuple[RequestState, ...]
    maybe: tuple[RequestState, ...]

    @staticmethod
    def of(t: ScheduleTransition) -> RunningBatch:
        state = t.pre
        policy = state.sglang
        chunked = policy.chunked_request_id if policy is not None else None
        decoded_all = policy is not None and policy.last_batch_kind in ("decode", "mixed")
        sure: list[RequestState] = []
        maybe: list[RequestState] = []
        for rid in state.running:
            request = state.requests[rid]
            if rid == chunked or request.status is not RequestStatus.RUNNING:
                continue
            if rid in t.previous_step or not maybe_out_of_batch(state.config, request):
                sure.append(request)
            elif not decoded_all:
                maybe.append(request)
        return RunningBatch(tuple(sure), tuple(maybe))

    def size(self) -> Span:
        return Span(len(self.sure), len(self.sure) + len(self.maybe))


def _reservations(
    config: SchedulerConfig, requests: Sequence[RequestState], ratio: float
) -> list[float]:
    return [
        running_reservation(max_new_tokens(config, r) - len(r.output_token_ids), ratio)
        for r in requests
    ]


def admissions_in_batch_order(t: ScheduleTransition) -> list[str]:
    """The requests the step took from the waiting queue, in batch order (SGLang's
    can_run_list order)."""
    return [r for r in t.output.num_scheduled_tokens if r in t.admitted_ids]


_last_pass: PrefillPass | None = None


class PrefillPass:
    """The step's prefill pass, recounted: one Before per admission, and one for the
    first waiting request left waiting (if any), in queue order."""

    def __init__(self, t: ScheduleTransition, policy: SGLangState) -> None:
        self.t = t
        config = t.pre.config
        self.config = config
        self.page = config.block_size
        self.policy = policy
        self.batch = RunningBatch.of(t)
        scheduled = t.output.num_scheduled_tokens
        self.admitted = admissions_in_batch_order(t)
        chunked = policy.chunked_request_id
        self.chunked = chunked if chunked is not None and chunked in t.pre.requests else None
        self.chunk = scheduled.get(self.chunked, 0) if self.chunked is not None else 0
        post_policy = t.post.sglang
        self.chunked_after = post_policy.chunked_request_id if post_policy is not None else None
        # Free blocks that keep a hash (evictable), by hash; and every cached hash.
        hashes = t.pre.kv.block_hashes
        self.evictable_by_hash = {
            hashes[b]: b for b in t.pre.kv.free_block_ids if hashes[b] is not None
        }
        self.cached = {h for h in hashes if h is not None}
        self._freed = self._freed_by_the_start()
        self.start, self.befores = self._recount()

    @staticmethod
    def of(t: ScheduleTransition, policy: SGLangState) -> PrefillPass:
        """The transition's pass, recounted once for all the checks that read it (the
        sglang profile's and the corners', one after another on the same transition)."""
        global _last_pass
        if _last_pass is None or _last_pass.t is not t:
            _last_pass = PrefillPass(t, policy)
        return _last_pass

    # ------------------------------------------------------------------ available

    def available(self, locked: frozenset[int]) -> Span:
        """available_and_evictable() when the adder asks: the free and evictable slots,
        less (at least) those the matched prefixes locked, plus (at most) what the
        step's start frees of the chunked request: all of its slots under a pending
        abort, else those whose content the tree already holds (caching its chunk
        frees them as duplicates)."""
        free = len(self.t.pre.kv.free_block_ids)
        return Span((free - len(locked)) * self.page, (free + self._freed) * self.page)

    def _freed_by_the_start(self) -> int:
        """At most the chunked request's blocks the step's start frees."""
        if self.chunked is None:
            return 0
        request = self.t.pre.requests[self.chunked]
        if request.abort_pending:
            return len(request.block_ids)
        if self.config.enable_prefix_caching:
            return self._duplicates(request)
        return 0

    def _duplicates(self, request: RequestState) -> int:
        """The request's computed full pages whose content another block already caches."""
        hashes = self.t.pre.kv.block_hashes
        own = self.t.hashes.of(request)[: request.num_computed_tokens // self.page]
        duplicates = 0
        for block, h in zip(request.block_ids, own, strict=False):
            if h in self.cached and hashes[block] != h:
                duplicates += 1
        return duplicates

    def matched_blocks(self, request: RequestState, num_tokens: int) -> frozenset[int]:
        """The evictable blocks on the request's first num_tokens tokens' cached path."""
        own: Sequence[BlockHash] = self.t.hashes.of(request)[: num_tokens // self.page]
        return frozenset(self.evictable_by_hash[h] for h in own if h in self.evictable_by_hash)

    def longest_match(self, request: RequestState) -> int:
        """Tokens of the request's cached prefix in the pre state (whole pages, never
        its last token): SGLang's match is at least this long."""
        if not self.config.enable_prefix_caching:
            return 0
        limit = max(request.num_tokens - 1, 0) // self.page
        matched = 0
        for h in self.t.hashes.of(request)[:limit]:
            if h not in self.cached:
                break
            matched += 1
        return matched * self.page

    # ------------------------------------------------------------------ the recount

    def _recount(self) -> tuple[Before, list[Before]]:
        """The figures before the chunked request's chunk, and before each admission
        and the first refusal."""
        config, page, t = self.config, self.page, self.t
        ratio = self.policy.new_token_ratio
        sure = _reservations(config, self.batch.sure, ratio)
        maybe = _reservations(config, self.batch.maybe, ratio)
        reserved = Span(sum(sure), sum(sure) + sum(maybe))
        exact = not maybe and all(float(x).is_integer() for x in sure)
        budgets = prefill_budgets(config)
        rem_input = Span(budgets.max_prefill_tokens, budgets.max_prefill_tokens)
        rem_chunk = (
            None
            if budgets.chunked_prefill_size is None
            else Span(budgets.chunked_prefill_size, budgets.chunked_prefill_size)
        )
        if config.enable_mixed_chunk:
            # The adder charges one token per running request to both budgets and
            # both offsets, whether or not the step ends up mixed.
            mixed = self.batch.size()
            reserved = reserved + mixed
            rem_input = rem_input - mixed
            rem_chunk = rem_chunk - mixed if rem_chunk is not None else None
        start = Before(reserved, exact, rem_input, rem_chunk, 0, frozenset())
        before = start
        if self.chunked is not None and self.chunk:
            request = t.pre.requests[self.chunked]
            done = self.chunked_after != self.chunked
            future = reserved_new_tokens(config, request) if done else 0
            before = before.charged(self.chunk, page, future, frozenset())
        befores = [before]
        for rid in self.admitted:
            request = t.pre.requests[rid]
            future = 0 if self.chunked_after == rid else reserved_new_tokens(config, request)
            prefix = t.computed_before.get(rid, 0)
            before = before.charged(
                t.output.num_scheduled_tokens[rid],
                page,
                future,
                self.matched_blocks(request, prefix),
            )
            befores.append(before)
        return start, befores

    # ------------------------------------------------------------------ the verdicts

    @property
    def refused(self) -> RequestState | None:
        """The first waiting request the pass left waiting, if any."""
        waiting = self.t.pre.waiting
        if len(self.admitted) >= len(waiting):
            return None
        return self.t.pre.requests[waiting[len(self.admitted)]]

    @property
    def at_refusal(self) -> Before:
        """The figures after the last admission (before the refused request, if any)."""
        return self.befores[len(self.admitted)]

    def room_for(self, request: RequestState | None) -> Span:
        """What the fit test compares a refused request's future with (or, for None,
        what is left after the last admission): the available slots, less those its
        matched prefix locks, less what the pass reserved."""
        before = self.at_refusal
        locked = before.locked
        if request is not None:
            locked = locked | self.matched_blocks(request, self.longest_match(request))
        return self.available(locked) - before.reserved

    def largest_future(self, request: RequestState | None) -> int:
        """The refused request's future at its shortest possible prefix match (0: none)."""
        if request is None:
            return 0
        return self.future(request, self.longest_match(request))

    def surely_fits(self, request: RequestState | None) -> bool:
        """Does the refused request's future (or, for None, a future of 0 tokens) fit
        for certain, whatever the state leaves open?"""
        return self.largest_future(request) < self.room_for(request).lo - TOLERANCE

    def future(self, request: RequestState, prefix: int) -> int:
        """The fit test's total_tokens: the extend, the outputs to come, a page."""
        extend = request.num_tokens - prefix
        return extend + remaining_new_tokens(self.config, request) + self.page

    def chunk_extend(self, request: RequestState, prefix: int, rem_chunk: float) -> int:
        """The extend SGLang gives a waiting request under a chunk budget: all of it if
        its page-ceiled extend fits the budget, else up to the budget's last whole page
        (0: it cannot start)."""
        extend = request.num_tokens - prefix
        if ceil_paged(extend, self.page) <= rem_chunk:
            return extend
        page = self.page
        chunk = int(rem_chunk) // page * page
        return max((prefix + chunk) // page * page - prefix, 0)

    def chunk_room(self) -> Span | None:
        """The room the reservations leave the chunked request's next chunk
        (add_chunked_req's min(rem_chunk_tokens, remaining_total)), bounded both ways;
        None without chunked prefill."""
        rem_chunk = self.start.rem_chunk
        if rem_chunk is None:
            return None
        available = self.available(frozenset())
        return Span(
            min(rem_chunk.lo, int(available.lo - self.start.reserved.hi)),
            min(rem_chunk.hi, int(available.hi - self.start.reserved.lo)),
        )

    def seats_left(self, num_can_run: int) -> Span:
        """_num_allocatable less what the pass already took: seats under
        max_running_requests and free request rows. Rows are held by the running list
        and by any request holding blocks; the chunked request's row is its own."""
        pre = self.t.pre
        cap = self.config.max_num_seqs
        running = set(pre.running)
        rows = sum(1 for r in pre.requests.values() if r.request_id in running or r.block_ids)
        held = 1 if self.chunk else 0
        size = self.batch.size()
        lo = min(cap - size.hi, cap - rows + held) - num_can_run
        hi = cap - size.lo - num_can_run
        return Span(lo, hi)
