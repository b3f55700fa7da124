"""The harness plays the model: deterministic tokens and drafts from a seed.

The token a request samples at position p is a pure function of (seed,
request id, p), so two engines given the same trace see the same model,
and a preempted request recomputes exactly the tokens it had. The fake
model is a model runner: it learns each request from SchedulerOutput alone
(prompt and token count from scheduled_new_reqs and resumed requests), runs
steps in the order they were scheduled and counts each request's tokens
itself, so it drives any engine that speaks the spec types, synchronous or
async. Like vLLM's model runner under async scheduling it knows the real
outcome of the previous step when it runs the next: a step samples at the
request's real next position, and placeholder drafts are the drafter's own
guesses for the positions after it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from schedspec.spec import PLACEHOLDER_TOKEN_ID, ModelRunnerOutput, SchedulerOutput


class StepEngine(Protocol):
    """The slice of the scheduler API that one iteration needs."""

    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> object: ...
    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None: ...


def _mix(*parts: object) -> int:
    """64 bits of blake2b over repr(parts): the same parts, the same bits, anywhere."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class _RequestMixer:
    """_mix(seed, request_id, *rest), a request's hash state kept after its common head.

    repr(parts) of a tuple is "(" + the items' reprs joined by ", " + ")", and blake2b
    reads its input as a stream: so hashing the head "(seed, request_id, " once and
    copying that state for each position gives _mix's bits at half its cost (it runs
    for every sampled token and draft)."""

    def __init__(self) -> None:
        self._heads: dict[tuple[int, str], Any] = {}  # (seed, request id) -> blake2b state

    def mix(self, seed: int, request_id: str, rest: str) -> int:
        """_mix(seed, request_id, *items) where rest is the items' reprs joined by ", "."""
        head = self._heads.get((seed, request_id))
        if head is None:
            text = f"({seed!r}, {request_id!r}, "
            head = self._heads[seed, request_id] = hashlib.blake2b(text.encode(), digest_size=8)
        state = head.copy()
        state.update(f"{rest})".encode())
        return int.from_bytes(state.digest(), "little")


@dataclass(frozen=True)
class StepDecisions:
    """What a test decides about one step's model output."""

    stops: Mapping[str, int] = field(default_factory=dict)  # request -> stop token it emits last
    accepted: Mapping[str, int] = field(default_factory=dict)  # request -> drafts accepted


@dataclass
class FakeModel:
    seed: int = 0
    vocab_size: int = 32_000
    # Chance that the drafter guesses a position right; verification accepts
    # drafts up to the first wrong one.
    draft_acceptance: float = 0.7
    num_speculative_tokens: int = 0
    _prompt_len: dict[str, int] = field(default_factory=dict)  # what the runner knows
    _num_tokens: dict[str, int] = field(default_factory=dict)  # as of the last step run
    # Per request that sampled in the last step run: the position of its first token.
    sampled_at: dict[str, int] = field(default_factory=dict)
    _mixer: _RequestMixer = field(default_factory=_RequestMixer, repr=False, compare=False)

    def token_at(self, request_id: str, position: int) -> int:
        """The token the target model samples at this position."""
        return self._mixer.mix(self.seed, request_id, repr(position)) % self.vocab_size

    def draft_at(self, request_id: str, position: int) -> int:
        """The drafter's guess for a position: right with probability draft_acceptance."""
        true = self.token_at(request_id, position)
        guess = self._mixer.mix(self.seed, request_id, f"{position!r}, 'draft'")
        hit = guess % 1000 < self.draft_acceptance * 1000
        return true if hit else (true + 1) % self.vocab_size

    def execute(
        self, scheduler_output: SchedulerOutput, decisions: StepDecisions | None = None
    ) -> ModelRunnerOutput:
        """One forward pass over the scheduled tokens: what each request emits.

        Without decisions, verification is greedy: drafts are accepted up to
        the first one that differs from the model's token. Decisions (drawn
        by a test) can fix the accepted count and force a stop token.
        """
        for rid in scheduler_output.finished_req_ids:
            self._prompt_len.pop(rid, None)
            self._num_tokens.pop(rid, None)
        computed_before: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            self._prompt_len[new.request_id] = len(new.prompt_token_ids)
            self._num_tokens[new.request_id] = len(new.prompt_token_ids)
            computed_before[new.request_id] = new.num_computed_tokens
        for cached in scheduler_output.scheduled_cached_reqs:
            rid = cached.request_id
            if cached.resumed:
                # A resumed request has no output in flight (it waits for stale
                # output to land), so its reported outputs are all it has.
                self._num_tokens[rid] = self._prompt_len[rid] + cached.num_output_tokens
            computed_before[rid] = cached.num_computed_tokens
        sampled: dict[str, list[int]] = {}
        self.sampled_at = {}
        for rid, num_scheduled in scheduler_output.num_scheduled_tokens.items():
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid, ())
            known = self._num_tokens[rid]
            if computed_before[rid] + num_scheduled - len(drafts) < known:
                continue  # a prefill chunk: no logits for a new position yet
            accepted = decisions.accepted.get(rid) if decisions else None
            tokens = self._verify(rid, known, self._real_drafts(rid, known, drafts), accepted)
            stop = decisions.stops.get(rid) if decisions else None
            if stop is not None:
                tokens[-1] = stop
            sampled[rid] = tokens
            self.sampled_at[rid] = known
            self._num_tokens[rid] = known + len(tokens)
        return ModelRunnerOutput(sampled_token_ids=sampled)

    def _real_drafts(self, request_id: str, known: int, drafts: Sequence[int]) -> list[int]:
        """A placeholder draft is the drafter's own guess for its position (the model
        runner proposes it where the scheduler could not)."""
        return [
            self.draft_at(request_id, known + i) if draft == PLACEHOLDER_TOKEN_ID else draft
            for i, draft in enumerate(drafts)
        ]

    def _verify(
        self, request_id: str, known: int, drafts: Sequence[int], accepted: int | None
    ) -> list[int]:
        """Draft i guesses position known + i. Keep the accepted drafts, then the
        model's own token at the first position not accepted."""
        if accepted is None:
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == self.token_at(
                request_id, known + accepted
            ):
                accepted += 1
        accepted = min(accepted, len(drafts))
        return [*drafts[:accepted], self.token_at(request_id, known + accepted)]

    def drafts_for(self, request_id: str, num_drafts: int) -> list[int]:
        """The drafter's proposal for the positions after the request's last known token."""
        start = self._num_tokens.get(request_id, 0)
        return [self.draft_at(request_id, start + i) for i in range(num_drafts)]

    def propose_drafts(self, model_output: ModelRunnerOutput) -> dict[str, list[int]]:
        """Drafts for every request that just emitted tokens (the drafter runs after sampling)."""
        if self.num_speculative_tokens == 0:
            return {}
        return {
            rid: self.drafts_for(rid, self.num_speculative_tokens)
            for rid in model_output.sampled_token_ids
        }
