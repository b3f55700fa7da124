"""Random workloads and a model for B instances, drawn on the device.

Every draw is a pure function of (seed, instance id, tick, purpose, slot),
a counter-based generator, not a stream: instance i alone (B = 1, id i)
goes through exactly the ticks it went through among thousands. That is
how a swarm finding becomes a trace (schedspec.campaign.swarm): re-run the
one instance with a recorder attached. Per-slot values (draft counts and
tokens, accepted drafts, stops, sampled tokens) come from narrow lanes (8,
16 or 32 bits) of 64-bit draws, lane j of a purpose always the same piece
of the same draw, so a value does not depend on how many slots the engine
holds. They are drawn for every slot, read or not: finding the slots that
read them (a nonzero over [B, S]) costs more than drawing. Only the tokens
of prompts that take the shared pattern are not drawn. A value below n is
a multiply-high of a draw's top bits by n (integer division is slow on the
CPU): each value's chance is within 2**-15 of 1 / n (a draft count's
15-bit lane; 2**-21 or 2**-31 elsewhere).

One tick: maybe abort a live request, maybe add one, propose drafts for
running requests (not with async scheduling), schedule, let the model answer
the step that lands (the one just scheduled, or with async scheduling the
oldest in flight, swarm_queue.py; accepted drafts and an occasional forced
stop are drawn; the tokens are the accepted drafts, placeholder drafts drawn,
then one drawn token or the stop token), update. Stop tokens lie outside the
model's vocabulary, so only a drawn stop ends a request early: a trace's
Step decisions then say everything the model decided.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.batch_state import EMPTY, NO_TOKEN, PREEMPTED, RUNNING, WAITING
from schedspec.gpu_impl.engine import BatchedScheduler, NewRequests, UpdateResult
from schedspec.gpu_impl.flat_index import pick, selected
from schedspec.gpu_impl.hashing import mix64
from schedspec.gpu_impl.step_plan import StepPlan
from schedspec.gpu_impl.swarm_queue import StepInFlight, SwarmQueue
from schedspec.spec import PLACEHOLDER_TOKEN_ID

assert min(WAITING, RUNNING, PREEMPTED) > EMPTY  # _add finds empty slots by a minimum

# The model's tokens: the harness model's default vocabulary, 2**6 (draw_small's default).
VOCAB = 64
STOP_TOKEN = VOCAB + 36  # never sampled, only forced
# Prompt tokens: a power of two, so that a draw's low bits are a token (no lookup).
PROMPT_VOCAB = 8

# Purposes: independent streams of the counter-based generator.
_ABORT, _ABORT_PICK, _ADD, _LENGTH, _TOKENS, _MAX_TOKENS = 1, 2, 3, 4, 5, 6
_EOS, _PRIORITY, _DRAFTS, _ACCEPT_STOP, _SAMPLE, _PREFIX = 7, 8, 9, 10, 11, 12
_DRAFT_TOKENS, _PLACEHOLDERS = 13, 14
_PURPOSES = 14  # purposes are 1.._PURPOSES
# draw_small's lanes: a 64-bit draw viewed as 8-, 16- or 32-bit integers (each lane's
# top bit is masked off, so the signed views give values >= 0).
_LANE_DTYPES = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
_DRAW_BITS = 2**62 - 1
_LANE_KEY = 104_729  # lane (slot, or position of a wide draw) j adds j times this to its base


@dataclass(frozen=True)
class WorkloadShape:
    """How busy the instances are: chances per tick (out of 1024) and limits."""

    add_chance: int = 512
    abort_chance: int = 24
    stop_chance: int = 64
    max_new_tokens: int = 24


@dataclass
class Tick:
    """What one tick did, per instance: enough to write it as trace events."""

    aborted: torch.Tensor  # [B] slot aborted, -1: none
    # The requests added (at most one per instance), in the two add_requests calls:
    # those with the shared prompt pattern (one row expanded), then the others.
    added: tuple[NewRequests, NewRequests]
    proposing: torch.Tensor  # [B, S] bool: the slots that proposed drafts (the running)
    proposed: torch.Tensor  # [B, S] how many drafts, where proposing (any value elsewhere)
    # [B] the instances that called schedule() (with async scheduling, those with
    # something to schedule); None: every instance.
    schedules: torch.Tensor | None
    plan: StepPlan  # the step scheduled (instances that did not schedule: nothing in it)
    # The step that landed: the plan itself without async scheduling; with it, in each
    # instance, the oldest step in flight where one landed (`lands`, [B]).
    landed: StepInFlight
    lands: torch.Tensor | None  # None: every instance landed the plan
    accepted: torch.Tensor  # [B, S] drafts accepted per sampling request (0 elsewhere)
    stopped: torch.Tensor  # [B, S] bool: the model emitted the stop token
    sampled: torch.Tensor  # [B, S] tokens emitted (0: none)
    result: UpdateResult

    @property
    def drafts(self) -> torch.Tensor:
        """[B, S] drafts proposed, -1: no proposal. Made when asked (traces ask): a where
        over [B, S] took 90 us of every tick."""
        return torch.where(self.proposing, self.proposed, -1)


class SwarmWorkload:
    def __init__(
        self,
        engine: BatchedScheduler,
        seed: int,
        instance_ids: torch.Tensor,
        shape: WorkloadShape = WorkloadShape(),
    ) -> None:
        self.engine = engine
        self.config = engine.config
        self.seed = seed
        self.ids = instance_ids.to(engine.device)
        self.shape = shape
        self.tick_index = 0
        # Every draw's instance part, fixed for the run, plus each purpose's.
        self._instance_keys = mix64(self.ids * 1_000_003 + seed)
        self._purpose_keys = torch.arange(1, _PURPOSES + 1, device=engine.device)
        self._tick_bases = self._instance_keys.unsqueeze(1)  # set on a tick's first draw
        self._tick_bases_of = -1
        longest = self.config.max_model_len - 1
        self._pattern = (torch.arange(longest, device=engine.device) * 5 // 3) % PROMPT_VOCAB
        self._starts = torch.empty(0, dtype=torch.int64, device=engine.device)
        self.queue = SwarmQueue(engine.state, engine.config.async_scheduling)

    @torch.inference_mode()
    def draws(
        self, purposes: tuple[int, ...], rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Non-negative draws (62 bits) for this tick, [B] each (or [len(rows)], for the
        instances `rows` only, if given), one per purpose: views of the bases' columns."""
        bases = self._bases(rows)
        return tuple(bases[:, purpose - 1] for purpose in purposes)

    def draw(self, purpose: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Non-negative draws, [B] (or [len(rows)]), for this tick and purpose."""
        return self.draws((purpose,), rows)[0]

    def _bases(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[B, purposes] (or [len(rows), purposes]): each draw's mix of (instance, tick,
        purpose), 62 bits, column p - 1 for purpose p. All purposes are mixed at once
        on a tick's first draw (one mix over [B, purposes], not one per draw: on [B]
        the ops' own overhead dominates). Instance-major, so that a few instances'
        bases are whole rows (index_select of 2,000 rows: 7 us, against 105 us for
        columns of [P, B])."""
        if self._tick_bases_of != self.tick_index:
            tick_keys = self._purpose_keys + self.tick_index * 7919
            # Masked once here, not per draw (eight masks of a column cost more).
            self._tick_bases = mix64(self._instance_keys.unsqueeze(1) + tick_keys)
            self._tick_bases &= _DRAW_BITS
            self._tick_bases_of = self.tick_index
        return self._tick_bases if rows is None else self._tick_bases.index_select(0, rows)

    @torch.inference_mode()
    def tick(self, after_schedule: Callable[[StepPlan], None] | None = None) -> Tick:
        """One tick for every instance, in the engine core's order (swarm_queue.py):
        aborts, arrivals, drafts (not with async scheduling: the model runner proposes
        placeholders itself), schedule() where there is something to schedule, then the
        model answers the step that lands and update applies it. after_schedule sees
        the plan before the model runs."""
        engine, queue = self.engine, self.queue
        aborted = self._abort()
        added = self._add()
        proposing, proposed = self._propose()
        schedules = queue.schedules(engine.state)
        plan = engine.schedule() if schedules is None else engine.schedule(schedules)
        if after_schedule is not None:
            after_schedule(plan)
        landed, lands = queue.land(engine.state, plan, schedules)
        accepted, stopped, tokens, count = self._model(landed, lands)
        scheduled = landed.scheduled
        if lands is not None:
            # Only where a step lands, and only the requests it was scheduled for.
            scheduled = scheduled * (landed.still_there(engine.state) & lands.unsqueeze(1))
        result = engine.update_from_output(tokens, count, landed.num_drafts, landed.rank, scheduled)
        queue.finished(result.finish > 0)
        self.tick_index += 1
        return Tick(
            aborted,
            added,
            proposing,
            proposed,
            schedules,
            plan,
            landed,
            lands,
            accepted,
            stopped,
            count,
            result,
        )

    # ------------------------------------------------------------------ events

    def _abort(self) -> torch.Tensor:
        """[B]: the slot each instance aborts (-1: none). Only the instances whose draw
        says abort (a few percent) look at their slots."""
        st = self.engine.state
        pick_draw, abort_draw = self.draws((_ABORT_PICK, _ABORT))
        inst = selected((abort_draw & 1023) < self.shape.abort_chance)
        live = st.status.index_select(0, inst) != EMPTY
        # _pick gives the width where nothing is live: that row's mask stays empty.
        chosen = _pick(live, pick_draw.index_select(0, inst))
        mask = torch.arange(st.slots, device=st.device) == chosen.unsqueeze(1)
        self.engine.finish_requests(mask, torch.zeros_like(live, dtype=torch.int64), inst)
        slot = torch.full_like(abort_draw, -1)
        slot.scatter_(0, inst, torch.where(chosen < st.slots, chosen, -1))
        self.queue.finished(slot >= 0)
        return slot

    def _add(self) -> tuple[NewRequests, NewRequests]:
        st = self.engine.state
        # Slots past the tensors' width are empty too: the first of them is the first
        # empty slot of an instance whose columns are all in use (the engine widens).
        # EMPTY is the lowest status, so a row's minimum says whether it has an empty
        # slot and its index is the first one (the first minimum's): one op, 40 us,
        # against 200 for == , any and argmax.
        lowest, first_empty = st.status.min(dim=1)
        has_empty = lowest == EMPTY
        room = has_empty | (st.slots < self.engine.capacity)
        go = ((self.draw(_ADD) & 1023) < self.shape.add_chance) & room
        slot = torch.where(has_empty, first_empty, st.slots)
        arriving = selected(go)
        # The arrivals whose prompt is the shared pattern first, then those with their
        # own tokens (x & 1 is x % 2: draws are >= 0).
        shared = (self.draw(_PREFIX, rows=arriving) & 1) == 0
        inst = torch.cat([pick(arriving, selected(shared)), pick(arriving, selected(~shared))])
        num_shared = int(shared.sum())
        # Only the arriving instances' draws (x & (2**n - 1) is x % 2**n).
        length, eos, max_tokens, priority = self.draws(
            (_LENGTH, _EOS, _MAX_TOKENS, _PRIORITY), inst
        )
        pattern, own = self._prompts(num_shared, inst[num_shared:])
        slots = slot.index_select(0, inst)
        prompt_len = 1 + _below(length, self.config.max_model_len - 1)
        max_tokens = 1 + _below(max_tokens, self.shape.max_new_tokens)
        eos = torch.where((eos & 1) == 0, STOP_TOKEN, NO_TOKEN)
        stops = torch.full((inst.numel(), 1), NO_TOKEN, device=st.device)
        priority = priority & 3

        def requests(part: slice, prompt: torch.Tensor) -> NewRequests:
            return NewRequests(
                inst=inst[part],
                slot=slots[part],
                prompt=prompt,
                prompt_len=prompt_len[part],
                max_tokens=max_tokens[part],
                eos=eos[part],
                stops=stops[part],
                priority=priority[part],
            )

        # Two calls (instances are independent): the shared prompts as one row
        # expanded, which the engine hashes once, and the others. Their prompts are
        # never put together (a copy of every padded prompt row, for nothing).
        added = (requests(slice(0, num_shared), pattern), requests(slice(num_shared, None), own))
        for part in added:
            self.engine.add_requests(part)
        return added

    def _prompts(
        self, num_shared: int, own_inst: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts [n, max_model_len - 1], padded: the common pattern for `num_shared`
        arrivals (one row expanded), so that the prefix cache hits, and each own_inst's
        own tokens all along (tokens past prompt_len are padding: nobody reads them;
        hashing counts, traces slice)."""
        longest = self.config.max_model_len - 1
        tokens = self.draw_small(_TOKENS, longest, own_inst, bits=PROMPT_VOCAB.bit_length() - 1)
        return self._pattern.expand(num_shared, longest), tokens

    def draw_small(
        self,
        purpose: int,
        width: int,
        rows: torch.Tensor | None = None,
        bits: int = 6,
        lane_bits: int = 8,
    ) -> torch.Tensor:
        """Draws below 2**bits (bits < lane_bits), [B, width] (or [len(rows), width]),
        contiguous: lane j is the j-th lane_bits-wide (8, 16 or 32) piece of 64-bit
        draws (little-endian, as CPUs and CUDA devices are), so a draw feeds 64 /
        lane_bits values, a fraction of the mixing of one draw per value. One mask over
        the draws keeps every lane's low bits, then the lanes are converted (a shift and
        a mask per lane over [n, width] cost three times as much)."""
        per_draw = 64 // lane_bits
        base = self._bases(rows)[:, purpose - 1]
        lanes = mix64(base.unsqueeze(1) + _lane_keys(-(-width // per_draw), base.device))
        lanes &= ((1 << bits) - 1) * ((2**64 - 1) // (2**lane_bits - 1))
        return lanes.view(_LANE_DTYPES[lane_bits])[:, :width].to(torch.int64)

    def _propose(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The running slots propose drafts: ([B, S] which slots, how many there). Not
        with async scheduling: vLLM's engine core then never calls
        update_draft_token_ids (the model runner fills the placeholder drafts)."""
        st, k = self.engine.state, self.config.num_speculative_tokens
        if k == 0 or self.config.async_scheduling:
            return torch.zeros_like(st.status, dtype=torch.bool), torch.zeros_like(st.status)
        mask = st.status == RUNNING
        # Counts from 15-bit lanes for every slot; the engine reads the running slots'
        # only. Drawing per slot costs less than finding the running slots to draw for
        # (a nonzero: 120 us).
        count = _below(self.draw_small(_DRAFTS, st.slots, bits=15, lane_bits=16), k + 1, 15)
        tokens = self.draw_small(_DRAFT_TOKENS, st.slots * k)
        tokens = tokens.view(st.batch, st.slots, k)
        self.engine.update_draft_token_ids(mask, tokens, count)
        return mask, count

    def _model(
        self, plan: StepInFlight, lands: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """For the step that lands (in the instances `lands`, None: all): who samples (a
        request still there whose step reached its known tokens), how many drafts pass,
        whether the last token is the stop token, and the tokens themselves."""
        st, k = self.engine.state, self.config.num_speculative_tokens
        before = plan.computed_before + plan.scheduled - plan.num_drafts
        samples = (plan.scheduled > 0) & (before >= st.num_tokens)
        if lands is not None:
            samples &= plan.still_there(st) & lands.unsqueeze(1)
        # Accepted drafts and stops, drawn for every slot (cheaper than finding the
        # sampling slots: see _propose) and kept for the sampling slots (0 elsewhere):
        # one 31-bit lane each, the stop from its top 10 bits, the accepted drafts
        # from the other 21.
        draw = self.draw_small(_ACCEPT_STOP, st.slots, bits=31, lane_bits=32)
        stop = (draw < self.shape.stop_chance << 21) & samples
        stop &= st.eos == STOP_TOKEN
        rest = draw & (2**21 - 1)
        # _below(rest, num_drafts + 1, 21), the + 1 folded into one op.
        accepted = (torch.addcmul(rest, rest, plan.num_drafts) >> 21) * samples
        count = accepted + samples
        # The tokens: the accepted drafts, then the model's own, or the stop token, at
        # position `accepted` (past count nothing is read). The drafts are copied whole
        # and the one token scattered by flat position (a where per draft column on
        # [B, S], with token draws for every position, cost a fifth more; a scatter
        # along the last dimension of [B, S, k + 1] twice as much as this one).
        last = torch.where(stop, STOP_TOKEN, self.draw_small(_SAMPLE, st.slots))
        drafts = plan.drafts[..., :k]
        if self.config.async_scheduling or self.config.pad_spec_decode:
            # Placeholder drafts are the model runner's own guesses: drawn here.
            guesses = self.draw_small(_PLACEHOLDERS, st.slots * k).view(st.batch, st.slots, k)
            drafts = torch.where(drafts == PLACEHOLDER_TOKEN_ID, guesses, drafts)
        tokens = torch.cat([drafts, last.unsqueeze(2)], dim=2)
        at = self._token_starts() + accepted.view(-1)
        tokens.view(-1).scatter_(0, at, last.view(-1))
        return accepted, stop, tokens, count

    def _token_starts(self) -> torch.Tensor:
        """[B * S]: each slot's first flat position in the model's [B, S, k + 1] tokens,
        kept until S changes (the engine widens rarely)."""
        size = self.engine.state.status.numel()
        if self._starts.numel() != size:
            width = self.config.num_speculative_tokens + 1
            self._starts = torch.arange(size, device=self.engine.device) * width
        return self._starts


def _pick(mask: torch.Tensor, draw: torch.Tensor) -> torch.Tensor:
    """A slot among the masked ones, picked by draw (the width where none): the n-th
    masked slot is the number of slots before the running count passes n."""
    nth = _below(draw, mask.sum(dim=1))
    return (torch.cumsum(mask, dim=1) <= nth.unsqueeze(1)).sum(dim=1)


def _below(draw: torch.Tensor, n: torch.Tensor | int, bits: int = 62) -> torch.Tensor:
    """A draw (below 2**bits, >= 0) brought below n (0 where n is 0; n < 2**32): its
    top 31 bits (all of them, if fewer) times n, over 2**31 (over 2**bits), so each
    value has 2**31 / n of the draws' values give or take one. Integer division is
    slow on the CPU: a remainder by a tensor took 35 us on 15K entries, these ops
    about 10."""
    if bits > 31:
        draw, bits = draw >> (bits - 31), 31
    return (draw * n) >> bits


def _lane_keys(width: int, device: torch.device) -> torch.Tensor:
    """What each lane (slot, or position of a wide draw) adds to its draw's base."""
    return torch.arange(width, device=device) * _LANE_KEY
