"""Seeded bugs in the reference's hybrid KV cache groups (docs/SPEC.md, "Hybrid KV cache
groups"), the upstream shapes of issue 34 among them. Each runs on the suite's configs
narrowed to one hybrid regime (strategies/hybrid_regimes.py), and as a user would run it
on engine_configs.hybrid_configs.

vLLM #50630 and #43559 (the Mamba side ignoring EAGLE's block drop) are seeded where the
drop lives in vLLM 0.33.0 and 0.34.0. Their shape was MambaManager.find_longest_cache_hit
ignoring drop_eagle_block in a hit; it still ignores it, but today the coordinator passes
a group the drop only under Scheduler.use_eagle_block_drop, which prefix caching's
lookahead hashes clear (num_hash_lookahead_tokens; docs/FINDINGS.md G1), and without
prefix caching there are no hits. What is left of the drop on the Mamba side is
drop_eagle_checkpoint_block: the prefill checkpoint, where the split stops a chunk, backs
off a block so that a Mamba state lands where the attention groups' dropped hit resumes.
The reference has it (mamba_split.py, checkpoint_position with drop_eagle_block), and
mamba-split-ignores-eagle-drop ignores it, on the regime that draws it
(hybrid-mamba-eagle: align mode without prefix caching, as the adapter builds vLLM's
scheduler). A served model meets the same split code only under prefix caching with
disable_lookahead_block_hashes (vLLM runs align mode only with prefix caching), which
the spec does not model.
"""

from __future__ import annotations

from hypothesis import strategies as st

from schedspec.properties.strategies import hybrid_regimes
from schedspec.properties.strategies.configs import configs
from schedspec.properties.strategies.engine_configs import hybrid_configs
from schedspec.spec import SchedulerConfig
from tests.mutants.mutation import CRASH, Mutant, mutant


def mamba_align() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(hybrid_regimes.mamba_align)


def mamba_eagle() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(hybrid_regimes.mamba_eagle)


def mamba_wide_block() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(hybrid_regimes.mamba_wide_block)


def window_and_mamba() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(hybrid_regimes.window_and_mamba)


def mamba_running_state() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(hybrid_regimes.mamba_running_state)


def async_window() -> st.SearchStrategy[SchedulerConfig]:
    return configs(async_scheduling=True).map(hybrid_regimes.sliding_window)


def window() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(hybrid_regimes.sliding_window)


def short_window() -> st.SearchStrategy[SchedulerConfig]:
    return configs().map(hybrid_regimes.short_window)


HYBRID_MUTANTS: tuple[Mutant, ...] = (
    mutant(
        "mamba-split-smallest-block-size",
        "vllm/mamba_split.py",
        "            group.block_size,\n            min(budget",
        "            min(g.block_size for g in config.kv_cache_groups),\n            min(budget",
        "vLLM #55600 and #54076: the Mamba-aligned split cuts chunk ends at the smallest "
        "group's block size, not Mamba's own: a chunk ends between two Mamba states, and "
        "the state block holds the state after the wrong number of tokens.",
        {"MAMBA-SPLIT", "GREEDY-BUDGET"},
        configs=mamba_align,
        user_configs=hybrid_configs,
    ),
    mutant(
        "mamba-split-rounds-to-zero",
        "vllm/mamba_split.py",
        "        if aligned_end > num_computed_tokens or block_size <= max_prefill_tokens:\n",
        "        if True:\n",
        "vLLM #40707 and #45414: a chunk is always cut down to a Mamba block boundary, so "
        "with a block wider than any step it rounds to 0 tokens and the request never "
        "advances: the scheduler stalls.",
        {"RUNNING-SERVED", "GREEDY-BUDGET", "PROGRESS", "DRAIN", "NO-EMPTY-STEP"},
        configs=mamba_wide_block,
        user_configs=hybrid_configs,
    ),
    mutant(
        "mamba-split-no-checkpoint-stop",
        "vllm/mamba_split.py",
        "    stops = [s for s in (next_boundary, checkpoint, junction_stop) if start < s < end]\n",
        "    stops = [s for s in (next_boundary, junction_stop) if start < s < end]\n",
        "docs/FINDINGS.md G4 (a gap of the reference, now closed): the prefill chunk that "
        "reaches the prompt's end runs past the last boundary a prefix hit can reach, so "
        "the Mamba state a later request with the same prompt would resume from is never "
        "written.",
        {"MAMBA-SPLIT", "GREEDY-BUDGET"},
        configs=mamba_align,
        user_configs=hybrid_configs,
    ),
    mutant(
        "mamba-split-ignores-eagle-drop",
        "vllm/mamba_split.py",
        "            config.lookahead_tokens > 0 and not config.enable_prefix_caching,\n",
        "            False,\n",
        "vLLM #50630 and #43559: the Mamba side ignores EAGLE's block drop (upstream in "
        "the hit: a Mamba state past the attention groups' hit, a silent loss of "
        "accuracy). Today the drop's Mamba side is the checkpoint: not backed off a block, "
        "a prefill runs past the boundary the attention groups' dropped hit resumes at, or "
        "stops where vLLM does not, and the state such a hit needs is never written.",
        {"MAMBA-SPLIT", "GREEDY-BUDGET"},
        configs=mamba_eagle,
        user_configs=hybrid_configs,
    ),
    mutant(
        "mamba-none-forgets-draft-scratch",
        "vllm/mamba_manager.py",
        "                num_tokens + self.block_size * spec_blocks,\n",
        "                num_tokens,\n",
        'A Mamba group in mode "none" allocates no scratch state for the drafts: its '
        "table stops at the running state's blocks, and the drafts' states are written "
        "into blocks it does not hold (HYBRID-COVER bounds only the tokens).",
        {"HYBRID-ALLOC-EXACT"},
        (
            "                request_id, num_tokens + self.block_size * spec_blocks, "
            "num_tokens_main_model\n",
            "                request_id, num_tokens, num_tokens_main_model\n",
        ),
        configs=mamba_running_state,
        user_configs=hybrid_configs,
    ),
    mutant(
        "mamba-split-ignores-junction",
        "vllm/mamba_split.py",
        "    stops = [s for s in (next_boundary, checkpoint, junction_stop) if start < s < end]\n",
        "    stops = [s for s in (next_boundary, checkpoint) if start < s < end]\n",
        "docs/FINDINGS.md G7 (a gap of the reference, now closed): a prefill chunk runs past "
        "its shared-prefix junction (the longest hit one group alone had at its admission), "
        "so the Mamba state at the prefix other requests share is never written.",
        {"MAMBA-SPLIT", "GREEDY-BUDGET"},
        configs=mamba_align,
        user_configs=hybrid_configs,
    ),
    mutant(
        "mamba-hits-state-cached-this-step",
        "vllm/mamba_manager.py",
        "        if new_computed_blocks and new_computed_blocks[-1].block_hash"
        " in self.cached_this_step:\n",
        "        if False:\n",
        "docs/FINDINGS.md G8 (a gap of the reference, now closed): an admission hits a Mamba "
        "state another request's allocation registered in the same step, before that step "
        "has written it.",
        {"MAMBA-HIT-WRITTEN"},
        configs=window_and_mamba,
        user_configs=hybrid_configs,
    ),
    mutant(
        "hit-one-round",
        "vllm/kv_cache_coordinator.py",
        "            if length >= hit_length:\n"
        "                break\n"
        "            hit_length = length\n",
        "            hit_length = length\n            break\n",
        "vLLM #46453: the groups' hits are reconciled in one round, not to a fixed point: a "
        "group that accepted a longer length is not asked again after a later group cut "
        "it, and its blocks disagree with the hit.",
        {"HYBRID-HIT", "WINDOW-FREED"},
        configs=window_and_mamba,
        user_configs=hybrid_configs,
    ),
    mutant(
        "hit-one-block-short",
        "vllm/kv_cache_coordinator.py",
        "        return self.find_longest_cache_hit(request, request.num_tokens - 1)\n",
        "        return self.find_longest_cache_hit(\n"
        "            request, max(request.num_tokens - 1 - self.scheduler_block_size, 0)\n"
        "        )\n",
        "The reconciled hit is looked up one scheduler block short of the most it may cover: "
        "every admission recomputes a block it had cached (and records a junction from "
        "the shortened lookup).",
        {"HYBRID-HIT-LONGEST", "SHARED-PREFIX-JUNCTION"},
        configs=window_and_mamba,
        user_configs=hybrid_configs,
    ),
    mutant(
        "one-phase-allocation",
        "vllm/kv_cache_coordinator.py",
        "        self.allocate_new_computed_blocks(rid, hits, total_computed)\n"
        "        new_blocks = self.allocate_new_blocks(rid, num_slots, num_main)\n",
        "        allocated = any(rid in m.num_cached_block for m in self.managers)\n"
        "        per_group = []\n"
        "        for gid, m in enumerate(self.managers):\n"
        "            if not allocated:\n"
        "                m.add_local_computed_blocks(rid, hits[gid], total_computed)\n"
        "            per_group.append(m.allocate_new_blocks(rid, num_slots, num_main))\n"
        "        new_blocks = tuple(per_group)\n",
        "vLLM #33775: each group takes its hit blocks and then its new blocks before the next "
        "group takes its hits, so one group's new block can be another group's free hit, "
        "evicted before it is touched.",
        {"HYBRID-TABLES", "HYBRID-HIT", "CONSERVATION", CRASH},
        configs=window_and_mamba,
        user_configs=hybrid_configs,
    ),
    mutant(
        "window-frees-computed-tokens",
        "vllm/kv_cache_coordinator.py",
        "        self.remove_skipped_blocks(rid, max(0, total_computed - num_in_flight_tokens))\n",
        "        self.remove_skipped_blocks(rid, total_computed)\n",
        "Windows free blocks on computed tokens rather than processed ones: under async "
        "scheduling a block the step in flight still reads is freed (and may be reused).",
        {"WINDOW-FREED"},
        configs=async_window,
        user_configs=hybrid_configs,
    ),
    mutant(
        "window-never-frees",
        "vllm/single_type_kv_cache_manager.py",
        "        return max(0, num_computed_tokens - self.sliding_window + 1)\n",
        "        return 0\n",
        "A sliding-window group keeps every block, as full attention does: blocks no layer "
        "reads again stay held, and the pool runs short.",
        {"WINDOW-FREED", "HYBRID-HIT"},
        configs=window,
        user_configs=hybrid_configs,
    ),
    mutant(
        "window-admission-uncapped",
        "vllm/kv_cache_coordinator.py",
        "                rid, full, hits, total_computed, full, apply_admission_cap=True\n",
        "                rid, full, hits, total_computed, full, apply_admission_cap=False\n",
        "docs/FINDINGS.md G5: the full-sequence admission gate counts every block of the "
        "sequence in a window group, not its admission cap (windows free as the request "
        "runs): a request vLLM admits waits.",
        {"HYBRID-ADMISSION-STOP"},
        configs=window,
        user_configs=hybrid_configs,
    ),
    mutant(
        "window-caches-unreachable-blocks",
        "vllm/single_type_kv_cache_manager.py",
        "        return window_block_reachable(self.spec, index, self.alignment_tokens)\n",
        "        return True\n",
        "docs/FINDINGS.md G6: a window group caches every full block, also those no aligned "
        "hit can reach: they are freed to the back of the queue and kept as hits nobody "
        "uses, where vLLM frees them to the front.",
        {"WINDOW-CACHE-REACHABLE"},
        configs=short_window,
        user_configs=hybrid_configs,
    ),
    mutant(
        "free-groups-in-reverse",
        "vllm/kv_cache_coordinator.py",
        "        for manager in self.managers:\n            manager.free(request.request_id)\n",
        "        for manager in reversed(self.managers):\n"
        "            manager.free(request.request_id)\n",
        "A finished request's groups are freed last group first: the free queue's order, "
        "and so which cached blocks are evicted first, differs from vLLM's.",
        {"FREE-ORDER", "FREE-ORDER-ABORT"},
        configs=window,
        user_configs=hybrid_configs,
    ),
    mutant(
        "null-block-handed-out",
        "vllm/hybrid_kv_cache_manager.py",
        "for b in table if b != null)\n",
        "for b in table)\n",
        "A hybrid request's flat table keeps the null block where a group holds nothing (a "
        "window's skipped prefix, Mamba's states before a hit): the runner is handed the "
        "null block as a block of KV.",
        {"NULL-BLOCK", "HYBRID-TABLES"},
        configs=window_and_mamba,
        user_configs=hybrid_configs,
    ),
    mutant(
        "null-block-cached",
        "vllm/single_type_kv_cache_manager.py",
        "            if table[i] is not self.null_block and self.reachable(i):\n",
        "            if self.reachable(i):\n",
        "The null block between a Mamba group's states is registered in the prefix cache "
        "like a block of KV.",
        {"NULL-BLOCK", CRASH},
        configs=mamba_align,
        user_configs=hybrid_configs,
    ),
)
