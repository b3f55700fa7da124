"""The seeded bugs: small, realistic mistakes an engine engineer could make in the reference.

Each entry is a source-level mutation of one file of schedspec/reference/ (see
mutation.py), with the invariants expected to catch it. Keep the snippets
short but unique; test_mutants checks that every one still matches the code.
A mutant whose corner the CI profile reaches rarely may also have a shrunk
counterexample in traces/<id>.json, replayed by test_mutants.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from schedspec.properties.strategies.configs import configs
from schedspec.properties.strategies.engine_configs import connector_configs
from schedspec.properties.strategies.regimes import (
    cache_aware_reorder,
    kv_connector,
)
from schedspec.spec import SchedulerConfig
from schedspec.spec.config import smallest_pool
from tests.mutants.async_catalogue_review import ASYNC_REVIEW_MUTANTS
from tests.mutants.hybrid_catalogue import HYBRID_MUTANTS
from tests.mutants.mutation import CRASH, Mutant, mutant

# ------------------------------------------------------------------ targeted configs
# The default config strategy reaches some corners only now and then in the CI
# profile (preemption, drafts, priority victims). A mutant that lives in such a
# corner gets a targeted strategy: still the suite's configs(), narrowed to the
# corner, never a hand-made scenario.


def _tight_kv(config: SchedulerConfig) -> SchedulerConfig:
    """Exactly one max_model_len request of KV blocks: decodes preempt constantly."""
    return dataclasses.replace(config, num_blocks=-(-config.max_model_len // config.block_size))


def tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(_tight_kv)


def synchronous() -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs in sync mode: no step is in flight between engine steps, so
    only an abort that arrives while a step runs (events.Step.aborts) meets one."""
    return configs(async_scheduling=False)


def synchronous_tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    """Sync, with exactly one max_model_len request of KV: a request (a long prompt, or
    a preempted one with its outputs) often needs every block of the pool, and no step
    is in flight to excuse passing over the waiting head (PROGRESS allows none)."""
    return synchronous().map(_tight_kv)


def fcfs_tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    return configs().filter(lambda c: c.policy == "fcfs").map(_tight_kv)


def _contended(config: SchedulerConfig) -> SchedulerConfig:
    # Small chunks keep requests alive long enough for more urgent ones to
    # arrive behind them in the running list.
    budget = max(config.max_num_seqs, config.max_model_len // 4)
    if config.pad_spec_decode:
        budget = max(budget, 1 + config.num_speculative_tokens)
    return dataclasses.replace(
        _tight_kv(config), enable_chunked_prefill=True, max_num_batched_tokens=budget
    )


def priority_contention() -> st.SearchStrategy[SchedulerConfig]:
    """Priority policy, several seats, tight KV, small chunks: priority victims."""
    return configs().filter(lambda c: c.policy == "priority" and c.max_num_seqs > 1).map(_contended)


def priority_contention_three_seats() -> st.SearchStrategy[SchedulerConfig]:
    """priority_contention with at least three seats: a victim can sit between the
    request being served and a running request after it (the one #49097 skipped).
    Measured: the mutant below caught in 6 of 6 runs of 900 examples (seeds 20240607-09,
    20240612, 1, 2), against 3 of 6 at 300 with two seats allowed."""
    return configs().filter(lambda c: c.policy == "priority" and c.max_num_seqs > 2).map(_contended)


def _cached_one_token_blocks(config: SchedulerConfig) -> SchedulerConfig:
    return dataclasses.replace(
        config,
        block_size=1,
        num_blocks=config.max_model_len,
        enable_prefix_caching=True,
        watermark=0.0,
        num_speculative_tokens=max(config.num_speculative_tokens, 2),
        num_lookahead_tokens=None,
    )


def cached_priority_victims() -> st.SearchStrategy[SchedulerConfig]:
    """priority_contention with prefix caching on, one-token blocks, drafts and their
    lookahead slots, and no watermark. One-token blocks: every token a running request
    is scheduled completes a block, registered in the prefix cache at once, so a
    priority victim unscheduled later in the same step always holds registrations for
    KV it will never compute (with larger blocks its few tokens rarely complete one).
    Lookahead slots and no watermark: more KV pressure while a more urgent request runs
    behind a less urgent one. Measured: the mutant below is caught in 15 of 16 single
    CI-profile runs (seeds 20240607, 20240608, 1-14), against 2 of 5 with blocks of 1-2
    tokens and none with priority_contention."""
    return (
        configs()
        .filter(lambda c: c.policy == "priority" and c.max_num_seqs > 1)
        .map(lambda c: _contended(_cached_one_token_blocks(c)))
    )


# Spec decode: long max_model_len keeps requests decoding (not finished at the
# length cap) when the drafter proposes, so drafts actually get verified.
LONG_MODEL_LEN = 48


def spec_decode() -> st.SearchStrategy[SchedulerConfig]:
    """Drafts on, long requests, and a budget that never cuts a decode short."""
    return (
        configs()
        .filter(lambda c: c.num_speculative_tokens > 0 and c.max_model_len >= LONG_MODEL_LEN)
        .map(
            lambda c: dataclasses.replace(
                c,
                long_prefill_token_threshold=0,
                max_num_batched_tokens=max(c.max_num_batched_tokens, 4 * c.max_model_len),
            )
        )
    )


def spec_decode_capped() -> st.SearchStrategy[SchedulerConfig]:
    """Drafts on, long requests, a long-prefill cap of one token: steps cut short of drafts."""
    return (
        configs()
        .filter(lambda c: c.num_speculative_tokens > 0 and c.max_model_len >= LONG_MODEL_LEN)
        .map(lambda c: dataclasses.replace(c, long_prefill_token_threshold=1))
    )


def prefix_caching() -> st.SearchStrategy[SchedulerConfig]:
    return configs().filter(lambda c: c.enable_prefix_caching)


def with_watermark() -> st.SearchStrategy[SchedulerConfig]:
    return configs().filter(lambda c: c.watermark_blocks > 0)


def chunking_off_tight_budget() -> st.SearchStrategy[SchedulerConfig]:
    """Chunked prefill off, several seats, prompts of many lengths, and the smallest
    budget allowed (max_model_len): a long prompt often waits for budget."""
    return (
        configs()
        .filter(lambda c: not c.enable_chunked_prefill and c.max_num_seqs > 1)
        .filter(lambda c: c.max_model_len >= 32)
        .map(
            lambda c: dataclasses.replace(
                c, max_num_batched_tokens=max(c.max_model_len, c.max_num_seqs)
            )
        )
    )


# Async scheduling (vLLM's default): every config async, the corners narrowed as above.


def _async(config: SchedulerConfig) -> SchedulerConfig:
    return dataclasses.replace(config, async_scheduling=True)


def async_configs() -> st.SearchStrategy[SchedulerConfig]:
    return configs(async_scheduling=True)


def async_tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    """Async with exactly one max_model_len request of KV: preemptions with output in
    flight."""
    return configs(async_scheduling=True).map(_tight_kv)


def async_spec_decode() -> st.SearchStrategy[SchedulerConfig]:
    """Async with drafts (placeholders) on long requests."""
    return spec_decode().map(_async)


def async_spec_tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    """Async, drafts and tight KV: stale output of a preempted request with drafts
    (vLLM #41190)."""
    return spec_decode().map(lambda c: _tight_kv(_async(c)))


def async_cached_spec_decode() -> st.SearchStrategy[SchedulerConfig]:
    """Async, drafts, prefix caching and small blocks: blocks fill and are registered
    as outputs land."""
    return spec_decode().map(lambda c: _small_cached_blocks(_async(c)))


def _small_cached_blocks(config: SchedulerConfig) -> SchedulerConfig:
    block_size = min(config.block_size, 2)
    return dataclasses.replace(
        config,
        enable_prefix_caching=True,
        block_size=block_size,
        num_blocks=max(config.num_blocks, -(-config.max_model_len // block_size)),
    )


def padded() -> st.SearchStrategy[SchedulerConfig]:
    """Spec-decode padding on (either mode) with several seats: one-token admissions
    beside running requests."""
    return configs(pad_spec_decode=True).filter(
        lambda c: c.num_speculative_tokens > 0 and c.max_num_seqs > 1
    )


def padded_tight_budget() -> st.SearchStrategy[SchedulerConfig]:
    """Padding with a budget of exactly 1 + K (chunked prefill on): a decode beside a
    one-token admission leaves too little budget for its padding."""
    return padded().map(
        lambda c: dataclasses.replace(
            c,
            enable_chunked_prefill=True,
            max_num_batched_tokens=max(c.max_num_seqs, 1 + c.num_speculative_tokens),
        )
    )


def padded_under_a_small_cap() -> st.SearchStrategy[SchedulerConfig]:
    """Padding with a long-prefill cap below 1 + K: the corner of vLLM's F3."""
    return padded().map(
        lambda c: dataclasses.replace(c, long_prefill_token_threshold=c.num_speculative_tokens)
    )


def chunked_tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    """Tight KV, chunked prefill on, small chunks: a prompt is admitted on a chunk
    whose blocks fit long before its whole prompt does."""
    return configs().map(_contended)


def cached_small_blocks() -> st.SearchStrategy[SchedulerConfig]:
    """Prefix caching on with blocks of 1-2 tokens: every step completes blocks."""
    return configs().map(_small_cached_blocks)


def cached_spec_decode() -> st.SearchStrategy[SchedulerConfig]:
    """Synchronous drafts on long requests, prefix caching, small blocks: accepted
    drafts fill blocks that only update_from_output can register."""
    return spec_decode().map(_small_cached_blocks)


def cache_aware() -> st.SearchStrategy[SchedulerConfig]:
    """vLLM 0.34.0's cache-aware admission in effect on every config (the suite's
    cache-aware-reorder regime: fcfs, prefix caching, a window of at least four, a
    threshold of 0, at most two seats)."""
    return configs().map(cache_aware_reorder)


def cache_aware_half_full() -> st.SearchStrategy[SchedulerConfig]:
    """cache_aware with vLLM's default threshold (0.5): the reorder runs only while at
    least half the blocks are held, so both sides of the threshold come up."""
    return cache_aware().map(lambda c: dataclasses.replace(c, cache_aware_admission_threshold=0.5))


def cache_aware_tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    """cache_aware with the tightest cache: preempted requests wait at the head of the
    queue, inside the window, beside plain waiting ones."""
    return cache_aware().map(_tight_kv)


def long_prefill_chunking_off() -> st.SearchStrategy[SchedulerConfig]:
    """Chunked prefill off with a long-prefill threshold under vLLM 0.34.0's rule (which
    ignores it there) and several seats: a prompt longer than the threshold is admitted
    whole, never capped."""
    return configs(long_prefill_needs_chunked_prefill=True).map(
        lambda c: dataclasses.replace(
            c,
            enable_chunked_prefill=False,
            max_num_seqs=max(c.max_num_seqs, 2),
            max_num_batched_tokens=max(c.max_model_len, c.max_num_seqs, 2),
            long_prefill_token_threshold=max(1, c.max_model_len // 4),
        )
    )


def with_connector() -> st.SearchStrategy[SchedulerConfig]:
    """The suite's configs with a KV connector (the kv-connector regime): loads, sends,
    failures under both policies."""
    return configs(async_scheduling=False).map(kv_connector)


def connector_tight_kv() -> st.SearchStrategy[SchedulerConfig]:
    """A KV connector in the tightest pool the config allows (one max_model_len request,
    or more beside a verify step's blocks: smallest_pool): loads contend for blocks."""

    def tight(config: SchedulerConfig) -> SchedulerConfig:
        return dataclasses.replace(config, num_blocks=smallest_pool(config))

    return with_connector().map(tight)


MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------- issue #19: the other halves
    mutant(
        "drafts-kept-on-prefill-chunk",
        "vllm/scheduler.py",
        "            usable = request.status is RequestStatus.RUNNING and not "
        "request.is_prefill_chunk\n",
        "            usable = request.status is RequestStatus.RUNNING\n",
        "update_draft_token_ids keeps drafts proposed for a request still in its prefill "
        "(vLLM PR #30618).",
        {"DRAFT-KEEP"},
        configs=spec_decode_capped,
    ),
    mutant(
        "drafts-all-dropped",
        "vllm/scheduler.py",
        "            request.spec_token_ids = list(drafts) if usable else []\n",
        "            request.spec_token_ids = []\n",
        "update_draft_token_ids drops every draft: speculative decoding silently never runs.",
        {"DRAFT-KEEP"},
        configs=spec_decode,
    ),
    mutant(
        "decode-fast-path-not-cached",
        "vllm/kv_cache_manager.py",
        "            self.cache_blocks(request, min(total_computed + num_new_tokens, "
        "request.num_tokens))\n            return []\n",
        "            return []\n",
        "allocate_slots' decode fast path (no new block needed) skips cache_blocks, so a "
        "block completed by a decode is never registered.",
        {"CACHE-COMPLETE"},
        configs=cached_small_blocks,
    ),
    mutant(
        "accepted-drafts-not-cached",
        "vllm/scheduler.py",
        "            self.kv_cache_manager.cache_blocks(request, "
        "request.num_confirmed_computed_tokens)\n",
        "            pass\n",
        "update_from_output does not register the blocks that accepted drafts (or landed "
        "async output) filled (vLLM's cache_blocks on output).",
        {"CACHE-COMPLETE-UPDATE"},
        configs=cached_spec_decode,
    ),
    mutant(
        "abort-uncaches-freed-blocks",
        "vllm/scheduler.py",
        "            request.status = status\n"
        "            self._free_request(request, delay_free_blocks=in_flight)\n",
        "            request.status = status\n"
        "            request.num_computed_tokens = 0\n"
        "            self.kv_cache_manager.uncache_uncomputed_blocks(request)\n"
        "            self._free_request(request, delay_free_blocks=in_flight)\n",
        "An abort takes back every registration of the aborted request's blocks (as if "
        "none of its KV were computed) and frees them hashless, to the front of the free "
        "queue: FREE-ORDER-ABORT, which reads the hashes after the abort, accepts it.",
        {"CACHE-ABORT-KEPT"},
        configs=cached_small_blocks,
    ),
    mutant(
        "prefix-hit-one-block-short",
        "vllm/kv_cache_manager.py",
        "self.block_hashes(request), max_hit_blocks)\n",
        "self.block_hashes(request), max(max_hit_blocks - 1, 0))\n",
        "The prefix-cache lookup stops one block short of the longest hit.",
        {"CACHE-HIT-LONGEST"},
        configs=cached_small_blocks,
    ),
    # ------------------------------------------ vLLM bug classes (research notes, section 7)
    mutant(
        "victim-index-not-adjusted",
        "vllm/scheduler.py",
        "        if victim_index < req_index:\n            req_index -= 1\n",
        "",
        "A priority victim ahead of the request being served is removed without moving the "
        "loop index back, so the running request after it is skipped for the step (#49097).",
        {"RUNNING-SERVED"},
        configs=priority_contention_three_seats,
        examples=900,
    ),
    mutant(
        "scheduled-victim-stays-scheduled",
        "vllm/scheduler.py",
        "            step.unschedule(victim)\n",
        "            pass\n",
        "A priority victim already scheduled in this step stays scheduled after its "
        "preemption (#23347).",
        {"PREEMPT-RESET", "BUDGET", "OUTPUT", CRASH},
        configs=priority_contention,
        examples=300,
    ),
    mutant(
        "hit-left-in-free-queue",
        "vllm/block_pool.py",
        "            if block.ref_cnt == 0:\n                self.free_block_queue.remove(block)\n",
        "",
        "A prefix hit on a free cached block takes a reference but leaves the block in the "
        "free queue, so it can be handed out again while held (the double hand-out of "
        "#33775).",
        {"CONSERVATION", "EXCLUSIVE", CRASH},
        configs=prefix_caching,
    ),
    mutant(
        "model-len-cap-skipped",
        "vllm/stop_checker.py",
        "        elif len(all_ids) >= max_model_len or len(output_ids) >= max_tokens:\n",
        "        elif len(output_ids) >= max_tokens:\n",
        "The stop check skips the max_model_len cap, so a request whose max_tokens reaches "
        "past it never finishes there (the skipped length cap of #51299).",
        {"LENGTH", "STOP", "KV-COVER", CRASH},
    ),
    # ------------------------------------------------------- async scheduling
    mutant(
        "async-max-tokens-overrun",
        "vllm/scheduler.py",
        "            if request.num_output_placeholders and sure_to_reach_max_tokens(\n",
        "            if False and sure_to_reach_max_tokens(\n",
        "Async: a request whose in-flight step is sure to reach max_tokens is scheduled once "
        "more (vLLM PR #27922).",
        {"MAX-TOKENS"},
        configs=async_configs,
    ),
    mutant(
        "stale-output-rolls-back",
        "vllm/scheduler.py",
        "        if not stale and num_drafts:\n",
        "        if num_drafts:\n",
        "Async: the rejected drafts of output that predates a preemption roll back the "
        "reset request's counters (vLLM #41190).",
        {"ROLLBACK", "QUEUES", "PIPELINE", CRASH},
        configs=async_spec_tight_kv,
        examples=600,
    ),
    mutant(
        "preempt-keeps-placeholders",
        "vllm/scheduler.py",
        "        request.num_output_placeholders = 0\n",
        "",
        "Async: preemption leaves the output placeholders of the step in flight.",
        {"PREEMPT-RESET", "PIPELINE"},
        configs=async_tight_kv,
    ),
    mutant(
        "preempt-output-not-stale",
        "vllm/scheduler.py",
        "        request.num_stale_output_tokens = request.num_in_flight_tokens\n",
        "",
        "Async: preemption does not mark the output in flight stale, so it lands as if "
        "the reset request had computed it.",
        {"PREEMPT-RESET", "PIPELINE", "ROLLBACK", "UPDATE-PIPELINE", "QUEUES", CRASH},
        configs=async_tight_kv,
    ),
    mutant(
        "placeholders-not-added",
        "vllm/scheduler.py",
        "            self._add_output_placeholders(step)\n",
        "            pass\n",
        "Async: a sampling step adds no output placeholders, so the next step is sized as if "
        "nothing were in flight.",
        {"SCHEDULE-PIPELINE", "DRAFTS", "NO-OVERSHOOT"},
        configs=async_configs,
    ),
    mutant(
        "in-flight-never-lands",
        "vllm/scheduler.py",
        "            request.num_in_flight_tokens -= num_tokens\n",
        "",
        "update_from_output does not take the landed step's tokens off the in-flight count "
        "(so the reported confirmed count is off too).",
        {"UPDATE-PIPELINE", "PIPELINE", "ROLLBACK"},
    ),
    mutant(
        "placeholders-not-resolved",
        "vllm/scheduler.py",
        "            request.num_output_placeholders -= len(tokens)\n",
        "            pass\n",
        "Async: a landed step's returned positions do not resolve its placeholders.",
        {"UPDATE-PIPELINE", "PIPELINE"},
        configs=async_configs,
    ),
    mutant(
        "cache-in-flight-kv",
        "vllm/scheduler.py",
        "            self.kv_cache_manager.cache_blocks(request, "
        "request.num_confirmed_computed_tokens)\n",
        "            self.kv_cache_manager.cache_blocks(\n"
        "                request, min(request.num_computed_tokens, request.num_tokens)\n"
        "            )\n",
        "Async: a landed output registers blocks whose KV the next step, still in flight, "
        "is computing.",
        {"CACHE-CONFIRMED", "CACHE-COMPUTED"},
        configs=async_cached_spec_decode,
        examples=600,
    ),
    mutant(
        "async-drafts-not-placeholders",
        "vllm/scheduler.py",
        "            request.spec_token_ids = list(placeholders)\n",
        "            request.spec_token_ids = []\n",
        "Async: after a sampling step the request gets no placeholder drafts, so speculative "
        "decoding silently never runs.",
        {"DRAFTS"},
        configs=async_spec_decode,
    ),
    mutant(
        "padding-cut-by-cap",
        "vllm/scheduler.py",
        "        if 0 < cap < padded:\n            return 0\n",
        "",
        "Padding ignores the long-prefill cap (the case vLLM asserts on: docs/FINDINGS.md F3).",
        {"GREEDY-BUDGET", "ADMISSION-STOP"},
        configs=padded_under_a_small_cap,
        examples=600,
    ),
    mutant(
        "padding-beside-a-running-prefill",
        "vllm/scheduler.py",
        "        if not config.pad_spec_decode or any(r.is_prefill_chunk for r in "
        "step.scheduled_running):\n",
        "        if not config.pad_spec_decode:\n",
        "An admission is padded although a running request's prefill continues in the step.",
        {"GREEDY-BUDGET", "ADMISSION-STOP"},
        configs=padded,
        examples=600,
    ),
    mutant(
        "output-to-reused-id",
        "vllm/scheduler.py",
        "            {rid: len(r.all_token_ids) for rid, r in live.items()},\n",
        "            {\n"
        "                rid: len(requests[rid].all_token_ids)\n"
        "                for rid in scheduler_output.num_scheduled_tokens\n"
        "                if rid in requests\n"
        "            },\n",
        "Async: an output lands on whichever request holds its id when it lands, so a "
        "request sent again under an aborted id gets the output of its predecessor's step, "
        "which was still in flight when it arrived.",
        {"DELIVERY"},
        ("            request = live[rid]\n", "            request = requests[rid]\n"),
        configs=async_configs,
    ),
    # ------------------------------------------------------------ token budget
    mutant(
        "budget-not-decremented",
        "vllm/step_plan.py",
        "        self.token_budget -= num_tokens\n",
        "",
        "StepPlan.schedule forgets to charge the scheduled tokens to the step's budget.",
        {"BUDGET", "GREEDY-BUDGET"},
    ),
    mutant(
        "priority-victim-no-refund",
        "vllm/step_plan.py",
        "        self.token_budget += self.num_scheduled_tokens.pop(rid)\n",
        "        self.num_scheduled_tokens.pop(rid)\n",
        "StepPlan.unschedule drops a priority victim's entry but does not refund its tokens.",
        {"BUDGET", "GREEDY-BUDGET"},
        configs=priority_contention,
        examples=600,
    ),
    mutant(
        "long-prefill-cap-when-alone",
        "vllm/scheduler.py",
        "        if len(self.running) + self._num_waiting() > 1:\n",
        "        if len(self.running) + self._num_waiting() > 0:\n",
        "The long-prefill cap is applied even when a single request exists.",
        {"GREEDY-BUDGET"},
    ),
    mutant(
        "chunking-off-queue-not-blocked",
        "vllm/scheduler.py",
        "                if not config.enable_chunked_prefill and num_new > step.token_budget:\n"
        "                    break  # head-of-line: nothing behind it is tried this step\n",
        "                if not config.enable_chunked_prefill and num_new > step.token_budget:\n"
        "                    skips.skip(queue, loads)  # try the ones behind it\n"
        "                    continue\n",
        "Chunked prefill off: a prompt too big for the budget left is set aside (vLLM's "
        "skipped-waiting pattern, which async scheduling uses for stale output) and a "
        "smaller one behind it is admitted.",
        {"SCHEDULE-ORDER", "QUEUE-ORDER", "ADMISSION-STOP"},
        configs=chunking_off_tight_budget,
    ),
    # --------------------------------------------------------- KV allocation
    mutant(
        "blocks-needed-floor-div",
        "vllm/kv_cache_manager.py",
        "            max(cdiv(slots, self.block_size) - len(table), 0)",
        "            max(slots // self.block_size - len(table), 0)",
        "allocate_slots sizes the new blocks with floor division: a partly filled last "
        "block is never allocated.",
        {"KV-COVER"},
    ),
    mutant(
        "watermark-ignored",
        "vllm/kv_cache_manager.py",
        "        return watermark_blocks\n",
        "        return 0\n",
        "Admission never charges the watermark, even while other requests run.",
        {"WATERMARK", "ADMISSION-FIT"},
        configs=with_watermark,
    ),
    # ------------------------------------------------------------- preemption
    mutant(
        "preempt-keeps-computed",
        "vllm/scheduler.py",
        "        request.num_computed_tokens = 0\n        request.spec_token_ids = []\n",
        "        request.spec_token_ids = []\n",
        "_preempt drops the KV but does not reset num_computed_tokens.",
        {"PREEMPT-RESET", "QUEUES"},
        configs=tight_kv,
    ),
    mutant(
        "preempt-keeps-blocks",
        "vllm/scheduler.py",
        'keep the tokens, queue it again."""\n        self.kv_cache_manager.free(request)\n',
        'keep the tokens, queue it again."""\n',
        "_preempt resets the request but never frees its blocks.",
        {"PREEMPT-RESET", "QUEUES"},
        configs=tight_kv,
    ),
    mutant(
        "fcfs-victim-oldest",
        "vllm/scheduler.py",
        "            return len(self.running) - 1\n",
        "            return 0\n",
        "fcfs preempts running[0] (the oldest) instead of running[-1].",
        {"VICTIM"},
        configs=fcfs_tight_kv,
    ),
    mutant(
        "victim-to-back-of-queue",
        "vllm/scheduler.py",
        "        self.waiting.prepend(request)\n",
        "        self.waiting.add(request)\n",
        "A preempted request joins the back of the fcfs waiting queue instead of the front.",
        {"QUEUE-ORDER"},
        configs=fcfs_tight_kv,
    ),
    mutant(
        "admit-after-preempt",
        "vllm/scheduler.py",
        "        if not step.preempted:\n            self._schedule_waiting(step, cap)\n",
        "        self._schedule_waiting(step, cap)\n",
        "Waiting requests are admitted in a step that preempted.",
        {"NO-ADMIT-AFTER-PREEMPT"},
        configs=priority_contention,
        examples=300,
    ),
    mutant(
        "priority-victim-stays-cached",
        "vllm/scheduler.py",
        "            self.kv_cache_manager.uncache_uncomputed_blocks(victim)\n",
        "",
        "A priority victim unscheduled in this step keeps the cache registrations made "
        "for KV it will never compute.",
        {"CACHE-CONTENT", "CACHE-COMPUTED"},
        configs=cached_priority_victims,
    ),
    # ----------------------------------------------------------- prefix cache
    mutant(
        "prefix-hit-covers-last-token",
        "sizing.py",
        "    return (num_tokens - 1) // block_size\n",
        "    return num_tokens // block_size\n",
        "get_computed_blocks may hit the block holding the last token (num_tokens, not "
        "num_tokens - 1).",
        {"CACHE-CONTENT", "BUDGET"},
        configs=prefix_caching,
    ),
    mutant(
        "evicted-hash-kept",
        "vllm/block_pool.py",
        "            if block.block_hash is not None:\n                self.uncache_block(block)\n",
        "",
        "get_new_blocks reuses a cached free block without dropping its prefix-cache entry.",
        {"CACHE-COMPUTED", "CACHE-CONTENT", "CACHE-INDEX", "EXCLUSIVE", CRASH},
        configs=prefix_caching,
    ),
    mutant(
        "hit-ref-not-raised",
        "vllm/block_pool.py",
        "                self.free_block_queue.remove(block)\n            block.ref_cnt += 1\n",
        "                self.free_block_queue.remove(block)\n                block.ref_cnt += 1\n",
        "touch() raises the ref count only for free hit blocks, not for ones already held.",
        {"CONSERVATION"},
        configs=prefix_caching,
    ),
    mutant(
        "freed-cached-to-front",
        "vllm/block_pool.py",
        "        self.free_block_queue.append_n(evict_last)\n",
        "        self.free_block_queue.prepend_n(evict_last)\n",
        "Freed blocks with cached content go to the front of the free queue (evicted "
        "first) instead of the back.",
        {"FREE-ORDER", "FREE-ORDER-ABORT"},
        configs=prefix_caching,
    ),
    # ------------------------------------------------------- freeing blocks
    mutant(
        "table-kept-after-free",
        "vllm/kv_cache_manager.py",
        "        blocks = self.req_to_blocks.pop(rid, [])\n",
        "        blocks = self.req_to_blocks.get(rid, [])\n",
        "KVCacheManager.free drops the references but keeps the block table, so the "
        "blocks are freed again later (double free).",
        {"PREEMPT-RESET", "CONSERVATION", "QUEUES", CRASH},
        configs=tight_kv,
    ),
    mutant(
        "free-head-first",
        "vllm/kv_cache_manager.py",
        "        self.block_pool.free_blocks(reversed(blocks))\n",
        "        self.block_pool.free_blocks(blocks)\n",
        "A request's blocks are freed head first, so its chain's head is evicted first.",
        {"FREE-ORDER", "FREE-ORDER-ABORT"},
    ),
    mutant(
        "aborted-output-lands",
        "vllm/scheduler.py",
        "        # Output of a step still in flight lands on no finished request.\n"
        "        for _, scheduled in self._in_flight:\n"
        "            scheduled.pop(request.request_id, None)\n",
        "",
        "A step's output lands on a request aborted while the step ran (vLLM applies its "
        "abort queue just before update_from_output): its tokens are delivered after the "
        "abort, and a stop frees its blocks a second time.",
        {"NO-OUTPUT-AFTER-ABORT", "DELIVERY", "CONSERVATION", "NO-LEAK", CRASH},
        configs=synchronous,
    ),
    mutant(
        "abort-leaks-blocks",
        "vllm/scheduler.py",
        "            request.status = status\n"
        "            self._free_request(request, delay_free_blocks=in_flight)\n",
        "            request.status = status\n"
        "            del self.requests[request.request_id]\n"
        "            self.finished_req_ids.add(request.request_id)\n",
        "finish_requests (abort) forgets the request without freeing its blocks.",
        {"CONSERVATION", "NO-LEAK", "FREE-ORDER-ABORT"},
    ),
    # ---------------------------------------------------- outputs and drafts
    mutant(
        "rejected-drafts-kept",
        "sizing.py",
        "    return num_computed - (num_drafts - (num_sampled - 1))\n",
        "    return num_computed\n",
        "update_from_output does not roll num_computed_tokens back over rejected drafts.",
        {"ROLLBACK", CRASH},
        configs=spec_decode,
        examples=300,
    ),
    mutant(
        "drafts-on-partial-chunk",
        "vllm/scheduler.py",
        "        num_drafts = num_drafts_to_schedule(\n"
        "            num_new,\n"
        "            request.num_computed_tokens,\n"
        "            request.num_tokens + request.num_output_placeholders,\n"
        "        )\n",
        "        num_drafts = len(request.spec_token_ids)\n",
        "All drafts are scheduled even when the budget or the long-prefill cap cut the "
        "step short of the known tokens.",
        {"DRAFTS"},
        configs=spec_decode_capped,
    ),
    mutant(
        "stop-keeps-computed",
        "vllm/stop_checker.py",
        "            request.num_computed_tokens -= len(tokens) - kept\n",
        "            pass\n",
        "A stop in the middle of the sampled tokens drops the tokens past it but does "
        "not pull num_computed_tokens back over them (visible in the engine's report).",
        {"ROLLBACK", CRASH},
        configs=spec_decode,
        examples=300,
    ),
    mutant(
        "finish-not-reported",
        "vllm/scheduler.py",
        "        del self.requests[request.request_id]\n"
        "        self.finished_req_ids.add(request.request_id)\n",
        "        del self.requests[request.request_id]\n",
        "A finished or aborted request is never reported in finished_req_ids.",
        {"FINISH-REPORTED"},
    ),
    mutant(
        "max-num-seqs-off-by-one",
        "vllm/scheduler.py",
        "            loads_only = len(self.running) >= config.max_num_seqs or step.token_budget"
        " <= 0\n",
        "            loads_only = len(self.running) > config.max_num_seqs or step.token_budget"
        " <= 0\n",
        "Admission lets the running list grow to max_num_seqs + 1.",
        {"SEQS"},
    ),
    # Found by `schedspec prove --only DETERMINED`: decisions the vllm-v1 profile left open.
    mutant(
        "admission-chunk-fit-only",
        "vllm/scheduler.py",
        "                full_sequence_must_fit=True,\n",
        "                full_sequence_must_fit=False,\n",
        "Admission checks only that this step's chunk fits, not the whole known sequence, so "
        "a long prompt starts on a first chunk and preempts itself or others on a later one "
        "(the admit-then-preempt thrash of vLLM #18115).",
        {"ADMISSION-FIT"},
        configs=tight_kv,
    ),
    mutant(
        "running-prefill-reserves-whole-prompt",
        "vllm/scheduler.py",
        "num_new, num_lookahead_tokens=lookahead)\n",
        "num_new, num_lookahead_tokens=lookahead, full_sequence_must_fit=True)\n",
        "The running loop checks a running request's whole known sequence, not this step's "
        "slots, and preempts others to make room for prefill chunks it will only run later.",
        {"PREEMPT-NEEDED"},
        configs=fcfs_tight_kv,
    ),
    mutant(
        "lookahead-charged-twice",
        "vllm/kv_cache_manager.py",
        "        slots = num_slots(total_computed, num_new_tokens, num_lookahead_tokens, "
        "max_model_len)\n",
        "        slots = num_slots(\n"
        "            total_computed, num_new_tokens + num_lookahead_tokens, num_lookahead_tokens,\n"
        "            max_model_len,\n"
        "        )\n",
        "allocate_slots counts the drafter's lookahead twice: every table is longer than its "
        "tokens need, and the blocks it holds in excess are missing to admissions.",
        # ADMISSION-STOP sees it too, when an admission it refused would have fit.
        {"ALLOC-EXACT", "ADMISSION-STOP"},
        configs=spec_decode,
    ),
    mutant(
        "padding-onto-max-model-len",
        "sizing.py",
        "num_computed + 1 + num_spec + 1 > max_model_len:\n",
        "num_computed + 1 + num_spec > max_model_len:\n",
        "Padding leaves no room for the token the step samples: a one-token admission near "
        "the end of its context is padded onto max_model_len (vllm#53962; under async "
        "scheduling vLLM then scheduled a negative count and crashed). Found only by the "
        "regime padded-near-max-model-len in the CI profile's default configs.",
        {"NO-OVERSHOOT"},
    ),
    mutant(
        "padding-over-budget-runs-unpadded",
        "vllm/scheduler.py",
        "                if padded < 0:\n                    break\n",
        "                if padded < 0:\n                    padded = 0\n",
        "A one-token admission whose 1 + K padded tokens do not fit the budget left runs "
        "unpadded, where vLLM holds it for a later step.",
        {"GREEDY-BUDGET"},
        configs=padded_tight_budget,
    ),
    # ------------------------------------------------ vLLM 0.34.0's rules (issue #30)
    mutant(
        "long-prefill-cap-without-chunking",
        "vllm/scheduler.py",
        "        if config.long_prefill_needs_chunked_prefill and not "
        "config.enable_chunked_prefill:\n            return 0\n",
        "",
        "The long-prefill cap applies with chunked prefill off under vLLM 0.34.0's rule, "
        "which ignores it there (0.33.0's rule kept by mistake).",
        {"GREEDY-BUDGET"},
        configs=long_prefill_chunking_off,
    ),
    mutant(
        "reorder-moves-preempted",
        "vllm/scheduler.py",
        "            if request.status is RequestStatus.WAITING and not "
        "request.num_computed_tokens\n",
        "            if not request.num_computed_tokens\n",
        "Cache-aware admission moves a preempted request too (it has no computed tokens "
        "either), so a fresh request with a cached prefix jumps the victim that must "
        "resume first.",
        {"CACHE-AWARE-KEEP", "QUEUE-ORDER", "SCHEDULE-ORDER"},
        configs=cache_aware_tight_kv,
    ),
    mutant(
        "reorder-past-the-window",
        "vllm/scheduler.py",
        "        head = waiting.head(self._cache_aware_window)\n",
        "        head = waiting.head(len(waiting))\n",
        "Cache-aware admission ranks the whole queue, not the first window requests.",
        {"CACHE-AWARE-KEEP", "QUEUE-ORDER", "SCHEDULE-ORDER"},
        configs=cache_aware,
    ),
    mutant(
        "reorder-below-threshold",
        "vllm/scheduler.py",
        "        if len(waiting) < 2 or kv.usage < self.config.cache_aware_admission_threshold:\n",
        "        if len(waiting) < 2:\n",
        "Cache-aware admission reorders while KV usage is below the threshold, where there "
        "is room for every prompt and the reorder only costs fairness.",
        {"CACHE-AWARE-KEEP", "QUEUE-ORDER", "SCHEDULE-ORDER"},
        configs=cache_aware_half_full,
    ),
    mutant(
        "reorder-shallowest-first",
        "vllm/scheduler.py",
        "        order = sorted(slots, key=lambda i: (-cached[i], i))\n",
        "        order = sorted(slots, key=lambda i: (cached[i], i))\n",
        "Cache-aware admission puts the shallowest cached prefix first.",
        {"CACHE-AWARE-ORDER", "QUEUE-ORDER", "SCHEDULE-ORDER"},
        configs=cache_aware,
    ),
    mutant(
        "reorder-before-running-loop",
        "vllm/scheduler.py",
        "        cap = self._long_prefill_cap()\n        self._schedule_running(step, cap)\n",
        "        cap = self._long_prefill_cap()\n"
        "        if self._cache_aware_window:\n"
        "            self._reorder_waiting_by_cached_prefix()\n"
        "        self._schedule_running(step, cap)\n",
        "Cache-aware admission runs at the start of the step, before the running requests "
        "take their blocks and whether or not the step preempts: it reads an older usage "
        "and cache, and reorders in steps that admit nothing.",
        {"CACHE-AWARE-KEEP", "CACHE-AWARE-ORDER", "QUEUE-ORDER", "SCHEDULE-ORDER"},
        (
            "        if self._cache_aware_window:\n"
            "            self._reorder_waiting_by_cached_prefix()\n"
            "        skips = _Skips()\n",
            "        skips = _Skips()\n",
        ),
        configs=cache_aware_tight_kv,
    ),
    # ------------------------------------------- liveness under load (issue 31, item 4)
    mutant(
        "head-needing-whole-pool-passed-over",
        "vllm/scheduler.py",
        "            if self._awaits_stale_output(request):\n",
        "            if self._awaits_stale_output(request) or (\n"
        "                not self.running\n"
        "                and -(-request.num_tokens // config.block_size) >= config.num_blocks\n"
        "            ):\n",
        "#39734's shape in a config the spec accepts: with nothing running, a head that "
        "needs every block of the pool is judged never to fit (the pool taken one block "
        "short, as if the null block were in it) and set aside the way a head waiting on "
        "stale output is, so later arrivals run ahead of it and it waits forever.",
        {"PROGRESS"},
        configs=synchronous_tight_kv,
    ),
    # ------------------------------------------- the KV connector (issue 31, items 1-2)
    mutant(
        "kv-load-reserves-nothing",
        "vllm/scheduler.py",
        "                reserved_blocks=loads.reserved_blocks(request) if load_async and loads"
        " else 0,\n",
        "                reserved_blocks=0,\n",
        "vLLM #45388 (fixed by PRs #44560, #48433, #57104): an async load is admitted if "
        "its own blocks fit, reserving nothing for the loads already parked; two "
        "half-admitted loads then hold the pool between them, each promoted and neither "
        "able to run: running 0, waiting N.",
        {"PROGRESS", "DRAIN"},
        configs=connector_tight_kv,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-aborted-load-never-freed",
        "vllm/kv_loads.py",
        """            elif rid in self.held and self.held[rid][1] == "loading":
                self.release(rid)
""",
        """            elif rid in self.held and self.held[rid][1] == "loading":
                pass
""",
        "vLLM #46283: a load aborted in flight keeps its blocks, and when its transfer "
        "reports they are never freed: they leak for as long as the engine runs.",
        {"CONNECTOR-FINISHED", "NO-LEAK"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-abort-frees-a-load-in-flight",
        "vllm/kv_loads.py",
        "        in_flight = rid not in self.received\n",
        "        in_flight = False\n",
        "An abort of a parked load frees its blocks at once, though its transfer is still "
        "in flight and writes into them (the blocks go to the next request).",
        {"CONNECTOR-FINISHED-ABORT"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-abort-in-flight-double-free",
        "vllm/scheduler.py",
        "        if not held:\n            self.kv_cache_manager.free(request)\n",
        "        if not held or delay_free_blocks:\n"
        "            self.kv_cache_manager.free(request)\n",
        "An abort of a load in flight both frees its blocks and holds them for the "
        "transfer; when the load reports, they are freed a second time.",
        {"CONSERVATION", "CONNECTOR-FINISHED-ABORT", "OUTPUT"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-load-cached-at-park",
        "vllm/scheduler.py",
        "                delay_cache_blocks=load_async,\n",
        "                delay_cache_blocks=False,\n",
        "An async load's blocks are registered in the prefix cache when it parks, before "
        "its KV is there: a request that hits them reads garbage.",
        {"LOAD-UNCACHED", "CACHE-COMPUTED"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-promoted-before-its-report",
        "vllm/kv_loads.py",
        "        return request.request_id in self.received\n",
        "        return True\n",
        "A parked load is promoted by the next schedule() whether or not its worker has "
        "reported it: the request runs on KV that is not there.",
        {"LOAD-PROMOTION"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-promoted-with-no-token-to-compute",
        "vllm/kv_loads.py",
        "            request.num_computed_tokens -= 1  # its logits are what the next step"
        " is for\n",
        "            pass\n",
        "A load of the whole prompt is promoted with every token computed, leaving none to "
        "compute: nothing yields the first output's logits.",
        {"LOAD-PROMOTION", "OUTPUT", "CACHE-CONTENT", CRASH},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-bad-block-not-cut",
        "vllm/kv_loads.py",
        "                    request.num_computed_tokens = index * block_size\n",
        "                    pass\n",
        "A load with a bad block keeps every token it loaded as computed: under "
        "'recompute' the request runs on the bad block's garbage.",
        {"LOAD-FAILURE"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-fail-policy-recovers",
        "vllm/kv_loads.py",
        """        if self.config.kv_load_failure_policy == "recompute":
            self.failed |= affected
            return set()
        return affected
""",
        """        self.failed |= affected
        return set()
""",
        "Under 'fail' a failed load recovers as under 'recompute' instead of ending its "
        "request with an error.",
        {"LOAD-FAILURE"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    mutant(
        "kv-abort-skips-request-finished",
        "vllm/scheduler.py",
        "        held = loads is not None and loads.finished(request, delay_free_blocks)\n",
        "        held = (\n"
        "            loads is not None\n"
        "            and request.status is not RequestStatus.FINISHED_ABORTED\n"
        "            and loads.finished(request, delay_free_blocks)\n"
        "        )\n",
        "An aborted request is freed without telling the connector (no request_finished): "
        "a producer never learns to drop what it would send, and a load in flight is not "
        "held.",
        {"CONNECTOR-FINISHED-ABORT", "CONNECTOR-FINISHED"},
        configs=with_connector,
        user_configs=connector_configs,
    ),
    # A reviewer's, written from the reference and docs/SPEC.md alone (issue 36, item 5).
    *ASYNC_REVIEW_MUTANTS,
    # Hybrid KV cache groups (issue 34), the upstream shapes among them.
    *HYBRID_MUTANTS,
)
