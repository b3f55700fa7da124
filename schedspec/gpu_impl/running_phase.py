"""The running loop of schedule(), for B instances at once.

The reference walks the running list: each request asks for
min(cap(tokens with drafts - computed), budget left, room before
max_model_len) tokens and the blocks those need, and when the blocks do not
fit it preempts victims until they do or it preempted itself. Here a
*segment* does that walk for every instance in one go: the budget split is
an exclusive prefix sum over the demands, blocks needed are elementwise,
and the first request whose cumulative blocks exceed the free ones stops
the segment. Everything before it commits. Only the instances stopped
that way then loop (retry): preempt one victim, try the stopped request
again with its token count unchanged (the reference fixes it before
allocating), and go back to segments once it fits or is gone.

A cursor (a run_key) marks how far each stopped instance's walk has got, so
victims removed from the list never shift anyone's place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedspec.gpu_impl.batch_state import BIG, RUNNING, BatchState, floor_div, num_free_blocks
from schedspec.gpu_impl.block_ops import uncache_uncomputed
from schedspec.gpu_impl.flat_index import flat_rows, pick, selected, write_rows
from schedspec.gpu_impl.step_plan import (
    NOT_SCHEDULED,
    SCHEDULED_RUNNING,
    StepPlan,
    commit,
    preempt,
    waiting_priority_key,
)
from schedspec.spec import SchedulerConfig

# A segment sorts run_key + penalty * PASSED, the penalty 0 only where the slot is running
# and past the cursor: run_keys count admissions, far below 2**53, so the eligible requests
# sort first, in run order, and a sorted key below PASSED is one of them. The keys are
# sorted as float64, exact below 2**53 (the penalized ones need only stay >= PASSED):
# torch's CPU sort of a tick's [4096, 12] keys takes 0.24 ms as float64 against 0.30 ms
# as int64, timed over 20 ticks' keys in turn. Timed on one tick's keys sorted again and
# again it takes half that (0.11 against 0.24 ms): a row's comparisons are data-dependent
# branches, which the branch predictor learns on a repeated input.
PASSED = 1 << 60


@dataclass(frozen=True)
class _Stuck:
    """Instances whose walk stopped at a request whose blocks do not fit (before any
    victim): the request's slot and the tokens it was given, aligned with inst."""

    inst: torch.Tensor
    request: torch.Tensor
    tokens: torch.Tensor

    @staticmethod
    def none(device: torch.device) -> _Stuck:
        empty = torch.zeros((0,), dtype=torch.int64, device=device)
        return _Stuck(empty, empty, empty)

    def only(self, keep: torch.Tensor) -> _Stuck:
        """The entries at positions keep (from `selected`)."""
        return _Stuck(
            self.inst.index_select(0, keep),
            self.request.index_select(0, keep),
            self.tokens.index_select(0, keep),
        )

    def join(self, other: _Stuck) -> _Stuck:
        if other.inst.numel() == 0:
            return self
        if self.inst.numel() == 0:
            return other
        return _Stuck(
            torch.cat([self.inst, other.inst]),
            torch.cat([self.request, other.request]),
            torch.cat([self.tokens, other.tokens]),
        )


def schedule_running(state: BatchState, config: SchedulerConfig, plan: StepPlan) -> None:
    """Each instance with budget walks its running list: segments, and preempt-and-retry
    rounds for the walks a request's blocks stopped. Instances are independent, so one
    round runs the segments of some and the retries of others; the loop reads back only
    which instances go on (where nothing stops, one read)."""
    # The run_key of the last request a stopped walk passed (-1: none; run_keys are >= 0).
    # Only stopped walks read it again, so only they write it.
    cursor = torch.full((state.batch,), -1, dtype=torch.int64, device=state.device)
    walk = selected(plan.budget > 0)
    stuck = _Stuck.none(state.device)
    first = True
    while walk.numel() or stuck.inst.numel():
        stopped = _Stuck.none(state.device)
        if walk.numel():
            stopped = _segment(state, config, plan, walk, cursor, first)
        first = False
        walk = stuck.inst  # empty unless a retry sends some walks on
        if stuck.inst.numel():
            walk, stuck = _retry(state, config, plan, stuck, cursor)
        stuck = stuck.join(stopped)


def _of(x: torch.Tensor, inst: torch.Tensor, everyone: bool) -> torch.Tensor:
    """x's rows of instances inst; everyone: inst names every instance in order (no copy)."""
    return x if everyone else x.index_select(0, inst)


@dataclass(frozen=True)
class _Reads:
    """The per-slot fields a walk step reads, gathered once at the requests' flat rows
    in the [B, S] tensors (demand, blocks and the commit all read them at the same
    places; nothing they read changes before the commit's last read)."""

    rows: torch.Tensor  # [I, R] flat row numbers (padding: some real slot)
    computed: torch.Tensor
    num_tokens: torch.Tensor
    num_spec: torch.Tensor
    held: torch.Tensor  # blocks in the table before the commit
    # The known tokens and the in-flight steps' output positions, which a step counts as
    # known (drafts ride past them): num_tokens itself without async scheduling.
    known: torch.Tensor
    # Async: where the in-flight step is sure to bring the request to max_tokens (it is
    # skipped: scheduled again it could only compute a position past them); None without.
    done: torch.Tensor | None

    @staticmethod
    def at(
        state: BatchState, config: SchedulerConfig, inst: torch.Tensor, slots: torch.Tensor
    ) -> _Reads:
        """At slots[i, r] (all real slot ids) of instances inst[i]."""
        rows = flat_rows(state.status, inst.unsqueeze(1), slots)
        computed = pick(state.num_computed, rows)
        num_tokens = pick(state.num_tokens, rows)
        known, done = num_tokens, None
        if config.async_scheduling:
            placeholders = pick(state.num_placeholders, rows)
            known = num_tokens + placeholders
            # computed counts the in-flight step's tokens and placeholders its 1 + drafts
            # positions: computed + 2 - placeholders tokens are sure once it lands.
            sure = computed + 2 - placeholders
            done = (placeholders > 0) & (
                sure >= pick(state.num_prompt, rows) + pick(state.max_tokens, rows)
            )
        return _Reads(
            rows=rows,
            computed=computed,
            num_tokens=num_tokens,
            num_spec=pick(state.num_spec, rows),
            held=pick(state.num_held, rows),
            known=known,
            done=done,
        )


def _demand(config: SchedulerConfig, cap: torch.Tensor, reads: _Reads) -> torch.Tensor:
    """Tokens each running request would take with the budget unlimited (cap: [I, 1])."""
    want = reads.known + reads.num_spec
    want -= reads.computed
    if reads.done is not None:
        want.masked_fill_(reads.done, 0)
    want = torch.minimum(want, cap, out=want)  # the long-prefill cap (BIG: none)
    # Leave room for the token this step samples: positions stay < max_model_len.
    room = config.max_model_len - 1 - reads.computed
    # Both are >= 0 for a running request (the reference asserts it); padding's may be
    # negative, which leaves it unscheduled all the same.
    return torch.minimum(want, room, out=room)


def _blocks_needed(
    config: SchedulerConfig, reads: _Reads, ends: torch.Tensor, scheduled: torch.Tensor
) -> torch.Tensor:
    """Blocks each request takes to hold its tokens up to `ends` (computed + tokens) and
    the lookahead ones, where `scheduled` (0 elsewhere): blocks_to_allocate's arithmetic
    with the lookahead folded into the rounding and the max_model_len cap taken after
    it (rounding up is monotone, so capping before or after gives the same count)."""
    covered = ends + (config.lookahead_tokens + config.block_size - 1)
    covered = floor_div(covered, config.block_size)
    limit = -(-config.max_model_len // config.block_size)
    return covered.clamp_(max=limit).sub_(reads.held).clamp_(min=0).mul_(scheduled)


def _segment(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    cursor: torch.Tensor,
    first: bool,
) -> _Stuck:
    """Walk the running lists of instances inst from their cursors (first: from the start,
    and inst from `selected`) and commit up to the first request whose blocks do not
    fit; return the instances stopped there."""
    everyone = first and inst.numel() == state.batch
    run_key = _of(state.run_key, inst, everyone)
    penalty = _of(state.status, inst, everyone) ^ RUNNING  # 0 where running
    if not first:
        penalty |= run_key <= cursor.index_select(0, inst).unsqueeze(1)
    # Running requests' run_keys are distinct, so any sort puts the eligible ones in one
    # order; the others sort last, past num_eligible: padding, masked by `valid`.
    keys, order = torch.sort(torch.add(run_key, penalty, alpha=PASSED).double(), dim=1)
    # The walk is as wide as the longest running list, not the slot count (one host read
    # per segment): the columns cut off hold no running request. The first segment takes
    # the plan's running counts (of every instance: a bound for any subset).
    longest = plan.running.max() if first else (keys < PASSED).sum(dim=1).max()
    s = max(int(longest), 1)
    keys, order = keys[:, :s], order[:, :s]
    # Compared on the slice: a contiguous mask (an & with a strided one took 30 us, not 2).
    valid = keys < PASSED
    reads = _Reads.at(state, config, inst, order)
    demand = _demand(config, _of(plan.cap, inst, everyone).unsqueeze(1), reads)
    # Padding (past num_eligible) comes after every real request of its row, so what it
    # asks for changes no real request's share; it only has to be left unscheduled.
    before = torch.cumsum(demand, dim=1).sub_(demand)
    budget = _of(plan.budget, inst, everyone).unsqueeze(1)
    # Where the budget ran out this goes negative: unscheduled all the same.
    tokens = torch.minimum(budget - before, demand, out=before)
    scheduled = (tokens > 0) & valid
    ends = reads.computed + tokens
    blocks = _blocks_needed(config, reads, ends, scheduled)
    free = _of(num_free_blocks(state), inst, everyone).unsqueeze(1)
    fits = torch.cumsum(blocks, dim=1) <= free
    _commit_running(state, config, plan, inst, order, fits & scheduled, tokens, blocks, reads, ends)
    # Blocks are >= 0, so the cumulative sum only grows: `fits` holds on a prefix of each
    # row (padding asks for nothing), and a row stopped where its last column fails.
    stopped = selected(~fits[:, -1])
    if stopped.numel() == 0:
        return _Stuck.none(state.device)
    return _stopped_at(state, inst, cursor, stopped, fits, keys, order, tokens, first)


def _stopped_at(
    state: BatchState,
    inst: torch.Tensor,
    cursor: torch.Tensor,
    stopped: torch.Tensor,
    fits: torch.Tensor,
    keys: torch.Tensor,
    order: torch.Tensor,
    tokens: torch.Tensor,
    first: bool,
) -> _Stuck:
    """The walks of inst[stopped] stop at their first column that does not fit: their
    cursor moves to the run_key before it (a sorted key there is one), if any."""
    at = fits.index_select(0, stopped).sum(dim=1)
    s = fits.shape[1]
    prev_key = pick(keys, stopped * s + (at - 1).clamp(min=0)).long()
    where = inst.index_select(0, stopped)
    before = torch.full_like(where, -1) if first else cursor.index_select(0, where)
    # inst names distinct instances: whole-row copies, no advanced indexing.
    write_rows(cursor, where, torch.where(at > 0, prev_key, before))
    col = stopped * s + at
    return _Stuck(where, pick(order, col), pick(tokens, col))


def _retry(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    stuck: _Stuck,
    cursor: torch.Tensor,
) -> tuple[torch.Tensor, _Stuck]:
    """One victim per stopped instance, then the stopped request tries again. Returns the
    instances whose walk goes on with a segment, and those still stopped."""
    inst, request = stuck.inst, stuck.request
    victim = _pick_victim(state, config, inst)
    _unschedule(state, config, plan, inst, victim)
    preempt(state, config, plan, inst, victim)
    itself = victim == request
    tokens = stuck.tokens.unsqueeze(1)
    reads = _Reads.at(state, config, inst, request.unsqueeze(1))
    ends = reads.computed + tokens
    blocks = _blocks_needed(config, reads, ends, tokens > 0)
    fits = ~itself & (blocks.squeeze(1) <= num_free_blocks(state)[inst])
    order = request.unsqueeze(1)
    _commit_running(
        state, config, plan, inst, order, fits.unsqueeze(1), tokens, blocks, reads, ends
    )
    cursor[inst] = torch.where(fits, state.run_key[inst, request], cursor[inst])
    # fcfs: a request that preempted itself is out of KV, nothing after it runs this step.
    ends_walk = itself if config.policy == "fcfs" else torch.zeros_like(itself)
    going_on = (fits | itself) & ~ends_walk & (plan.budget[inst] > 0)
    return inst.index_select(0, selected(going_on)), stuck.only(selected(~fits & ~itself))


def _pick_victim(state: BatchState, config: SchedulerConfig, inst: torch.Tensor) -> torch.Tensor:
    """fcfs: the newest running request. priority: the largest (priority, arrival)."""
    running = state.status[inst] == RUNNING
    if config.policy == "fcfs":
        key = state.run_key[inst]
    else:
        key = waiting_priority_key(state.priority[inst], state.arrival[inst])
    return torch.argmax(torch.where(running, key, -BIG), dim=1)


def _unschedule(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    victim: torch.Tensor,
) -> None:
    """A victim scheduled earlier in this step (priority only) gives back its budget and
    the cache registrations of KV it will no longer compute."""
    tokens = plan.scheduled[inst, victim]
    plan.budget[inst] += tokens
    plan.scheduled[inst, victim] = 0
    plan.kind[inst, victim] = NOT_SCHEDULED
    plan.rank[inst, victim] = BIG
    plan.num_drafts[inst, victim] = 0
    was = tokens > 0
    if config.enable_prefix_caching and bool(was.any()):
        uncache_uncomputed(state, inst[was], victim[was], config.block_size)


def _commit_running(
    state: BatchState,
    config: SchedulerConfig,
    plan: StepPlan,
    inst: torch.Tensor,
    order: torch.Tensor,
    go: torch.Tensor,
    tokens: torch.Tensor,
    blocks: torch.Tensor,
    reads: _Reads,
    ends: torch.Tensor,
) -> None:
    """Schedule the running requests order[i, r] where go holds; drafts ride in the same
    budget (a short budget drops the trailing ones) and are consumed either way. ends is
    computed + tokens. Blocks are registered up to the known tokens; drafts are the
    tokens past the known ones and the in-flight outputs."""
    upto = torch.minimum(ends, reads.num_tokens)
    past = upto if reads.known is reads.num_tokens else torch.minimum(ends, reads.known)
    at, committed = commit(
        state,
        config,
        plan,
        inst,
        tokens,
        blocks,
        SCHEDULED_RUNNING,
        real=go,
        rows=reads.rows,
        upto=upto,
    )
    # The committed rows are distinct; held was read before the commit took blocks.
    write_rows(plan.new_from, committed, pick(reads.held, at))
    # Drafts verified: the tokens scheduled past the known ones (ends - past).
    write_rows(plan.num_drafts, committed, pick(ends.sub_(past), at))
    write_rows(state.num_spec, committed, 0)
