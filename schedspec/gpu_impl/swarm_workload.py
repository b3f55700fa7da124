"""Random workloads and a model for B instances, drawn on the device.

Every draw is a pure function of (seed, instance id, tick, purpose, slot),
a counter-based generator, not a stream: instance i alone (B = 1, id i)
goes through exactly the ticks it went through among thousands. That is
how a swarm finding becomes a trace (schedspec.properties.swarm): re-run the
one instance with a recorder attached. Draws nothing reads are not made
(drafts of slots not running, accepted drafts and stops of slots not
sampling, tokens of prompts that take the shared pattern): every value that
is read equals the full draw's at its position.

One tick: maybe abort a live request, maybe add one, propose drafts for
running requests, schedule, let the model answer (accepted drafts and an
occasional forced stop are drawn), update. Stop tokens lie outside the
model's vocabulary, so only a drawn stop ends a request early: a trace's
Step decisions then say everything the model decided.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from schedspec.gpu_impl.batch_state import EMPTY, NO_TOKEN, RUNNING
from schedspec.gpu_impl.engine import BatchedScheduler, NewRequests, UpdateResult
from schedspec.gpu_impl.flat_index import pick, selected, write_rows
from schedspec.gpu_impl.hashing import mix64
from schedspec.gpu_impl.step_plan import StepPlan

VOCAB = 64  # the model's tokens; the harness model's default vocabulary (a power of 2, < 128)
STOP_TOKEN = VOCAB + 36  # never sampled, only forced
# Prompt tokens: a power of two, so that a draw's low bits are a token (no lookup).
PROMPT_VOCAB = 8
_VOCAB_BITS = VOCAB.bit_length() - 1

# Purposes: independent streams of the counter-based generator.
_ABORT, _ABORT_PICK, _ADD, _LENGTH, _TOKENS, _MAX_TOKENS = 1, 2, 3, 4, 5, 6
_EOS, _PRIORITY, _DRAFTS, _ACCEPT, _STOP, _SAMPLE, _PREFIX = 7, 8, 9, 10, 11, 12, 13
_DRAFT_TOKENS = 14
_PURPOSES = 14  # purposes are 1.._PURPOSES
# Token draws come from 7-bit lanes of a 62-bit draw.
_LANES_PER_DRAW = 8
_LANE_SHIFTS = torch.arange(_LANES_PER_DRAW, dtype=torch.int64) * 7
_DRAW_BITS = 2**62 - 1


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
    drafts: torch.Tensor  # [B, S] drafts proposed (-1: no proposal)
    plan: StepPlan
    accepted: torch.Tensor  # [B, S] drafts accepted per sampling request (0 elsewhere)
    stopped: torch.Tensor  # [B, S] bool: the model emitted the stop token
    sampled: torch.Tensor  # [B, S] tokens emitted (0: none)
    result: UpdateResult


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
        self._purpose_keys = torch.arange(1, _PURPOSES + 1, device=engine.device).unsqueeze(1)
        self._tick_bases = self._instance_keys.unsqueeze(0)  # set on a tick's first draw
        self._tick_bases_of = -1

    @torch.inference_mode()
    def draws(
        self, purposes: tuple[int, ...], width: int = 0, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Non-negative draws for this tick, one row per purpose: [P, B] (width 0) or
        [P, B, width] (for the instances `rows` only, if given)."""
        bases = self._bases(rows)
        base = torch.stack([bases[purpose - 1] for purpose in purposes])
        if width == 0:
            return base & _DRAW_BITS
        return mix64(base.unsqueeze(2) + _lane_keys(width, base.device)) & _DRAW_BITS

    def draw(self, purpose: int, width: int = 0, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Non-negative draws, [B] (width 0) or [B, width], for this tick and purpose
        (for the instances `rows` only, if given)."""
        return self.draws((purpose,), width, rows)[0]

    @torch.inference_mode()
    def draws_at(self, purposes: tuple[int, ...], width: int, at: torch.Tensor) -> torch.Tensor:
        """[P, len(at)]: the draws of draws(purposes, width) at flat positions `at` of
        [B, width], mixing only those (a draw a slot does not use costs nothing)."""
        bases = self._bases()
        keys = torch.stack([bases[purpose - 1] for purpose in purposes]).unsqueeze(2)
        keys = (keys + _lane_keys(width, at.device)).view(len(purposes), -1)
        return mix64(keys.index_select(1, at)) & _DRAW_BITS

    def _bases(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[purposes, B] (or [purposes, len(rows)]): each draw's mix of (instance, tick,
        purpose), row p - 1 for purpose p. All purposes are mixed at once on a tick's
        first draw (one mix over [purposes, B], not one per draw: on [B] the ops' own
        overhead dominates)."""
        if self._tick_bases_of != self.tick_index:
            tick_keys = self._purpose_keys + self.tick_index * 7919
            self._tick_bases = mix64(self._instance_keys + tick_keys)
            self._tick_bases_of = self.tick_index
        return self._tick_bases if rows is None else self._tick_bases.index_select(1, rows)

    @torch.inference_mode()
    def tick(self, after_schedule: Callable[[StepPlan], None] | None = None) -> Tick:
        """One tick for every instance; after_schedule sees the plan before the model runs."""
        engine = self.engine
        aborted = self._abort()
        added = self._add()
        drafts = self._propose()
        plan = engine.schedule()
        if after_schedule is not None:
            after_schedule(plan)
        accepted, stopped, tokens, count = self._model(plan)
        result = engine.update_from_output(tokens, count, plan.num_drafts, plan.rank)
        self.tick_index += 1
        return Tick(aborted, added, drafts, plan, accepted, stopped, count, result)

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
        return slot.scatter_(0, inst, torch.where(chosen < st.slots, chosen, -1))

    def _add(self) -> tuple[NewRequests, NewRequests]:
        st = self.engine.state
        empty = st.status == EMPTY
        # Slots past the tensors' width are empty too: the first of them is the first
        # empty slot of an instance whose columns are all in use (the engine widens).
        has_empty = empty.any(dim=1)
        room = has_empty | (st.slots < self.engine.capacity)
        go = ((self.draw(_ADD) & 1023) < self.shape.add_chance) & room
        slot = torch.where(has_empty, torch.argmax(empty.long(), dim=1), st.slots)
        arriving = selected(go)
        # The arrivals whose prompt is the shared pattern first, then those with their
        # own tokens (x & 1 is x % 2: draws are >= 0).
        shared = (self.draw(_PREFIX, rows=arriving) & 1) == 0
        inst = torch.cat([pick(arriving, selected(shared)), pick(arriving, selected(~shared))])
        num_shared = int(shared.sum())
        # Only the arriving instances' draws (x & (2**n - 1) is x % 2**n).
        length, eos, max_tokens, priority = self.draws(
            (_LENGTH, _EOS, _MAX_TOKENS, _PRIORITY), rows=inst
        )
        pattern, own = self._prompts(num_shared, inst[num_shared:])
        slots = slot.index_select(0, inst)
        prompt_len = 1 + length % (self.config.max_model_len - 1)
        max_tokens = 1 + max_tokens % self.shape.max_new_tokens
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
        device = own_inst.device
        pattern = (torch.arange(longest, device=device) * 5 // 3) % PROMPT_VOCAB
        tokens = self.draw_small(_TOKENS, longest, own_inst, bits=PROMPT_VOCAB.bit_length() - 1)
        return pattern.expand(num_shared, longest), tokens

    def draw_small(
        self, purpose: int, width: int, rows: torch.Tensor | None = None, bits: int = 7
    ) -> torch.Tensor:
        """Draws below 2**bits (bits <= 7), [B, width] (or [len(rows), width]),
        contiguous: each 62-bit draw yields eight 7-bit lanes, an eighth of the mixing of
        one draw per value (token draws were most of the workload's own cost); fewer
        bits keep a lane's low bits."""
        lanes = self.draw(purpose, -(-width // _LANES_PER_DRAW), rows)
        shifted = (lanes.unsqueeze(-1) >> _LANE_SHIFTS.to(lanes.device)).flatten(1)
        return shifted[:, :width] & ((1 << bits) - 1)

    def _propose(self) -> torch.Tensor:
        st, k = self.engine.state, self.config.num_speculative_tokens
        if k == 0:
            return torch.full_like(st.status, -1)
        mask = st.status == RUNNING
        # Counts for the running slots only (the engine reads no other).
        at = selected(mask)
        count = torch.zeros_like(st.status).view(-1)
        write_rows(count, at, self.draws_at((_DRAFTS,), st.slots, at)[0] % (k + 1))
        count = count.view_as(st.status)
        tokens = self.draw_small(_DRAFT_TOKENS, st.slots * k, bits=_VOCAB_BITS)
        tokens = tokens.view(st.batch, st.slots, k)
        self.engine.update_draft_token_ids(mask, tokens, count)
        return torch.where(mask, count, -1)

    def _model(
        self, plan: StepPlan
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Who samples (a step that reached the known tokens), how many drafts pass,
        whether the last token is the stop token, and the tokens themselves."""
        st, k = self.engine.state, self.config.num_speculative_tokens
        before = plan.computed_before + plan.scheduled - plan.num_drafts
        samples = (plan.scheduled > 0) & (before >= st.num_tokens)
        # Accepted drafts and stops are drawn for the sampling slots only (0 elsewhere).
        at = selected(samples)
        accept_draw, stop_draw = self.draws_at((_ACCEPT, _STOP), st.slots, at)
        accepted_here = accept_draw % (pick(plan.num_drafts, at) + 1)
        stops_here = (stop_draw & 1023) < self.shape.stop_chance
        stops_here &= pick(st.eos, at) == STOP_TOKEN
        accepted, count = torch.zeros_like(st.status), torch.zeros_like(st.status)
        write_rows(accepted, at, accepted_here)
        write_rows(count, at, accepted_here + 1)
        stop = torch.zeros_like(samples)
        write_rows(stop, at, stops_here)
        tokens = self.draw_small(_SAMPLE, st.slots * (k + 1), bits=_VOCAB_BITS)
        tokens = tokens.view(st.batch, st.slots, k + 1)
        # Accepted drafts come first, column by column on [B, S] (a where over [B, S, K]
        # with a [B, S] mask broadcast innermost costs several times as much; so did an
        # arithmetic blend on these strided columns and a gather of the accepting rows).
        for t in range(k):
            column = tokens[..., t]
            column.copy_(torch.where(accepted > t, plan.drafts[..., t], column))
        # The stop token replaces the last emitted token: few slots, written by flat index.
        stopping = selected(stops_here)
        last = at.index_select(0, stopping) * (k + 1) + accepted_here.index_select(0, stopping)
        write_rows(tokens, last, STOP_TOKEN)
        return accepted, stop, tokens, count


def _pick(mask: torch.Tensor, draw: torch.Tensor) -> torch.Tensor:
    """A slot among the masked ones, picked by draw (the width where none): the n-th
    masked slot is the number of slots before the running count passes n."""
    nth = draw % mask.sum(dim=1).clamp(min=1)
    return (torch.cumsum(mask, dim=1) <= nth.unsqueeze(1)).sum(dim=1)


def _lane_keys(width: int, device: torch.device) -> torch.Tensor:
    """What each lane (slot, or position of a wide draw) adds to its draw's base."""
    return torch.arange(width, device=device) * 104_729
