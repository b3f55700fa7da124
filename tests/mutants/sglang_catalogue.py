"""Seeded bugs of the reference's SGLang family: the leak, hang, crash and starvation
classes of SGLang's tracker (issue 17, item 5), each a small mistake in
schedspec/reference/sglang/ that the CI profile of `sglang` must catch.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from schedspec.properties.strategies.configs import sglang_configs
from schedspec.spec import SchedulerConfig
from tests.mutants.mutation import CRASH, Mutant, mutant
from tests.mutants.sglang_catalogue_review import SGLANG_REVIEW_MUTANTS

LEAK = {"CONSERVATION", "NO-LEAK", "EXCLUSIVE", CRASH}


# The strategies below narrow the plain draws themselves (regimes=False): the default
# configs' SGLang regimes would move some of their draws out of the corner each is for.


def _small_chunks(config: SchedulerConfig) -> SchedulerConfig:
    budget = max(config.block_size, config.max_num_seqs)
    return dataclasses.replace(config, enable_chunked_prefill=True, max_num_batched_tokens=budget)


def small_chunks() -> st.SearchStrategy[SchedulerConfig]:
    """Chunked prefill with chunks of a page or a seat's worth: long prompts stay the
    chunked request for many steps, so aborts often find one."""
    return sglang_configs(regimes=False).map(_small_chunks)


def _retracting(config: SchedulerConfig) -> SchedulerConfig:
    pages = -(-config.max_model_len // config.block_size)
    return dataclasses.replace(
        config, num_blocks=pages, enable_prefix_caching=True, schedule_conservativeness=0.1
    )


def retracting() -> st.SearchStrategy[SchedulerConfig]:
    """One max_model_len request of slots, the radix cache on and admission at its most
    optimistic (conservativeness 0.1): decodes outgrow the pool and retract often, and
    victims hold cached prefixes."""
    return sglang_configs(regimes=False).map(_retracting)


def _starved_chunks(config: SchedulerConfig) -> SchedulerConfig:
    return _small_chunks(_retracting(config))


def starved_chunks() -> st.SearchStrategy[SchedulerConfig]:
    """retracting() with chunks of a page or a seat's worth: a long prompt is the chunked
    request while the decodes beside it outgrow their reservations, so its next chunk
    often finds the pool short (FINDINGS S4)."""
    return sglang_configs(regimes=False).map(_starved_chunks)


def retracting_overlap() -> st.SearchStrategy[SchedulerConfig]:
    """retracting() under the overlap scheduler: victims often have a decode in flight."""
    return sglang_configs(async_scheduling=True, regimes=False).map(_retracting)


SGLANG_MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------ leaks
    mutant(
        "sg-retract-leaks-slots",
        "sglang/kv.py",
        "        self.release(req, checkpoint=False)\n        # After a retraction",
        "        req.row = None\n        self.rows_in_use -= 1\n        # After a retraction",
        "Retraction forgets the victim's row without freeing its slots (SGLang #4913, #4914).",
        LEAK,
        configs=retracting,
        family="sglang",
    ),
    mutant(
        "sg-retract-keeps-lock",
        "sglang/kv.py",
        "        self.release(req, checkpoint=False)\n        # After a retraction",
        "        req.lock = None\n        self.release(req, checkpoint=False)\n"
        "        # After a retraction",
        "Retraction frees the victim's slots but not its radix-tree lock: its cached prefix "
        "stays protected forever (SGLang #9982 / #9989).",
        LEAK,
        configs=retracting,
        family="sglang",
    ),
    mutant(
        "sg-chunked-abort-leaks",
        "sglang/scheduler.py",
        "        req.to_finish = False\n        self.kv.release(req, checkpoint=False)\n",
        "        req.to_finish = False\n",
        "An aborted chunked request is dropped without releasing its slots (SGLang #15840 / "
        "#16067).",
        LEAK,
        configs=small_chunks,
        family="sglang",
    ),
    mutant(
        "sg-free-group-lost",
        "sglang/slot_pool.py",
        "        if pending:\n            self._release(pending)\n",
        "",
        "Slots freed while a result is processed (a free group) never reach the free list "
        "(SGLang #6731).",
        LEAK,
        family="sglang",
    ),
    mutant(
        "sg-evict-oldest-node",
        "sglang/radix_tree.py",
        "        heap = self._leaf_heap()\n        while heap and self.pool.available_tokens()",
        "        heap = [(float(n.id), n.id, n) for _, _, n in self._leaf_heap()]\n"
        "        heapq.heapify(heap)\n        while heap and self.pool.available_tokens()",
        "Eviction takes the oldest leaf by creation, not the least recently used: a prefix "
        "hit again and again is evicted before one never reused.",
        {"SG-EVICT-ORDER"},
        family="sglang",
    ),
    # ------------------------------------------------------------ hangs
    mutant(
        "sg-decode-waits-for-memory",
        "sglang/scheduler.py",
        "            if finishing:\n                # The result in flight",
        "            if True:\n                # The result in flight",
        "A decode that does not fit waits for memory instead of retracting: nothing frees "
        "it, and the engine idles forever (SGLang #22518).",
        {"NO-EMPTY-STEP", "DRAIN"},
        configs=retracting,
        family="sglang",
    ),
    # ------------------------------------------------------------ overlap crash class
    mutant(
        "sg-retracted-output-applied",
        "sglang/scheduler.py",
        "        if req.finished or req.is_retracted:\n            return\n"
        "        self._commit_token(req, tokens, outputs)\n",
        "        if req.finished:\n            return\n"
        "        self._commit_token(req, tokens, outputs)\n",
        "Overlap: a retracted request's decode in flight is applied to it after the reset "
        "(the class of SGLang #19881's retraction crashes).",
        {"STOP", "PIPELINE", "QUEUES", "DELIVERY", "UPDATE-PIPELINE", CRASH, *LEAK},
        configs=retracting_overlap,
        family="sglang",
    ),
    # ------------------------------------------------------------ starvation
    mutant(
        "sg-retract-most-outputs",
        "sglang/scheduler.py",
        "            key=lambda i: (reqs[i].num_outputs, -reqs[i].request.num_prompt_tokens),\n"
        "            reverse=True,\n",
        "            key=lambda i: (reqs[i].num_outputs, -reqs[i].request.num_prompt_tokens),\n",
        "Retraction takes the request with the most outputs: the longest request is "
        "retracted again and again and never finishes (SGLang #32549).",
        {"SG-RETRACT", "DRAIN"},
        configs=retracting,
        family="sglang",
    ),
    mutant(
        "sg-retract-to-front",
        "sglang/scheduler.py",
        "        self.waiting.extend(retracted)\n",
        "        self.waiting[:0] = retracted\n",
        "Retracted requests jump the waiting queue (vLLM's rule, not SGLang's): requests "
        "that waited starve behind them.",
        {"SG-RETRACT"},
        configs=retracting,
        family="sglang",
    ),
    mutant(
        "sg-admission-ignores-running",
        "sglang/admission.py",
        "        self.total_offset += sum(\n",
        "        self.total_offset -= 0 * sum(\n",
        "Admission does not reserve the running requests' futures: it overcommits the pool "
        "and retracts what it admitted.",
        {"SG-ADMISSION"},
        family="sglang",
    ),
    mutant(
        "sg-ratio-never-decays",
        "sglang/admission.py",
        "        self.current = decayed(self.current, self.schedule)\n",
        "        pass\n",
        "new_token_ratio never decays: admission keeps reserving as if every running "
        "request will use its whole budget, starving the queue.",
        {"SG-RATIO"},
        family="sglang",
    ),
    # ------------------------------------------------------------ a chunk the pool cannot hold
    mutant(
        "sg-chunk-overruns-the-pool",
        "sglang/admission.py",
        "        limit = min(room if room > 0 else chunk, self.kv.extend_room(req))\n",
        "        limit = room if room > 0 else chunk\n",
        "SGLang 0.5.23's own rule (FINDINGS S4): when the reservations leave nothing, the "
        "chunked request takes a whole chunk whatever the pool holds, and the allocation "
        "raises inside schedule().",
        {CRASH},
        configs=starved_chunks,
        family="sglang",
    ),
    mutant(
        "sg-chunk-held-back-with-room",
        "sglang/admission.py",
        "        limit = min(room if room > 0 else chunk, self.kv.extend_room(req))\n",
        "        limit = min(room, self.kv.extend_room(req))\n",
        "The chunk is held back whenever the reservations leave nothing, though the pool "
        "has pages for it: the running requests decode while a prefill that fits waits.",
        {"SG-PREFILL-FIRST"},
        configs=starved_chunks,
        family="sglang",
    ),
    mutant(
        "sg-held-back-chunk-spared",
        "sglang/scheduler.py",
        "            self._retract_decode(batch, retracted, held_back)\n",
        "            self._retract_decode(batch, retracted)\n",
        "A decode that does not fit beside a held-back chunk retracts decoding requests "
        "and spares the chunk, which holds slots and has no outputs; alone beside it, a "
        "decode is aborted and the step runs nothing.",
        # SG-RATIO too: it caught this first on the pinned seed (issue 36, measured).
        {"SG-RETRACT", "NO-EMPTY-STEP", "SG-RATIO"},
        configs=starved_chunks,
        family="sglang",
    ),
    # A reviewer's, written from the reference and docs/SPEC.md alone (issue 36, item 5).
    *SGLANG_REVIEW_MUTANTS,
)
