"""BatchedScheduler: B scheduler instances with one config, stepped in lockstep on tensors.

The batched API speaks tensors indexed [instance, slot]; the B = 1 adapter
(schedspec.adapters.gpu) translates the spec's types. The step
never reads a value back per request: the only host reads are loop
conditions (is any instance still preempting, still admitting?).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedspec.gpu_impl.admission import schedule_waiting
from schedspec.gpu_impl.batch_state import (
    EMPTY,
    FINISHED_LENGTH_CAPPED,
    FINISHED_STOPPED,
    NO_HASH,
    NO_TOKEN,
    NOT_FINISHED,
    PRIORITY_LIMIT,
    RUNNING,
    WAITING,
    empty_state,
    floor_div,
    grow,
)
from schedspec.gpu_impl.block_ops import register_blocks, release_rows, release_tables
from schedspec.gpu_impl.cache_aware import reorder_waiting
from schedspec.gpu_impl.flat_index import flat_rows, pick, selected, spread, write_rows
from schedspec.gpu_impl.hashing import extend_hashes
from schedspec.gpu_impl.running_phase import schedule_running
from schedspec.gpu_impl.step_plan import StepPlan, waiting_priority_key
from schedspec.spec import PLACEHOLDER_TOKEN_ID, RequestError, SchedulerConfig
from schedspec.spec.config import require_family, require_single_kv_group
from schedspec.spec.errors import ConfigError

# Why gpu_impl keeps one KV cache group (docs/GPU_IMPL.md, "No hybrid KV cache groups").
GPU_IMPL_ONE_GROUP = (
    "its tensors hold one block table per request at one block size, with no null "
    "block, no window frees and no Mamba state: docs/GPU_IMPL.md, 'No hybrid KV cache groups'"
)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class NewRequests:
    """R requests to add, at most one per instance: where they go and what they are."""

    inst: torch.Tensor  # [R]
    slot: torch.Tensor  # [R] an EMPTY slot of that instance
    prompt: torch.Tensor  # [R, P] token ids, padded past prompt_len
    prompt_len: torch.Tensor  # [R]
    max_tokens: torch.Tensor  # [R]
    eos: torch.Tensor  # [R], NO_TOKEN (-1): none
    stops: torch.Tensor  # [R, Q] stop token ids, -1 padded
    priority: torch.Tensor  # [R]


@dataclass
class UpdateResult:
    kept: torch.Tensor  # [B, S] sampled tokens kept (tokens past a stop are dropped)
    finish: torch.Tensor  # [B, S] NOT_FINISHED or a FINISHED_* code
    # [B, S] bool: output that landed for a request preempted after its step was
    # scheduled (delivered, moving no reset counter). None without async scheduling.
    stale: torch.Tensor | None = None


class BatchedScheduler:
    """B scheduler instances on tensors.

    The per-step methods run under torch.inference_mode(), which skips autograd's
    bookkeeping in every op (a tick's ~1,500 small ops: a tenth of the time at B =
    4096 on the CPU, a quarter at B = 1). The state's tensors are made outside it
    (the constructor, grow) and only edited in place inside, so they stay ordinary
    tensors that callers and tests may edit anywhere. What the methods return (plans,
    results) are inference tensors: read them anywhere; to edit one outside inference
    mode, clone it or enter the mode."""

    def __init__(
        self,
        config: SchedulerConfig,
        batch: int = 1,
        slots: int = 8,
        device: torch.device | str | None = None,
        max_stops: int = 2,
        start_width: int | None = None,
    ) -> None:
        """B instances of `slots` request slots each (the slot ids callers may name). The
        per-slot tensors start `start_width` slots wide (default: all) and widen when a
        request names a slot past them: every [B, S] op of a step then costs what the
        highest slot in use needs, not the capacity (a swarm whose instances hold a few
        requests in 24 slots runs its steps on about half the columns)."""
        require_family(config, "gpu_impl", ("vllm",))
        require_single_kv_group(config, "gpu_impl", GPU_IMPL_ONE_GROUP)
        if config.kv_connector:
            # Loads park requests with blocks outside the batch, and finished requests
            # keep blocks for sends: state the [B, S] tensors have no place for
            # (docs/GPU_IMPL.md, "No KV connector").
            raise ConfigError(
                "kv_connector", "gpu_impl has no KV connector: run it with kv_connector=False"
            )
        self.config = config
        self.device = torch.device(device) if device is not None else default_device()
        self.capacity = slots
        width = slots if start_width is None else min(max(start_width, 1), slots)
        self.state = empty_state(config, batch, width, max_stops, self.device)
        # Positions a token can take: the prompt and outputs, plus drafts past them.
        self.max_positions = config.max_model_len + config.num_speculative_tokens + 1
        # Stop id columns any request was given (the widest NewRequests.stops, known on
        # the host): the columns past it hold NO_TOKEN only, so update skips them.
        self.stop_width = 0

    @torch.inference_mode(False)
    def grow(self, slots: int, max_stops: int) -> None:
        """Room for at least `slots` requests and `max_stops` stop ids per request."""
        self.capacity = max(self.capacity, slots)
        self.state = grow(self.state, slots, max_stops)

    # ----------------------------------------------------------------- requests

    @torch.inference_mode()
    def add_requests(self, new: NewRequests) -> None:
        """Queue fresh requests (the caller checked them against the spec's door)."""
        if new.inst.numel() == 0:
            return
        if bool((new.priority.abs() >= PRIORITY_LIMIT).any()):
            raise RequestError(
                "priority",
                f"gpu_impl packs priorities into int64 keys: |priority| < {PRIORITY_LIMIT}",
            )
        needed = int(new.slot.max()) + 1
        if needed > self.capacity:
            raise RequestError("slot", f"slot ids are below the engine's {self.capacity} slots")
        if needed > self.state.slots:
            self.grow(needed, self.state.stops.shape[2])
        st, config = self.state, self.config
        i, s = new.inst, new.slot
        # Each request names a distinct (instance, slot): writes go to flat rows.
        row = flat_rows(st.status, i, s)
        arrival = st.next_arrival.index_select(0, i)
        # One tensor each of ones and zeros for every write that takes them (a scalar
        # write_rows makes its own).
        one, zero = torch.ones_like(i), torch.zeros_like(i)
        st.next_arrival.index_add_(0, i, one)
        for field, value in (
            (st.status, WAITING),
            (st.arrival, arrival),
            (st.priority, new.priority),
            (st.num_prompt, new.prompt_len),
            (st.num_tokens, new.prompt_len),
            (st.num_computed, zero),
            (st.max_tokens, new.max_tokens),
            (st.num_preemptions, zero),
            (st.eos, new.eos),
            (st.num_spec, zero),
            # A slot's last request may have left with steps in flight.
            (st.num_in_flight, zero),
            (st.num_placeholders, zero),
            (st.num_stale, zero),
        ):
            write_rows(field, row, value)
        write_rows(st.is_prefill_chunk, row, False)
        stops = torch.full((i.numel(), st.stops.shape[2]), NO_TOKEN, device=self.device)
        stops[:, : new.stops.shape[1]] = new.stops
        self.stop_width = max(self.stop_width, new.stops.shape[1])
        _write_row_prefixes(st.stops, row, stops, packed=True)
        acc, done = extend_hashes(
            zero, 0, new.prompt, new.prompt_len, config.block_size, self.max_positions
        )
        # The requests' hash rows are put together packed, then copied in whole: the
        # scatter of the hashes lands in a small [R, M] tensor, not the [B, S, M] one.
        m = st.req_hash.shape[2]
        hashes = torch.full((i.numel(), m), NO_HASH, device=self.device)
        write_rows(hashes, done.row * m + done.index, done.ids)
        st.req_hash.view(-1, m).index_copy_(0, row, hashes)
        write_rows(st.hash_acc, row, acc)
        if config.policy == "fcfs":
            write_rows(st.wait_key, row, st.wait_back.index_select(0, i))
            st.wait_back.index_add_(0, i, one)
        else:
            write_rows(st.wait_key, row, waiting_priority_key(new.priority, arrival))

    @torch.inference_mode()
    def finish_requests(
        self, mask: torch.Tensor, rank: torch.Tensor, inst: torch.Tensor | None = None
    ) -> None:
        """End the masked requests (aborts: update_from_output frees its stops and caps
        packed, block_ops.release_rows), freeing their blocks in rank order and emptying
        their slots: mask and rank are [B, S], or [I, S] for the instances `inst` only
        (distinct), so that a few aborts among thousands of instances cost a few rows."""
        st = self.state
        if inst is None:
            inst = torch.arange(st.batch, device=self.device)
        release_tables(st, inst, mask, rank)
        slot = torch.arange(mask.shape[1], device=self.device)
        row = flat_rows(st.status, inst.unsqueeze(1), slot)
        write_rows(st.status, pick(row, selected(mask)), EMPTY)

    # ----------------------------------------------------------------- schedule

    @torch.inference_mode()
    def schedule(self, active: torch.Tensor | None = None) -> StepPlan:
        """One schedule() for every instance (or those `active`): the running loop, then
        where nothing was preempted the cache-aware reorder and admissions; computed
        counts advance at once and the step goes in flight (with async scheduling, its
        sampling requests' output positions become placeholders and their next drafts
        placeholders too)."""
        st, config = self.state, self.config
        if active is None:
            active = torch.ones(st.batch, dtype=torch.bool, device=self.device)
        plan = StepPlan.start(st, config, active)
        schedule_running(st, config, plan)
        # Cache-aware admission reorders the queue at the start of the waiting phase,
        # after the running requests took their blocks: it reads this step's usage.
        reorder_waiting(st, config, plan)
        schedule_waiting(st, config, plan)
        st.num_computed += plan.scheduled
        st.num_in_flight += plan.scheduled
        # Where scheduled, whether the step stopped short of the known tokens and the
        # in-flight outputs; elsewhere unchanged (bool xor and and: a where on bools
        # costs several times as much). In place: the state's tensors stay the ones made
        # outside inference mode.
        scheduled = plan.scheduled > 0
        known = st.num_tokens
        if config.async_scheduling:
            known = known + st.num_placeholders
        short = st.num_computed < known
        was = st.is_prefill_chunk
        was ^= (short ^ was) & scheduled
        if config.async_scheduling:
            self._add_output_placeholders(plan, scheduled & ~short)
        return plan

    def _add_output_placeholders(self, plan: StepPlan, samples: torch.Tensor) -> None:
        """Async: each scheduled step that samples (`samples`, [B, S]) counts its 1 + drafts
        output positions as placeholders, and the request's next drafts are K placeholders
        the model runner proposes itself, so the next step is scheduled before this
        one's output lands."""
        st, k = self.state, self.config.num_speculative_tokens
        rows = selected(samples)
        st.num_placeholders.view(-1).scatter_add_(0, rows, pick(plan.num_drafts, rows) + 1)
        if k > 0:
            write_rows(st.num_spec, rows, k)
            st.spec.view(-1, k).index_fill_(0, rows, PLACEHOLDER_TOKEN_ID)

    # ------------------------------------------------------------------ outputs

    @torch.inference_mode()
    def update_from_output(
        self,
        tokens: torch.Tensor,
        count: torch.Tensor,
        num_drafts: torch.Tensor,
        rank: torch.Tensor,
        scheduled: torch.Tensor,
    ) -> UpdateResult:
        """Land a step: the scheduled[b, s] tokens it ran for each request leave flight (0
        where it did not run the slot's request: a slot emptied or taken by a new request
        since holds none of its tokens). Then apply the model's tokens ([B, S, T],
        count[b, s] of them; 0: nothing sampled): roll back rejected drafts, append up to
        a stop, register, free the finished in scheduling order (rank: the sampling
        requests' ranks are distinct within an instance and in [0, S), as a plan's are).
        Output for a request preempted after the step was scheduled is stale: its tokens
        are appended (and may finish it) but move none of the counters the preemption
        reset."""
        st, config = self.state, self.config
        st.num_in_flight -= scheduled
        stale = self._land_stale(scheduled)
        # Only the sampling requests take tokens: a small share of the slots, compacted
        # once (the hashing below reads the same rows).
        row = selected((count > 0) & (st.status != EMPTY))
        t, m = tokens.shape[2], st.req_hash.shape[2]
        sampled, num_tokens = tokens.reshape(-1, t).index_select(0, row), pick(st.num_tokens, row)
        count_rows, drafts_rows = pick(count, row), pick(num_drafts, row)
        kept_rows, finish_rows = self._first_finish(row, sampled, count_rows, num_tokens)
        # Roll back the rejected drafts and drop the tokens past a stop at once:
        # computed + (count - 1 - drafts) - (count - kept).
        moved = kept_rows - 1 - drafts_rows
        registers = row  # without async scheduling: every sampling request
        if stale is not None:
            stale_rows = pick(stale, row)
            moved.masked_fill_(stale_rows, 0)
            had = self._resolve_placeholders(row, stale_rows, count_rows, drafts_rows)
            running = pick(st.status, row) == RUNNING
            takes_part = ~stale_rows & running
            if config.num_speculative_tokens == 0:
                takes_part &= had
            registers = pick(row, selected(takes_part))
        st.num_computed.view(-1).scatter_add_(0, row, moved)
        kept, finish = spread(kept_rows, row, count.shape), spread(finish_rows, row, count.shape)
        # The sampling rows only (a scatter: an add over [B, S] costs the whole width).
        st.num_tokens.view(-1).scatter_add_(0, row, kept_rows)
        acc, done = extend_hashes(
            pick(st.hash_acc, row),
            num_tokens,
            sampled,
            kept_rows,
            config.block_size,
            self.max_positions,
        )
        write_rows(st.req_hash, row.index_select(0, done.row) * m + done.index, done.ids)
        write_rows(st.hash_acc, row, acc)
        if config.enable_prefix_caching and (
            config.num_speculative_tokens > 0 or config.async_scheduling
        ):
            self._register_landed(registers, rank)
        # The finished requests are known packed: freed without a pass over every slot.
        finished = pick(row, selected(finish_rows > 0))
        release_rows(st, finished, pick(rank, finished))
        write_rows(st.status, finished, EMPTY)
        return UpdateResult(kept=kept, finish=finish, stale=stale)

    def _land_stale(self, scheduled: torch.Tensor) -> torch.Tensor | None:
        """[B, S] where the landing step's output is stale (its request was preempted after
        it was scheduled); those stale tokens are no longer in flight. None without async
        scheduling: a synchronous step lands before the next schedule() can preempt."""
        st = self.state
        if not self.config.async_scheduling:
            return None
        stale = (st.num_stale > 0) & (scheduled > 0)
        st.num_stale -= scheduled * stale
        return stale

    def _resolve_placeholders(
        self,
        row: torch.Tensor,
        stale: torch.Tensor,
        count: torch.Tensor,
        num_drafts: torch.Tensor,
    ) -> torch.Tensor:
        """Async: the sampling requests at flat rows `row` that are not stale resolve their
        step's placeholders: the rejected drafts' first, then one per token returned
        (those past a stop too). Returns, per row, whether placeholders were left to
        resolve after the rejected ones (the request was pipelined)."""
        st = self.state
        before = pick(st.num_placeholders, row)
        rejected = num_drafts + 1 - count
        after_rejected = torch.where(before > 0, before - rejected, before)
        had = after_rejected > 0
        after = torch.where(had, after_rejected - count, after_rejected)
        write_rows(st.num_placeholders, row, torch.where(stale, before, after))
        return had

    def _register_landed(self, rows: torch.Tensor, rank: torch.Tensor) -> None:
        """cache_blocks up to the confirmed computed tokens (computed - in flight: KV whose
        step has landed) for the requests at flat rows `rows`, in rank order per instance:
        accepted drafts and pipelined steps fill blocks the schedule-time registration
        could not know about. Only the instances where such a request now holds a full
        landed block it has not registered take part: a few hundred of thousands, each
        registering what it would among all."""
        st = self.state

        def confirmed(at: torch.Tensor) -> torch.Tensor:
            return pick(st.num_computed, at) - pick(st.num_in_flight, at)

        full = floor_div(confirmed(rows), self.config.block_size)
        inst = self._instances_of(pick(rows, selected(full > pick(st.num_cached_block, rows))))
        if inst.numel() == 0:
            return
        mask = torch.zeros(st.status.numel(), dtype=torch.bool, device=self.device)
        mask = mask.index_fill_(0, rows, True).view(st.status.shape).index_select(0, inst)
        ordered = _by_rank(mask, rank.index_select(0, inst))
        at = flat_rows(st.num_computed, inst.unsqueeze(1), ordered.clamp(min=0))
        register_blocks(st, inst, at, confirmed(at) * (ordered >= 0), self.config.block_size)

    def _instances_of(self, rows: torch.Tensor) -> torch.Tensor:
        """The distinct instances, ascending, that the flat [B, S] rows `rows` belong to."""
        st = self.state
        has = torch.zeros(st.batch, dtype=torch.bool, device=self.device)
        return selected(has.index_fill_(0, floor_div(rows, st.slots), True))

    def _first_finish(
        self, row: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor, num_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens kept (up to and including the first that ends the request) and the
        finish code, for the requests at flat rows `row` of the [B, S] tensors that
        sampled count[i] > 0 tokens ([n, T], compacted) and held num_tokens[i] before.
        The first stop token's position comes from a loop over the T token positions
        (on the CPU, ops with a broadcast innermost dimension of size Q cost several
        times as much) and the stop columns in use (the workload's requests use one of
        two: 25 us fewer); the length caps end the request at a position known in
        advance, so they need no loop."""
        st = self.state
        width, num_stops = tokens.shape[1], st.stops.shape[2]
        eos = pick(st.eos, row)
        stops = st.stops.view(-1, num_stops)[:, : self.stop_width].index_select(0, row).t()
        first_stop = torch.full_like(count, width)  # width: no stop token
        for t, token in reversed(list(enumerate(tokens.t()))):
            stopped = token == eos
            for stop in stops:
                stopped |= token == stop
            first_stop.masked_fill_(stopped, t)
        # The token at position t reaches a cap once t + 1 >= the room left.
        room = torch.minimum(
            self.config.max_model_len - num_tokens,
            pick(st.max_tokens, row) - (num_tokens - pick(st.num_prompt, row)),
        )
        first_cap = (room - 1).clamp(min=0)
        end = torch.minimum(first_stop, first_cap)
        ends = end < count
        # EOS and stop tokens win over the length caps at the same position.
        code = torch.where(first_stop <= first_cap, FINISHED_STOPPED, FINISHED_LENGTH_CAPPED)
        finish = torch.where(ends, code, NOT_FINISHED)
        kept = torch.where(ends, end + 1, count)
        return kept, finish

    @torch.inference_mode()
    def update_draft_token_ids(
        self,
        mask: torch.Tensor,
        drafts: torch.Tensor,
        count: torch.Tensor,
    ) -> None:
        """Drafts to verify next step for the masked slots; dropped for a request that is
        not running or stopped mid-prefill."""
        st = self.state
        rows = selected(mask)
        # Running and not mid-prefill (bools: a > b is a & ~b in one op), among the masked.
        usable = (pick(st.status, rows) == RUNNING) > pick(st.is_prefill_chunk, rows)
        # Rows of [B * S, K], compacted: a where over [B, S, K] broadcasts a [B, S] mask
        # along the innermost dimension, several times slower on the CPU.
        width, row = drafts.shape[2], pick(rows, selected(usable))
        _write_row_prefixes(st.spec, row, drafts.reshape(-1, width))
        # The masked slots drop their drafts, the usable ones taking their count: one
        # write over the masked rows (a masked_fill_ over [B, S] costs the whole width).
        write_rows(st.num_spec, rows, pick(count, rows) * usable)


def _write_row_prefixes(
    x: torch.Tensor, row: torch.Tensor, values: torch.Tensor, packed: bool = False
) -> None:
    """x viewed as [B * S, K] takes, at the flat rows `row` (distinct), the rows of
    values ([B * S, W], or [len(row), W] if packed) at those rows in its first W
    columns. Element by element (one scatter_): at the few columns of drafts and stop
    ids, an index_copy_ of rows costs nearly twice as much (121 against 67 us for 15K
    rows of 2)."""
    width, k = values.shape[1], x.shape[-1]
    column = torch.arange(width, device=row.device)
    to = flat_rows(x.view(-1, k), row.unsqueeze(1), column).view(-1)
    if packed:
        given = values.reshape(-1)
    else:
        at = to if width == k else flat_rows(values, row.unsqueeze(1), column).view(-1)
        given = pick(values, at)
    write_rows(x, to, given)


def _by_rank(mask: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """The masked slots of each row ([B, S]) in rank order, -1 between and after them.
    A step gives its scheduled requests distinct ranks from 0 (one per commit, so
    below S): each masked slot goes to the column its rank names, no sort needed. The
    others go to a spare column S, dropped."""
    b, s = mask.shape
    column = torch.where(mask, rank, s)
    slot = torch.arange(s, device=mask.device).expand(b, s)
    placed = torch.full((b, s + 1), -1, dtype=torch.int64, device=mask.device)
    return placed.scatter_(1, column, slot)[:, :s]
