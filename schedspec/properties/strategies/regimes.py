"""Config regimes: the default configs narrowed, now and then, to where vLLM's bugs live.

The default config strategy draws every knob on its own, so a config that is in a
bug's corner on several knobs at once (the priority policy AND several seats AND a
tight cache AND small chunks) comes up in a few examples of a run, some runs none:
benchmarks/bench_mutants.py measured seeded bugs there surviving `schedspec check`
on most seeds. Each regime below takes a drawn config and moves the few knobs its
corner needs (the rest of the draw is kept), so that every CI-profile run spends
some of its examples in each corner. A regime names the corner it is for
(corners.py) and the vLLM bug behind it; its weight says how often.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from schedspec.properties.strategies import hybrid_regimes
from schedspec.spec import SchedulerConfig
from schedspec.spec.config import MIN_SGLANG_MAX_MODEL_LEN, smallest_pool

MOST_SEATS = 8  # the most max_num_seqs the default configs draw


def _tight_cache(config: SchedulerConfig) -> int:
    """Exactly one max_model_len request of blocks: any two requests that grow contend."""
    return -(-config.max_model_len // config.block_size)


def _padded_budget(config: SchedulerConfig, budget: int) -> int:
    """A padded admission (1 + K tokens) must fit the budget."""
    if config.pad_spec_decode:
        return max(budget, 1 + config.num_speculative_tokens)
    return budget


def _priority_served_late(config: SchedulerConfig, num_blocks: int) -> SchedulerConfig:
    """Priority policy, eight seats, blocks of two to four tokens, prefix caching, no
    watermark, and a long-prefill cap of a sixteenth of max_model_len (at least a block)
    under a budget of half; num_blocks max_model_len requests of cache.

    The cap keeps requests in their prefill (needing blocks) for many steps, so a more
    urgent one that arrived later runs behind less urgent ones in the running list, with
    others after it; when the blocks run out, the victim sits before the request being
    served (the loop index #49097 got wrong; a victim already scheduled in the step,
    #23347), and the budget, eight caps wide, still serves the requests after it. Blocks
    of one token would make the first request in the list the first to run out, and
    preempt itself; of two to four, with chunks of at least a block, what a victim was
    scheduled in the step completes blocks, registered in the prefix cache for KV it
    will never compute.
    """
    block_size = min(max(config.block_size, 2), 4)
    seats = max(config.max_num_seqs, MOST_SEATS)
    budget = max(seats, config.max_model_len // 2)
    cap = min(config.max_model_len, max(block_size, config.max_model_len // 16))
    return dataclasses.replace(
        config,
        policy="priority",
        enable_prefix_caching=True,
        block_size=block_size,
        max_num_seqs=seats,
        num_blocks=num_blocks * -(-config.max_model_len // block_size),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=cap,
        max_num_batched_tokens=_padded_budget(config, budget),
        # No watermark: in a cache this small, one would hold every admission after
        # the first, and keep the running list too short for a victim ahead.
        watermark=0.0,
    )


def priority_contention(config: SchedulerConfig) -> SchedulerConfig:
    """_priority_served_late with a cache of two max_model_len requests: several run at
    once, so a request after the one served is there to be skipped. Measured on
    victim-index-not-adjusted, every config narrowed so, 20 examples, seeds 1-20:
    caught on 16 (a cap of a sixteenth below a block: 12; a cache of one request: 7)."""
    return _priority_served_late(config, 2)


def priority_tight_cache(config: SchedulerConfig) -> SchedulerConfig:
    """_priority_served_late with a cache of one max_model_len request: a victim is
    preempted in most steps that grow a request, often right after its chunk completed
    blocks. Measured on priority-victim-stays-cached, every config narrowed so, 20
    examples, seeds 1-20: caught on 14 to 16 (a cache of two requests: 11)."""
    return _priority_served_late(config, 1)


def tight_cache(config: SchedulerConfig) -> SchedulerConfig:
    """The tight cache with at least two seats, under fcfs: decodes preempt each other
    constantly, so victims are picked among several (fcfs: the newest), go back to the
    front of the queue, resume with their outputs (#18115), and under async scheduling
    are preempted with a step still in flight whose output then lands stale (#41190).

    fcfs, because the priority regimes above already give the priority policy its
    tight caches, and because what a preemption must be needed for (PREEMPT-NEEDED) is
    checked under fcfs alone. Measured on running-prefill-reserves-whole-prompt, every
    config narrowed so, 5 examples, seeds 1-40: caught on 36 (the policy as drawn: 13)."""
    seats = max(config.max_num_seqs, 2)
    return dataclasses.replace(
        config,
        policy="fcfs",
        max_num_seqs=seats,
        num_blocks=_tight_cache(config),
        max_num_batched_tokens=max(config.max_num_batched_tokens, seats),
    )


def head_of_line(config: SchedulerConfig) -> SchedulerConfig:
    """Chunked prefill off, at least two seats, the smallest budget allowed
    (max_model_len) and no long-prefill cap: a long prompt waiting behind a decode does
    not fit the budget left, and nothing behind it may be admitted in its place.
    Measured on chunking-off-queue-not-blocked, every config narrowed so, seeds 1-10:
    caught on 10 (with the cap as drawn, the regime caught nothing the plain draws
    did not)."""
    seats = max(config.max_num_seqs, 2)
    budget = max(config.max_model_len, seats)
    return dataclasses.replace(
        config,
        max_num_seqs=seats,
        enable_chunked_prefill=False,
        # No long-prefill cap: a capped prompt would fit the budget left, and never block.
        long_prefill_token_threshold=0,
        max_num_batched_tokens=_padded_budget(config, budget),
    )


def _with_padding(
    config: SchedulerConfig,
    cap: int,
    budget: int,
    chunked: bool,
    max_model_len: int | None = None,
) -> SchedulerConfig:
    """Spec-decode padding on, with at least one draft and two seats (a padded
    admission is one beside a running request), and the cap, budget, chunking and
    max_model_len (None: as drawn) given, in one replace (each config a replace makes
    must be valid: the budget moves with the seats, the cap with max_model_len)."""
    return dataclasses.replace(
        config,
        max_model_len=config.max_model_len if max_model_len is None else max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=cap,
        max_num_batched_tokens=budget,
        max_num_seqs=_padded_seats(config),
        num_speculative_tokens=max(config.num_speculative_tokens, 1),
        # The drafter's lookahead as drawn, or K's (None) where none was drawn.
        num_lookahead_tokens=config.num_lookahead_tokens if config.num_speculative_tokens else None,
        pad_spec_decode=True,
    )


def _padded_seats(config: SchedulerConfig) -> int:
    return max(config.max_num_seqs, 2)


def _smallest_padded_budget(config: SchedulerConfig) -> int:
    """The smallest budget padding allows under _with_padding: 1 + K, or the seats."""
    return max(_padded_seats(config), 1 + max(config.num_speculative_tokens, 1))


# padded_under_a_cap's longest context: requests of up to 16 tokens.
SHORT_MAX_MODEL_LEN = 16
# padded_near_max_model_len's: most one-token admissions are then near the end.
SHORTEST_MAX_MODEL_LEN = 8


def padded_under_a_cap(config: SchedulerConfig) -> SchedulerConfig:
    """Spec-decode padding on and a long-prefill cap of 1 to K tokens: the cap is below a
    padded admission's 1 + K (docs/FINDINGS.md F3, where vLLM pads and then fails its
    own assertion), and cuts every longer prompt into chunks, so one-token admissions
    meet running prefills (which must not be padded beside). With chunked prefill on,
    the budget is the smallest padding allows (1 + K, or the seats): a padded admission
    beside a decode no longer fits it, and must wait. configs() turns padding back off
    for an engine that fixed it off: the cap stays.

    max_model_len is at most SHORT_MAX_MODEL_LEN: prompts are drawn as long as the
    context allows, and a one-token prompt (the admission that is padded) is then
    one in fifteen of the lengths drawn at random, not one in ninety-five, and
    requests finish and make room for the next. Measured on padding-cut-by-cap,
    every config narrowed so, 5 examples, seeds 1-40: caught on 38 (any
    max_model_len: 33)."""
    num_spec = max(config.num_speculative_tokens, 1)
    max_model_len = min(config.max_model_len, SHORT_MAX_MODEL_LEN)
    cap = config.long_prefill_token_threshold
    if not 0 < cap <= num_spec:
        cap = num_spec
    smallest = _smallest_padded_budget(config)
    budget = smallest if config.enable_chunked_prefill else config.max_num_batched_tokens
    return _with_padding(
        config,
        cap=min(cap, max_model_len),
        budget=max(budget, smallest),
        chunked=config.enable_chunked_prefill,
        max_model_len=max_model_len,
    )


def padded_tight_budget(config: SchedulerConfig) -> SchedulerConfig:
    """Spec-decode padding on, chunked prefill on with the smallest budget padding
    allows (1 + K, or the seats) and no long-prefill cap: a decode of fewer than 1 + K
    tokens leaves the budget too small for a one-token admission's padding, which must
    then wait (vLLM holds it rather than run it unpadded). Without a cap prompts finish
    their prefill in a step or two, so running requests are mostly decodes, beside which
    admissions are padded. Measured on padding-over-budget-runs-unpadded, every config
    narrowed so, 20 examples, seeds 1-10: caught on 9 (padded_under_a_cap, whose cap
    keeps prefills running: 3)."""
    return _with_padding(config, cap=0, budget=_smallest_padded_budget(config), chunked=True)


def padded_near_max_model_len(config: SchedulerConfig) -> SchedulerConfig:
    """Spec-decode padding on with one draft, prefix caching on with blocks of one token,
    a context of at most SHORTEST_MAX_MODEL_LEN and a cache of three such requests, under
    fcfs: a prompt that repeats one still cached (the workloads share prefixes, and
    their longest prompts are alike), or a preempted request resuming, is a one-token
    admission, which padding turns into 1 + K, and in so short a context it is near the
    end of it. With K = 1 the longest prompt (max_model_len - 1, an edge length every
    tenth draw) is the exact boundary: its padded step and sampled token end one past
    max_model_len, so it must run unpadded (vllm#53962 padded it onto max_model_len;
    the corner padding-near-max-model-len). Chunked prefill on with a budget of at
    least 1 + K. Measured on padding-onto-max-model-len, seeds 1-10 of the CI profile:
    caught on 10 (weight 2: 9; a cache of one request and a context of up to 16: 8)."""
    max_model_len = min(config.max_model_len, SHORTEST_MAX_MODEL_LEN)
    padded = _with_padding(
        config,
        cap=0,
        budget=max(config.max_num_batched_tokens, _smallest_padded_budget(config)),
        chunked=True,
        max_model_len=max_model_len,
    )
    return dataclasses.replace(
        padded,
        num_speculative_tokens=1,
        policy="fcfs",
        block_size=1,
        enable_prefix_caching=True,
        num_blocks=3 * max_model_len,
        watermark=0.0,
    )


def cache_aware_reorder(config: SchedulerConfig) -> SchedulerConfig:
    """vLLM 0.34.0's cache-aware admission in effect: fcfs, prefix caching, a window of
    at least four and a threshold of 0 (it engages from an empty cache), and at most two
    seats, so requests wait long enough for one whose prefix another cached to arrive
    behind one whose prefix is cold, and move ahead of it. Blocks of at most four
    tokens: the workloads' shared prefixes are a few tokens long, and a hit is whole
    blocks."""
    block_size = min(config.block_size, 4)
    return dataclasses.replace(
        config,
        policy="fcfs",
        enable_prefix_caching=True,
        block_size=block_size,
        num_blocks=max(config.num_blocks, -(-config.max_model_len // block_size)),
        max_num_seqs=min(config.max_num_seqs, 2),
        cache_aware_admission_window=max(config.cache_aware_admission_window, 4),
        cache_aware_admission_threshold=0.0,
    )


def kv_connector(config: SchedulerConfig) -> SchedulerConfig:
    """A KV connector (docs/SPEC.md, "The KV connector"): requests load KV from elsewhere,
    async or sync, some loads fail, some finished requests keep their blocks while they
    send them. The failure policy follows the pool's parity (both policies, and no draw
    of its own). Prefix caching on: loads, hits and promotions meet in the cache."""
    return dataclasses.replace(
        config,
        kv_connector=True,
        async_scheduling=False,  # SchedulerConfig refuses it with a connector
        enable_prefix_caching=True,
        kv_load_failure_policy="recompute" if config.num_blocks % 2 else "fail",
        num_blocks=max(config.num_blocks, _connector_pool(config)),
    )


def _connector_pool(config: SchedulerConfig) -> int:
    """The smallest pool SchedulerConfig allows this config once it has a connector."""
    return smallest_pool(config, kv_connector=True)


def kv_loads_capped(config: SchedulerConfig) -> SchedulerConfig:
    """A KV connector under vLLM 0.34.0's max_num_inflight_kv_loads (one or two), a pool
    of one max_model_len request and at most two seats: async loads start while the
    batch is full, wait for the cap, and reserve the blocks still to come against each
    other (the #45388 deadlock's corner)."""
    return dataclasses.replace(
        kv_connector(config),
        max_num_inflight_kv_loads=1 + config.max_num_seqs % 2,
        max_num_seqs=min(config.max_num_seqs, 2),
        num_blocks=max(_tight_cache(config), _connector_pool(config)),
    )


def kv_loads_contend(config: SchedulerConfig) -> SchedulerConfig:
    """A KV connector with no cap on loads in flight, a pool of one max_model_len
    request (or `smallest_pool`'s, with drafts) and two seats or more: two async loads
    park at once and each holds blocks the other's remainder needs, unless admission
    reserves what every parked load still has to come (the #45388 deadlock, which a cap
    of one keeps from happening)."""
    seats = max(config.max_num_seqs, 2)
    return dataclasses.replace(
        kv_connector(config),
        max_num_seqs=seats,
        max_num_batched_tokens=max(config.max_num_batched_tokens, seats),
        num_blocks=max(_tight_cache(config), _connector_pool(config)),
    )


@dataclass(frozen=True)
class Regime:
    name: str
    corner: str  # the named corner (corners.py) it is for
    narrow: Callable[[SchedulerConfig], SchedulerConfig]
    weight: int
    # SGLang's family: the opening (strategies/openings.py, OPENING_NAMES) whose workload
    # the corner needs beside these knobs; its configs draw it at least half the time.
    opening: str | None = None


REGIMES: tuple[Regime, ...] = (
    Regime("priority-contention", "priority-victim-ahead", priority_contention, 4),
    Regime("priority-tight-cache", "priority-victim-ahead", priority_tight_cache, 4),
    Regime("tight-cache", "preemption", tight_cache, 2),
    Regime("head-of-line", "budget-exact-fit", head_of_line, 2),
    Regime("padded-under-a-cap", "padded-admission", padded_under_a_cap, 2),
    Regime("padded-tight-budget", "padded-admission", padded_tight_budget, 2),
    Regime("cache-aware-reorder", "cache-aware-reorder", cache_aware_reorder, 2),
    Regime("padded-near-max-model-len", "padding-near-max-model-len", padded_near_max_model_len, 3),
)
# The KV connector's regimes, drawn beside REGIMES where a strategy asks for a connector
# (configs(kv_connector=True): the suite's own configs). Kept apart so that every
# strategy built on configs() without one draws exactly what it drew before. Their
# weights match PLAIN_WEIGHT and REGIMES' together: whoever asks for a connector holds
# an engine that has one, so half the configs carry it. Measured with
# benchmarks/bench_mutants.py on the kv-* mutants under connector_configs, seeds 1-10:
# with a connector in 4 of 28 configs (weights of 2, no kv-loads-contend) 77 of 100
# runs killed, kv-load-reserves-nothing (#45388) on 2 seeds; in half the configs with
# weights 8, 8, 8, 98 of 100, #45388 on 8 seeds; with 4, 8, 12 (the uncapped tight
# pool, where two loads deadlock, drawn most), #45388 on 9.
CONNECTOR_REGIMES: tuple[Regime, ...] = (
    Regime("kv-connector", "load-in-progress", kv_connector, 4),
    Regime("kv-loads-capped", "load-in-progress", kv_loads_capped, 8),
    Regime("kv-loads-contend", "load-in-progress", kv_loads_contend, 12),
)


def sglang_small_chunks(config: SchedulerConfig) -> SchedulerConfig:
    """SGLang's family: chunked prefill with the smallest chunk allowed (max_running
    requests, or a page) and the radix cache on, so that a request stays the chunked
    request for many steps, its chunks cached between them. A cancel then often meets
    it mid-prefill: SG-CHUNKED-ABORT's corner, where an abort that cached the chunk
    still computing, or let the chunking go on, shows. Mixed chunks as drawn."""
    return dataclasses.replace(
        config,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        max_num_batched_tokens=max(config.max_num_seqs, config.block_size),
    )


def sglang_tight_radix(config: SchedulerConfig) -> SchedulerConfig:
    """SGLang's family: the radix cache on, the lowest conservativeness drawn (admission
    reserves a tenth of what running requests may still need, so it overcommits), a pool
    of one max_model_len request, and mixed chunks (chunked prefill on). Decodes retract
    while the tree holds cached prefixes, the victims' among them (SG-RETRACT-EVICT says
    how far to evict), and a mixed step leaves its admissions, with no outputs, ahead of
    the decodes (SG-RUNNING-ORDER), so a retraction after it must re-rank the survivors
    (SG-RETRACT): measured with benchmarks/bench_mutants.py on rv-retract-survivors-
    batch-order, the regime without mixed chunks caught it on 8 of seeds 1-10 and on
    neither CI seed. At least three seats: a retraction that leaves two survivors or
    more is one whose survivors' order shows (with the seats as drawn, at weight 2
    against 3 plain draws, the same mutant was caught on 6 of seeds 1-10; with three
    seats or more, 7)."""
    seats = max(config.max_num_seqs, 3)
    return dataclasses.replace(
        config,
        enable_prefix_caching=True,
        schedule_conservativeness=0.1,
        num_blocks=_tight_cache(config),
        enable_chunked_prefill=True,
        enable_mixed_chunk=True,
        max_num_seqs=seats,
        # Chunked prefill needs a chunk budget of a seat each.
        max_num_batched_tokens=max(config.max_num_batched_tokens, seats),
    )


# sglang_mixed_overcommit's shortest context: long prompts take many chunks.
LONG_MAX_MODEL_LEN = 64


def sglang_mixed_overcommit(config: SchedulerConfig) -> SchedulerConfig:
    """SGLang's family: mixed chunks with two seats and a chunk budget of four tokens,
    pages of one token, a context of at least LONG_MAX_MODEL_LEN, a pool of one
    max_model_len request and the lowest conservativeness drawn. A long prompt admitted
    beside a decode is chunked over a dozen steps or more; each mixed step the decode
    takes a slot its reservation (a tenth of its remaining budget) did not count, so the
    room the reservations leave shrinks below the chunk budget and the rest of the
    prompt, and sizes the next chunk (the corner sg-chunk-room-cut, SG-CHUNK-ROOM's
    judged case: a chunk that ignores the reservations shows). The room shrinks by about
    one slot a step: a budget of four leaves, after the decode's token, a window of
    three it cannot skip. The same overcommit retracts the decode often (three times an
    example, twice the tight-radix regime's rate, measured on the reference), under the
    overlap loop as drawn with its result in flight (preempted-with-output-in-flight:
    in 25 examples on each of seeds 1-10, where the whole mix missed it on seed 5).

    Measured with benchmarks/bench_mutants.py on rv-chunk-room-ignores-reservations,
    every config narrowed so, 25 examples, seeds 1-10: caught on 9 (a budget of twice
    the seats up to 3 seats, pages as drawn: 7; the seats, chunk and context as drawn:
    2). The corner stays rare (one or two examples in 25, whatever the budget, context
    or seats: the long prompt's own max_new_tokens and the pool left at its admission
    must both be small), hence the regime's weight below."""
    seats = 2
    return dataclasses.replace(
        config,
        block_size=1,
        max_model_len=max(config.max_model_len, LONG_MAX_MODEL_LEN),
        num_blocks=max(config.max_model_len, LONG_MAX_MODEL_LEN),
        max_num_seqs=seats,
        enable_chunked_prefill=True,
        enable_mixed_chunk=True,
        max_num_batched_tokens=seats + 2,
        schedule_conservativeness=0.1,
    )


# sglang_crowded's seats: twice the most the default configs draw.
CROWDED_SEATS = 2 * MOST_SEATS
# sglang_crowded's pool, in max_model_len requests.
CROWDED_POOL = 5


def sglang_crowded(config: SchedulerConfig) -> SchedulerConfig:
    """SGLang's family: many short requests decoding at once, under the plain loop. The
    shortest context SGLang's family admits (MIN_SGLANG_MAX_MODEL_LEN: prompts of a few
    tokens, futures of at most that many), pages of one token, CROWDED_SEATS seats, a
    pool of CROWDED_POOL max_model_len requests and the lowest conservativeness drawn:
    a burst of arrivals (state_machine.SGLANG_PACE) is admitted over a few passes, each
    counting the running requests' futures at a tenth, until a dozen decode in a pool
    that holds their prompts and a few tokens each. When it runs out, the first victim
    (fewest outputs: admitted last) frees a prompt of a few tokens and an output or two,
    less than the other decodes need, and a second victim follows (the corner
    two-victims: the victims' order back in the waiting queue, SG-RETRACT).

    Measured on the reference, every config narrowed so, 30 examples, seeds 2-5, two or
    more victims in 27 steps (a pool of 3 requests: 7; of 4: 24; 8 seats: 9; the overlap
    loop: 3 at a pool of 3, against 9 without it)."""
    max_model_len = MIN_SGLANG_MAX_MODEL_LEN
    chunked = config.enable_chunked_prefill
    budget = (
        max(min(config.max_num_batched_tokens, 2 * max_model_len), CROWDED_SEATS)
        if chunked
        else max(max_model_len, CROWDED_SEATS)
    )
    return dataclasses.replace(
        config,
        block_size=1,
        max_model_len=max_model_len,
        num_blocks=CROWDED_POOL * max_model_len,
        max_num_seqs=CROWDED_SEATS,
        max_num_batched_tokens=budget,
        enable_prefix_caching=True,
        schedule_conservativeness=0.1,
        async_scheduling=False,
    )


# sglang_readmit's seats, shortest context and pool (in max_model_len requests).
READMIT_SEATS = MOST_SEATS
READMIT_MAX_MODEL_LEN = 24
READMIT_POOL = 2


def sglang_readmit(config: SchedulerConfig) -> SchedulerConfig:
    """SGLang's family: a cohort of long decodes retracted with many outputs, then
    re-admitted together. Pages of one token, MOST_SEATS seats (at least), a context of
    at least READMIT_MAX_MODEL_LEN, a pool of READMIT_POOL max_model_len requests, the
    lowest conservativeness drawn, chunked prefill with a budget of two contexts (so a
    re-admitted request, its outputs included, is never chunked), no mixed chunks and
    the plain loop. A burst is admitted over a pass or two and decodes in step, so the
    victims of the retraction that follows carry as many outputs as the survivors; when
    a survivor leaves they come back in one pass, and each re-admission reserves its
    whole max_new_tokens, outputs included, for the admissions after it, while its own
    fit test counts only what it has left (the corner sg-readmit-whole-budget: the next
    request refused for that difference; SG-ADMISSION judges a pass that reserved less).

    Measured on the reference and on rv-reserve-remaining-only, every config narrowed
    so, 25 examples: the mutant caught on 4 of seeds 1-7; the corner reached in 1 example
    of 25 on each of seeds 1-3 and none on 4, and no more often with a context of 48, a
    pool of 1.5 contexts, 4 seats, or 16 seats and a pool of 3 (the window is a re-admitted
    request's outputs wide: the next request's future must fall inside it)."""
    max_model_len = max(config.max_model_len, READMIT_MAX_MODEL_LEN)
    return dataclasses.replace(
        config,
        block_size=1,
        max_model_len=max_model_len,
        num_blocks=READMIT_POOL * max_model_len,
        max_num_seqs=max(config.max_num_seqs, READMIT_SEATS),
        enable_chunked_prefill=True,
        enable_mixed_chunk=False,
        max_num_batched_tokens=2 * max_model_len,
        schedule_conservativeness=0.1,
        async_scheduling=False,
    )


# sglang_paged_chunks' chunk budget, in pages; its seats (two short prompts and a long
# one); its shortest context, in chunk budgets; and its smallest pool, in contexts.
PAGED_CHUNK_PAGES = 4
PAGED_CHUNK_SEATS = 3
PAGED_CHUNK_CONTEXT = 3
PAGED_CHUNK_POOL = 2


def sglang_paged_chunks(config: SchedulerConfig) -> SchedulerConfig:
    """SGLang's family: pages of two tokens or more (four where four were drawn) and
    chunked prefill with a budget of PAGED_CHUNK_PAGES pages (or a token a seat, where
    that is more), at least PAGED_CHUNK_SEATS seats, a context of at least
    PAGED_CHUNK_CONTEXT budgets and a pool of at least PAGED_CHUNK_POOL contexts. The
    other regimes all narrow to pages of one token, where a page is a token and nothing an
    admission takes ends inside one; here each admission pays its extend ceiled to pages
    out of the chunk budget, so one-token prompts admitted ahead of a long one leave it a
    chunk pages shorter than their tokens would (the corner sg-chunk-after-unaligned;
    SG-ADMISSION judges the chunk; the opening ones-then-long builds the burst). The seats,
    context and pool are what that burst needs in one pass: a seat for each of two short
    prompts and the long one, a longest prompt past the budget, and a pool that holds the
    long prompt, its future and the short ones' pages at once (openings.ones_before_long).

    Before seats, context and pool were narrowed, 1,238 of 2,000 configs drawn from this
    regime could not show the corner (a single seat in 772, a budget the longest prompt
    fits in 629, a pool too small for the burst in 285; some had several), and
    benchmarks/bench_corners.py missed the corner on seeds 1 and 10."""
    page = max(config.block_size, 2)
    seats = max(config.max_num_seqs, PAGED_CHUNK_SEATS)
    budget = max(seats, PAGED_CHUNK_PAGES * page)
    max_model_len = max(config.max_model_len, PAGED_CHUNK_CONTEXT * budget)
    context_pages = -(-max_model_len // page)
    return dataclasses.replace(
        config,
        block_size=page,
        max_model_len=max_model_len,
        num_blocks=max(config.num_blocks, PAGED_CHUNK_POOL * context_pages),
        max_num_seqs=seats,
        enable_chunked_prefill=True,
        max_num_batched_tokens=budget,
    )


# SGLang's family (strategies.sglang_configs): the same mechanism, its own corners.
SGLANG_REGIMES: tuple[Regime, ...] = (
    Regime("sglang-small-chunks", "abort-mid-prefill", sglang_small_chunks, 1),
    Regime("sglang-tight-radix", "preemption", sglang_tight_radix, 1),
    Regime("sglang-mixed-overcommit", "sg-chunk-room-cut", sglang_mixed_overcommit, 4),
    Regime("sglang-crowded", "two-victims", sglang_crowded, 5),
    Regime("sglang-readmit", "sg-readmit-whole-budget", sglang_readmit, 3, "cohort-then-small"),
    Regime(
        "sglang-paged-chunks",
        "sg-chunk-after-unaligned",
        sglang_paged_chunks,
        1,
        "ones-then-long",
    ),
)
# Draws left as drawn, against the SGLang regimes' weights: 3 of 18 configs. Measured
# with benchmarks/bench_mutants.py, seeds 1-10 (kills of rv-reserve-remaining-only,
# rv-chunk-budget-unpaged, rv-chunk-room-ignores-reservations and
# rv-retract-survivors-batch-order): without mixed-overcommit, 3 plain draws to one of
# each other regime, 3, 9, 1 and 8; mixed-overcommit added at weight 1, 1, 9, 4 and 7;
# it and tight-radix at weight 2, 3, 10, 6 and 6; with tight-radix's three seats, 3,
# 10, 6 and 7. The plain draws keep their weight of 3: cut to 2 of 5 (mixed-overcommit
# at weight 1), two other mutants lost a seed each. sglang-crowded (issue 36) measured
# with benchmarks/bench_corners.py, seeds 1-10, under SGLANG_PACE: at weight 3 beside
# the others' 1, 2, 2, two-victims reached on 9 seeds and sg-chunk-room-cut on 8; at 4
# (mixed-overcommit at 2), 9 and 6; at 4 (mixed-overcommit at 3), 9 and 7; at 5, with
# tight-radix cut to 1 (crowded retracts more than it: 2-10 steps of two victims a run)
# and mixed-overcommit at 3, 10 and 6. sglang-readmit added at 3, mixed-overcommit at 4
# (its share kept), with SG-LATCH's clauses for a latch an extend closed and a budget
# stop: the whole SGLang catalogue killed in 465 of 480 runs on seeds 1-10 (458
# before), 45 of 48 mutants on every seed (40); rv-reserve-remaining-only on 2 (2),
# rv-chunk-room-ignores-reservations on 4 (6), and the corners sg-chunk-room-cut and
# sg-readmit-whole-budget reached on 4 and 6 seeds (issue 36). Those corners are workload
# shapes, not knobs: the openings of strategies/openings.py, drawn for the config, reach
# both on every seed and kill all three survivors on seeds 1-10 (weights unchanged).
SGLANG_PLAIN_WEIGHT = 3

# Hybrid KV cache groups (strategies/hybrid_regimes.py), drawn beside REGIMES where a
# strategy asks for them (configs(hybrid=True): engines with Capability.HYBRID_KV). Kept
# apart, as the connector's are, so that every strategy built on configs() without them
# draws exactly what it drew before; their weights (24 together) match PLAIN_WEIGHT and
# REGIMES', so half the configs are hybrid.
HYBRID_REGIMES: tuple[Regime, ...] = (
    Regime("hybrid-sliding-window", "window-frees-a-block", hybrid_regimes.sliding_window, 3),
    Regime("hybrid-short-window", "window-frees-a-block", hybrid_regimes.short_window, 2),
    Regime("hybrid-mamba-align", "mamba-aligned-split", hybrid_regimes.mamba_align, 3),
    Regime("hybrid-mamba-eagle", "mamba-eagle-checkpoint-backoff", hybrid_regimes.mamba_eagle, 2),
    Regime("hybrid-mamba-wide-block", "mamba-aligned-split", hybrid_regimes.mamba_wide_block, 3),
    Regime(
        "hybrid-window-and-mamba", "hit-cut-by-lagging-group", hybrid_regimes.window_and_mamba, 6
    ),
    Regime("hybrid-chunked-local", "window-frees-a-block", hybrid_regimes.chunked_local, 2),
    Regime(
        "hybrid-mamba-running-state", "hybrid-preemption", hybrid_regimes.mamba_running_state, 3
    ),
)

# Draws left as drawn, against the regimes' weights: 3 of 24 configs. The regimes keep
# every knob they do not move as drawn, so they reach the other corners too
# (benchmarks/bench_corners.py). At 100 examples a run the weights trade one corner's
# examples for another's: measured with benchmarks/bench_mutants.py, moving weight from
# tight-cache and the plain draws to priority-contention saved victim-index-not-adjusted
# on one seed and lost running-prefill-reserves-whole-prompt on two.
PLAIN_WEIGHT = 3
