"""Random workloads and a model for B instances, drawn on the device.

Every draw is a pure function of (seed, instance id, tick, purpose, slot),
a counter-based generator, not a stream: instance i alone (B = 1, id i)
goes through exactly the ticks it went through among thousands. That is
how a swarm finding becomes a trace (schedspec.properties.swarm): re-run the
one instance with a recorder attached.

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
from schedspec.gpu_impl.flat_index import selected
from schedspec.gpu_impl.hashing import mix64
from schedspec.gpu_impl.step_plan import StepPlan

VOCAB = 64  # the model's tokens; the harness model's default vocabulary (a power of 2, < 128)
STOP_TOKEN = VOCAB + 36  # never sampled, only forced
PROMPT_VOCAB = 6  # few distinct prompt tokens: shared prefixes hit the cache

# Purposes: independent streams of the counter-based generator.
_ABORT, _ABORT_PICK, _ADD, _LENGTH, _TOKENS, _MAX_TOKENS = 1, 2, 3, 4, 5, 6
_EOS, _PRIORITY, _DRAFTS, _ACCEPT, _STOP, _SAMPLE, _PREFIX = 7, 8, 9, 10, 11, 12, 13
_DRAFT_TOKENS = 14
# Token draws come from 7-bit lanes of a 62-bit draw.
_LANES_PER_DRAW = 8
_LANE_SHIFTS = torch.arange(_LANES_PER_DRAW, dtype=torch.int64) * 7
_PROMPT_TOKEN = torch.arange(128, dtype=torch.int64) % PROMPT_VOCAB


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
    added: NewRequests  # the requests added (at most one per instance)
    drafts: torch.Tensor  # [B, S] drafts proposed (-1: no proposal)
    plan: StepPlan
    accepted: torch.Tensor  # [B, S] drafts accepted per sampling request
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

    def draw(self, purpose: int, width: int = 0, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Non-negative draws, [B] (width 0) or [B, width], for this tick and purpose
        (for the instances `rows` only, if given)."""
        ids = self.ids if rows is None else self.ids[rows]
        base = mix64(mix64(ids * 1_000_003 + self.seed) + self.tick_index * 7919 + purpose)
        if width == 0:
            return base & (2**62 - 1)
        lanes = torch.arange(width, device=self.ids.device)
        return mix64(base.unsqueeze(1) + lanes * 104_729) & (2**62 - 1)

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
        st = self.engine.state
        live = st.status != EMPTY
        pick = _pick(live, self.draw(_ABORT_PICK))
        go = (self.draw(_ABORT) % 1024 < self.shape.abort_chance) & live.any(dim=1)
        slot = torch.where(go, pick, -1)
        mask = torch.zeros_like(live)
        rows = torch.arange(st.batch, device=st.device)
        mask[rows[go], slot[go]] = True
        self.engine.finish_requests(mask, torch.zeros_like(st.status))
        return slot

    def _add(self) -> NewRequests:
        st, config = self.engine.state, self.config
        empty = st.status == EMPTY
        # Slots past the tensors' width are empty too: the first of them is the first
        # empty slot of an instance whose columns are all in use (the engine widens).
        has_empty = empty.any(dim=1)
        room = has_empty | (st.slots < self.engine.capacity)
        go = (self.draw(_ADD) % 1024 < self.shape.add_chance) & room
        slot = torch.where(has_empty, torch.argmax(empty.long(), dim=1), st.slots)
        longest = config.max_model_len - 1
        inst = torch.nonzero(go).squeeze(1)
        length = (1 + self.draw(_LENGTH) % longest)[inst]
        positions = torch.arange(longest, device=st.device)
        # Half the prompts start with a shared pattern, so the prefix cache hits.
        shared = (positions * 5 // 3) % PROMPT_VOCAB
        # draw % PROMPT_VOCAB, looked up: an int64 remainder per token costs more. Drawn
        # a whole number of lanes wide (contiguous: no copy before the lookup).
        whole = -(-longest // _LANES_PER_DRAW) * _LANES_PER_DRAW
        small = self.draw_small(_TOKENS, whole, inst)
        own = _PROMPT_TOKEN.to(small.device).index_select(0, small.view(-1)).view_as(small)
        prefix_len = torch.where(self.draw(_PREFIX)[inst] % 2 == 0, length, 0)
        # Tokens past prompt_len are padding: nobody reads them (hashing counts, traces
        # slice), so they keep whatever was drawn.
        prompts = torch.where(positions < prefix_len.unsqueeze(1), shared, own[:, :longest])
        eos = torch.where(self.draw(_EOS) % 2 == 0, STOP_TOKEN, NO_TOKEN)
        new = NewRequests(
            inst=inst,
            slot=slot[inst],
            prompt=prompts,
            prompt_len=length,
            max_tokens=(1 + self.draw(_MAX_TOKENS) % self.shape.max_new_tokens)[inst],
            eos=eos[inst],
            stops=torch.full((inst.numel(), 1), NO_TOKEN, device=st.device),
            priority=(self.draw(_PRIORITY) % 4)[inst],
        )
        self.engine.add_requests(new)
        return new

    def draw_small(
        self, purpose: int, width: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Draws below 128, [B, width] (or [len(rows), width]): each 62-bit draw yields
        eight 7-bit lanes, an eighth of the mixing of one draw per value (token draws
        were most of the workload's own cost)."""
        lanes = self.draw(purpose, -(-width // _LANES_PER_DRAW), rows)
        pieces = (lanes.unsqueeze(-1) >> _LANE_SHIFTS.to(lanes.device)) & 127
        return pieces.flatten(1)[:, :width]

    def _propose(self) -> torch.Tensor:
        st, k = self.engine.state, self.config.num_speculative_tokens
        if k == 0:
            return torch.full_like(st.status, -1)
        count = self.draw(_DRAFTS, st.slots) % (k + 1)
        mask = st.status == RUNNING
        tokens = self.draw_small(_DRAFT_TOKENS, st.slots * k).view(st.batch, st.slots, k)
        tokens &= VOCAB - 1
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
        accepted = self.draw(_ACCEPT, st.slots) % (plan.num_drafts + 1)
        stop = (
            samples
            & (st.eos == STOP_TOKEN)
            & ((self.draw(_STOP, st.slots) & 1023) < self.shape.stop_chance)
        )
        count = torch.where(samples, accepted + 1, 0)
        tokens = self.draw_small(_SAMPLE, st.slots * (k + 1)).reshape(st.batch, st.slots, k + 1)
        tokens = tokens.contiguous()
        tokens &= VOCAB - 1
        # Accepted drafts come first, column by column on [B, S] (a where over [B, S, K]
        # with a [B, S] mask broadcast innermost costs several times as much).
        for t in range(k):
            column = tokens[..., t]
            column.copy_(torch.where(accepted > t, plan.drafts[..., t], column))
        # The stop token replaces the last emitted token: few slots, written by flat index.
        row = selected(stop)
        at = row * (k + 1) + accepted.reshape(-1).index_select(0, row)
        tokens.view(-1).index_fill_(0, at, STOP_TOKEN)
        return accepted, stop, tokens, count


def _pick(mask: torch.Tensor, draw: torch.Tensor) -> torch.Tensor:
    """A slot among the masked ones, picked by draw (0 where none)."""
    n = mask.sum(dim=1).clamp(min=1)
    nth = draw % n
    rank = torch.cumsum(mask.long(), dim=1) - 1
    return torch.argmax((mask & (rank == nth.unsqueeze(1))).long(), dim=1)
