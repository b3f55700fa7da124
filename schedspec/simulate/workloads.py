"""Workloads for the simulator: timed requests, synthetic or built in.

A synthetic workload draws Poisson arrivals (exponential gaps at `rate`
requests per second), prompt and output lengths from a LengthDistribution,
and puts a share of the requests into shared-prefix groups (a system prompt
per group), so prefix caching has something to hit. Everything is a pure
function of the seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Literal

from schedspec.simulate.errors import SimulationInputError
from schedspec.spec import Request

VOCAB_SIZE = 32_000

DistributionKind = Literal["fixed", "uniform", "lognormal"]


@dataclass(frozen=True)
class SimRequest:
    """A request and the simulated second it arrives at."""

    request_id: str
    arrival_time: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int  # the output length: no EOS, the request runs to it
    priority: int = 0
    source: str = ""  # where it came from, for error messages ("trace.jsonl line 4")

    def to_request(self) -> Request:
        return Request(
            self.request_id,
            self.prompt_token_ids,
            max_tokens=self.max_tokens,
            priority=self.priority,
        )


@dataclass(frozen=True)
class LengthDistribution:
    """Token counts: fixed:N, uniform:LO:HI (inclusive), lognormal:MEDIAN:SIGMA[:MAX]."""

    kind: DistributionKind
    a: float
    b: float = 0.0
    cap: int | None = None  # lognormal draws are clipped to [1, cap]

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        value = max(1, round(rng.lognormvariate(math.log(self.a), self.b)))
        return value if self.cap is None else min(value, self.cap)

    @classmethod
    def parse(cls, text: str, name: str) -> LengthDistribution:
        """Parse a flag value; errors name the flag `name` and the bound."""
        kind, *args = text.split(":")
        try:
            numbers = [float(a) for a in args]
        except ValueError:
            raise SimulationInputError(
                name, f"numbers expected after the kind, got {text!r}"
            ) from None
        if kind == "fixed" and len(numbers) == 1 and numbers[0] >= 1 and numbers[0].is_integer():
            return cls("fixed", numbers[0])
        if kind == "uniform" and len(numbers) == 2 and 1 <= numbers[0] <= numbers[1]:
            return cls("uniform", numbers[0], numbers[1])
        if kind == "lognormal" and len(numbers) in (2, 3) and numbers[0] >= 1 and numbers[1] > 0:
            cap = int(numbers[2]) if len(numbers) == 3 else None
            if cap is None or cap >= 1:
                return cls("lognormal", numbers[0], numbers[1], cap)
        raise SimulationInputError(
            name,
            f"expected fixed:N (N >= 1), uniform:LO:HI (1 <= LO <= HI) or "
            f"lognormal:MEDIAN:SIGMA[:MAX] (MEDIAN >= 1, SIGMA > 0), got {text!r}",
        )


@dataclass(frozen=True)
class SyntheticWorkload:
    num_requests: int = 400
    rate: float = 20.0  # mean arrivals per simulated second (Poisson)
    prompt_len: LengthDistribution = field(
        default_factory=lambda: LengthDistribution("lognormal", 400, 0.8, 2500)
    )
    output_len: LengthDistribution = field(
        default_factory=lambda: LengthDistribution("lognormal", 150, 0.7, 1000)
    )
    prefix_groups: int = 4  # distinct shared system prompts
    prefix_len: int = 256  # tokens in each
    prefix_share: float = 0.5  # chance a request starts with one of them

    def __post_init__(self) -> None:
        checks = (
            ("num_requests", self.num_requests >= 1, ">= 1"),
            ("rate", self.rate > 0 and math.isfinite(self.rate), "> 0"),
            ("prefix_groups", self.prefix_groups >= 0, ">= 0"),
            ("prefix_len", self.prefix_len >= 0, ">= 0"),
            ("prefix_share", 0 <= self.prefix_share <= 1, "in [0, 1]"),
        )
        for name, ok, bound in checks:
            if not ok:
                raise SimulationInputError(name, f"must be {bound}, got {getattr(self, name)}")

    def generate(self, seed: int, max_model_len: int) -> list[SimRequest]:
        """The requests in arrival order. Prompt and output are trimmed so each
        fits max_model_len (a prompt leaves room for at least one output token)."""
        rng = random.Random(seed)
        prefixes = [_tokens(rng, self.prefix_len) for _ in range(self.prefix_groups)]
        clock = 0.0
        requests = []
        for i in range(self.num_requests):
            clock += rng.expovariate(self.rate)
            head: tuple[int, ...] = ()
            if prefixes and rng.random() < self.prefix_share:
                head = prefixes[rng.randrange(len(prefixes))]
            prompt = (head + _tokens(rng, self.prompt_len.draw(rng)))[: max_model_len - 1]
            output = min(self.output_len.draw(rng), max_model_len - len(prompt))
            requests.append(SimRequest(f"r{i}", clock, prompt, output, source=f"request {i}"))
        return requests


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.choices(range(VOCAB_SIZE), k=n))


# The chunked-prefill experiment: decodes in flight when one long prompt arrives.
LONG_PROMPT_ID = "long"
NUM_DECODES = 16
DECODE_PROMPT_LEN = 64
DECODE_OUTPUT_LEN = 256
LONG_PROMPT_LEN = 3500
LONG_PROMPT_ARRIVAL = 0.5  # s: the decodes have been running for a while


def long_prompt_among_decodes(seed: int, max_model_len: int) -> list[SimRequest]:
    """NUM_DECODES short prompts with long outputs at t=0, then one long prompt."""
    rng = random.Random(seed)
    decodes = [
        SimRequest(f"d{i}", 0.0, _tokens(rng, DECODE_PROMPT_LEN), DECODE_OUTPUT_LEN)
        for i in range(NUM_DECODES)
    ]
    long_len = min(LONG_PROMPT_LEN, max_model_len - 16)
    long = SimRequest(LONG_PROMPT_ID, LONG_PROMPT_ARRIVAL, _tokens(rng, long_len), 16)
    return [*decodes, long]


BUILTIN_WORKLOADS = ("mixed", "long-prompt")


def builtin_workload(
    name: str, seed: int, max_model_len: int, synthetic: SyntheticWorkload | None = None
) -> list[SimRequest]:
    """ "mixed" is the SyntheticWorkload (defaults unless given); "long-prompt" the experiment's."""
    if name == "mixed":
        return (synthetic or SyntheticWorkload()).generate(seed, max_model_len)
    if name == "long-prompt":
        return long_prompt_among_decodes(seed, max_model_len)
    raise SimulationInputError(
        "workload", f"expected one of {', '.join(BUILTIN_WORKLOADS)} or a .jsonl path, got {name!r}"
    )


def with_fields(workload: SyntheticWorkload, **fields: object) -> SyntheticWorkload:
    """A copy with the given (non-None) fields replaced: CLI flags over the defaults."""
    given = {k: v for k, v in fields.items() if v is not None}
    return replace(workload, **given)  # type: ignore[arg-type]
