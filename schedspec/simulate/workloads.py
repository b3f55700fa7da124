"""Workloads for the simulator: timed requests, synthetic or built in.

A synthetic workload draws Poisson arrivals (exponential gaps at `rate`
requests per second), prompt and output lengths from a LengthDistribution,
and puts a share of the requests into shared-prefix groups (a system prompt
per group), so prefix caching has something to hit. Everything is a pure
function of the seed.

A workload is produced on demand (Workload): iterating it draws its requests
afresh, in arrival order, and a prompt's tokens are drawn only as long as the
request may be (cut to max_model_len first), so a large workload never holds
all its prompts at once. Sizes are bounded (MAX_SIM_REQUESTS, MAX_PREFIX_GROUPS):
the simulator keeps every request's timeline for the metrics.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

from schedspec.simulate.errors import SimulationInputError
from schedspec.spec import Request, shown
from schedspec.spec.config import MAX_MODEL_LEN

VOCAB_SIZE = 32_000
# The most requests one simulation runs: each keeps its timeline (a time per output
# token) for the metrics, about 5 KB for a request of 150 output tokens.
MAX_SIM_REQUESTS = 100_000
# Each shared-prefix group's system prompt is held for the whole run.
MAX_PREFIX_GROUPS = 1_000
# Length distributions: a length past any config's max_model_len (spec.config's
# MAX_MODEL_LEN) is cut anyway; SIGMA past 10 spreads lengths over e**60 and beyond.
MAX_LENGTH = MAX_MODEL_LEN
MAX_SIGMA = 10.0


class Workload:
    """Requests in arrival order, drawn afresh on every iteration (from their seed or
    their file's records); len() is known up front."""

    def __init__(self, produce: Callable[[], Iterator[SimRequest]], size: int) -> None:
        self._produce = produce
        self._size = size

    def __iter__(self) -> Iterator[SimRequest]:
        return self._produce()

    def __len__(self) -> int:
        return self._size


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
        """Parse a flag value; errors name the flag `name` and the bound. Lengths are
        at most MAX_LENGTH (a draw is cut to max_model_len anyway), SIGMA at most
        MAX_SIGMA (lengths spread over e**(6 * 10) already)."""
        kind, *args = text.split(":")
        try:
            numbers = [float(a) for a in args]
        except ValueError:
            raise SimulationInputError(
                name, f"numbers expected after the kind, got {shown(text)}"
            ) from None
        lengths = numbers[:1] if kind == "lognormal" else numbers
        if kind == "lognormal" and len(numbers) == 3:
            lengths.append(numbers[2])
        if all(1 <= n <= MAX_LENGTH for n in lengths):
            if kind == "fixed" and len(numbers) == 1 and numbers[0].is_integer():
                return cls("fixed", numbers[0])
            if kind == "uniform" and len(numbers) == 2 and numbers[0] <= numbers[1]:
                return cls("uniform", numbers[0], numbers[1])
            if kind == "lognormal" and len(numbers) in (2, 3) and 0 < numbers[1] <= MAX_SIGMA:
                cap = int(numbers[2]) if len(numbers) == 3 else None
                return cls("lognormal", numbers[0], numbers[1], cap)
        raise SimulationInputError(
            name,
            f"expected fixed:N, uniform:LO:HI (LO <= HI) or lognormal:MEDIAN:SIGMA[:MAX] "
            f"(0 < SIGMA <= {MAX_SIGMA:g}), lengths in [1, {MAX_LENGTH}], got {shown(text)}",
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
            (
                "num_requests",
                _is_int(self.num_requests) and 1 <= self.num_requests <= MAX_SIM_REQUESTS,
                f"in [1, {MAX_SIM_REQUESTS}] (each request's timeline is kept for the metrics)",
            ),
            ("rate", _is_number(self.rate) and self.rate > 0 and math.isfinite(self.rate), "> 0"),
            (
                "prefix_groups",
                _is_int(self.prefix_groups) and 0 <= self.prefix_groups <= MAX_PREFIX_GROUPS,
                f"in [0, {MAX_PREFIX_GROUPS}] (each group's system prompt is held for the run)",
            ),
            ("prefix_len", _is_int(self.prefix_len) and self.prefix_len >= 0, ">= 0"),
            (
                "prefix_share",
                _is_number(self.prefix_share) and 0 <= self.prefix_share <= 1,
                "in [0, 1]",
            ),
        )
        for name, ok, bound in checks:
            if not ok:
                raise SimulationInputError(
                    name, f"must be {bound}, got {shown(getattr(self, name))}"
                )

    def generate(self, seed: int, max_model_len: int) -> Workload:
        """The requests in arrival order, drawn when iterated. Prompt and output are
        trimmed so each fits max_model_len (a prompt leaves room for at least one
        output token); a prompt's tokens are drawn only up to that length."""
        return Workload(lambda: self._requests(seed, max_model_len), self.num_requests)

    def _requests(self, seed: int, max_model_len: int) -> Iterator[SimRequest]:
        rng = random.Random(seed)
        room = max_model_len - 1
        prefixes = [_tokens(rng, min(self.prefix_len, room)) for _ in range(self.prefix_groups)]
        clock = 0.0
        for i in range(self.num_requests):
            clock += rng.expovariate(self.rate)
            head: tuple[int, ...] = ()
            if prefixes and rng.random() < self.prefix_share:
                head = prefixes[rng.randrange(len(prefixes))]
            prompt = head + _tokens(rng, min(self.prompt_len.draw(rng), room - len(head)))
            output = min(self.output_len.draw(rng), max_model_len - len(prompt))
            yield SimRequest(f"r{i}", clock, prompt, output, source=f"request {i}")


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.choices(range(VOCAB_SIZE), k=n))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
) -> Workload:
    """ "mixed" is the SyntheticWorkload (defaults unless given); "long-prompt" the experiment's."""
    if name == "mixed":
        return (synthetic or SyntheticWorkload()).generate(seed, max_model_len)
    if name == "long-prompt":
        requests = long_prompt_among_decodes(seed, max_model_len)
        return Workload(lambda: iter(requests), len(requests))
    raise SimulationInputError(
        "workload",
        f"expected one of {', '.join(BUILTIN_WORKLOADS)} or a .jsonl path, got {shown(name)}",
    )


def with_fields(workload: SyntheticWorkload, **fields: object) -> SyntheticWorkload:
    """A copy with the given (non-None) fields replaced: CLI flags over the defaults."""
    given = {k: v for k, v in fields.items() if v is not None}
    return replace(workload, **given)  # type: ignore[arg-type]
