"""A reviewer's seeded bugs on the async-scheduling path of the vLLM reference.

Written from the reference source and docs/SPEC.md only (not from the checks), to find
what the suite misses under async scheduling: placeholders and their decrement, stale
output after a preemption, max-tokens-in-flight, placeholder drafts, aborts and reused
ids while a step is in flight, and what is cached while KV is in flight. Each changes
behaviour only (or mainly) with async_scheduling=True. The default configs draw async
half the time; the kill table (benchmarks/bench_mutants.py) always uses them.

    benchmarks/bench_mutants.py --catalogue \\
        tests.mutants.async_catalogue_review:ASYNC_REVIEW_MUTANTS --seeds 5 --workers 1
"""

from __future__ import annotations

from tests.mutants.mutation import CRASH, Mutant, mutant

ASYNC_REVIEW_MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------ placeholders: counting
    mutant(
        "placeholders-assigned-not-added",
        "vllm/scheduler.py",
        "            request.num_output_placeholders += 1 + num_drafts\n",
        "            request.num_output_placeholders = 1 + num_drafts\n",
        "Async: a sampling step sets the placeholders to its own 1 + drafts instead of "
        "adding them, forgetting the positions of the sampling step still in flight.",
        {"SCHEDULE-PIPELINE", "PIPELINE", "UPDATE-PIPELINE"},
    ),
    mutant(
        "in-flight-assigned-not-added",
        "vllm/scheduler.py",
        "            request.num_in_flight_tokens += num_tokens\n",
        "            request.num_in_flight_tokens = num_tokens\n",
        "The in-flight count is set to this step's tokens, as if no earlier step could "
        "still be in flight (true only in a synchronous engine).",
        {"SCHEDULE-PIPELINE", "PIPELINE", "UPDATE-PIPELINE"},
    ),
    mutant(
        "placeholders-on-prefill-chunk",
        "vllm/scheduler.py",
        "            if request.is_prefill_chunk:\n                continue\n"
        "            num_drafts = len(",
        "            num_drafts = len(",
        "Async: a prefill chunk that samples nothing still adds an output placeholder and "
        "gets placeholder drafts.",
        {"SCHEDULE-PIPELINE", "PIPELINE"},
    ),
    mutant(
        "placeholders-ignore-drafts",
        "vllm/scheduler.py",
        "            request.num_output_placeholders += 1 + num_drafts\n",
        "            request.num_output_placeholders += 1\n",
        "Async: a sampling step adds one placeholder for its sampled token but none for the "
        "drafts it verifies.",
        {"SCHEDULE-PIPELINE", "PIPELINE", "UPDATE-PIPELINE"},
    ),
    mutant(
        "placeholders-assume-all-drafts",
        "vllm/scheduler.py",
        "            num_drafts = len(step.spec_decode_tokens.get(rid, ()))\n",
        "            num_drafts = self.config.num_speculative_tokens\n",
        "Async: every sampling step counts 1 + num_speculative_tokens placeholders, also a "
        "step that carried fewer drafts (a prefill's last chunk, drafts cut by the budget).",
        {"SCHEDULE-PIPELINE", "PIPELINE", "UPDATE-PIPELINE"},
    ),
    mutant(
        "placeholders-only-for-running",
        "vllm/scheduler.py",
        "        for rid in step.num_scheduled_tokens:\n"
        "            request = self.requests[rid]\n"
        "            if request.is_prefill_chunk:\n",
        "        for request in step.scheduled_running:\n"
        "            rid = request.request_id\n"
        "            if request.is_prefill_chunk:\n",
        "Async: only requests that were already running add placeholders; a new or resumed "
        "request whose first step completes its prompt samples with none counted.",
        {"SCHEDULE-PIPELINE", "PIPELINE", "DRAFTS"},
    ),
    mutant(
        "placeholder-drafts-one-short",
        "vllm/scheduler.py",
        "        placeholders = [PLACEHOLDER_TOKEN_ID] * self.config.num_speculative_tokens\n",
        "        placeholders = [PLACEHOLDER_TOKEN_ID] * "
        "(self.config.num_speculative_tokens - 1)\n",
        "Async: after a sampling step the runner's placeholder drafts are one fewer than "
        "num_speculative_tokens.",
        {"DRAFTS"},
    ),
    # ------------------------------------------------ placeholders: decrement
    mutant(
        "rejected-drafts-keep-placeholders",
        "vllm/scheduler.py",
        "            if request.num_output_placeholders > 0:\n"
        "                request.num_output_placeholders -= rejected\n",
        "",
        "Async: rejected drafts roll num_computed_tokens back but are not taken off the "
        "placeholders.",
        {"UPDATE-PIPELINE", "PIPELINE"},
    ),
    mutant(
        "placeholder-rejections-off-by-one",
        "vllm/scheduler.py",
        "            rejected = num_drafts + 1 - len(tokens)\n",
        "            rejected = num_drafts - len(tokens)\n",
        "Async: the rejected-draft count taken off the placeholders forgets the bonus token "
        "(one rejection too few).",
        {"UPDATE-PIPELINE", "PIPELINE"},
    ),
    # ------------------------------------------------ stale output after preemption
    mutant(
        "preempt-stale-from-placeholders",
        "vllm/scheduler.py",
        "        request.num_stale_output_tokens = request.num_in_flight_tokens\n",
        "        request.num_stale_output_tokens = request.num_output_placeholders\n",
        "Async: preemption marks as stale the in-flight output positions (placeholders), "
        "not the in-flight tokens: a prefill step in flight is not (all) stale.",
        {"PREEMPT-RESET", "PIPELINE", "UPDATE-PIPELINE"},
    ),
    mutant(
        "stale-stop-stays-waiting",
        "vllm/scheduler.py",
        "                (stopped if was_running else stopped_waiting).add(rid)\n",
        "                stopped.add(rid)\n",
        "Async: stale output that finishes a preempted request frees it but leaves it in "
        "the waiting queue (only the running list is cleaned).",
        {"QUEUES", "UPDATE-FRAME", CRASH},
    ),
    mutant(
        "stale-output-dropped",
        "vllm/scheduler.py",
        "            {rid: len(r.all_token_ids) for rid, r in live.items()},\n",
        "            {rid: len(r.all_token_ids) for rid, r in live.items() if r.status is "
        "RUNNING},\n",
        "Async: output that lands for a request preempted meanwhile is dropped (as SGLang "
        "does) without marking it so; vLLM delivers it, and a stop it carries is lost.",
        {"STALE-KEPT", "DELIVERY", "STOP", "UPDATE-PIPELINE"},
    ),
    mutant(
        "stale-output-reported-not-appended",
        "vllm/scheduler.py",
        "        if not stale and num_drafts:\n",
        "        if stale:\n"
        "            return RequestOutput(request.request_id, tuple(tokens), None, None)\n"
        "        if num_drafts:\n",
        "Async: stale output is reported to the client but not appended to the preempted "
        "request, which then samples the same position again after it resumes.",
        {"DELIVERY", "STOP", "OUTPUT"},
    ),
    # ------------------------------------------------ aborts and reused ids in flight
    mutant(
        "landing-on-reused-id",
        "vllm/scheduler.py",
        "        stale = self._land_in_flight_tokens(scheduler_output, live)\n",
        "        stale = self._land_in_flight_tokens(\n"
        "            scheduler_output,\n"
        "            {\n"
        "                rid: requests[rid]\n"
        "                for rid in scheduler_output.num_scheduled_tokens\n"
        "                if rid in requests\n"
        "            },\n"
        "        )\n",
        "Async: a landed step takes its tokens off the in-flight count of whichever request "
        "holds the id now, also a new request that reuses an id aborted while the step ran.",
        {"UPDATE-PIPELINE", "PIPELINE", CRASH},
    ),
    # ------------------------------------------------ max tokens in flight
    mutant(
        "max-tokens-strict",
        "sizing.py",
        "    return placeholders > 0 and computed + 2 - placeholders >= prompt + max_tokens\n",
        "    return placeholders > 0 and computed + 2 - placeholders > prompt + max_tokens\n",
        "Async: a request whose in-flight step brings it exactly to max_tokens is scheduled "
        "once more (> for >=).",
        {"MAX-TOKENS"},
    ),
    mutant(
        "max-tokens-from-output-length",
        "vllm/scheduler.py",
        "                request.num_prompt_tokens,\n",
        "                request.num_tokens,\n",
        "Async: the sure-to-reach-max-tokens test counts from the request's whole length "
        "(outputs included) instead of its prompt, so it fires late.",
        {"MAX-TOKENS"},
    ),
    mutant(
        "max-tokens-assumes-drafts-accepted",
        "sizing.py",
        "    return placeholders > 0 and computed + 2 - placeholders >= prompt + max_tokens\n",
        "    return placeholders > 0 and computed + 1 >= prompt + max_tokens\n",
        "Async: the sure-to-reach test assumes every draft in flight is accepted, so a "
        "request that may still need a step is left out of this one.",
        {"RUNNING-SERVED", "GREEDY-BUDGET"},
    ),
    mutant(
        "max-tokens-skip-breaks",
        "vllm/scheduler.py",
        "                req_index += 1  # async: the step in flight is its last\n"
        "                continue\n",
        "                break  # async: the step in flight is its last\n",
        "Async: a running request whose in-flight step is its last ends the running loop, "
        "so the running requests after it are not served this step.",
        {"RUNNING-SERVED", "GREEDY-BUDGET"},
    ),
    # ------------------------------------------------ sizing the next step
    mutant(
        "running-ignores-placeholders",
        "vllm/scheduler.py",
        "                + len(request.spec_token_ids)\n"
        "                + request.num_output_placeholders\n",
        "                + len(request.spec_token_ids)\n",
        "Async: a running request's demand ignores its in-flight output positions, so it "
        "is served only every other step (or short of its drafts).",
        {"RUNNING-SERVED", "GREEDY-BUDGET", "DRAFTS", CRASH},
    ),
    mutant(
        "drafts-ignore-placeholders",
        "vllm/scheduler.py",
        "            request.num_tokens + request.num_output_placeholders,\n        )\n",
        "            request.num_tokens,\n        )\n",
        "Async: the drafts that ride in a step are counted past the known tokens only, not "
        "past the in-flight outputs' positions: a step cut short carries too many.",
        {"DRAFTS", "SCHEDULE-PIPELINE"},
    ),
    mutant(
        "room-from-confirmed",
        "vllm/scheduler.py",
        "                last_position - computed,\n",
        "                last_position - request.num_confirmed_computed_tokens,\n",
        "Async: the room left below max_model_len is measured from the confirmed computed "
        "count, not counting the tokens of the step in flight.",
        {"NO-OVERSHOOT", "LENGTH", CRASH},
    ),
    # ------------------------------------------------ what the runner and client are told
    mutant(
        "output-count-without-placeholders",
        "vllm/scheduler.py",
        "                        len(r.output_token_ids) + r.num_output_placeholders,\n",
        "                        len(r.output_token_ids),\n",
        "Async: a running request's output count sent to the runner leaves out the outputs "
        "of its step still in flight.",
        {"OUTPUT"},
    ),
    mutant(
        "confirmed-reports-in-flight",
        "vllm/scheduler.py",
        "        confirmed = request.num_computed_tokens - request.num_in_flight_tokens\n",
        "        confirmed = request.num_computed_tokens\n",
        "Async: the computed count reported with a landed output includes the tokens of the "
        "next step, still in flight.",
        {"ROLLBACK"},
    ),
    # ------------------------------------------------ prefix cache and in-flight KV
    mutant(
        "landing-not-cached-without-drafts",
        "vllm/scheduler.py",
        "        if status is RUNNING and (had_placeholders or self._drafting):\n",
        "        if status is RUNNING and self._drafting:\n",
        "Async without drafts: a landed output does not register the block its token "
        "completed; only the next schedule-time registration does, which a request that "
        "finishes on the landing never gets (CACHE-COMPLETE-UPDATE's clause for it was "
        "added when this mutant survived).",
        {"CACHE-COMPLETE-UPDATE"},
    ),
    mutant(
        "victim-uncaches-in-flight-kv",
        "vllm/kv_cache_manager.py",
        "        keep = request.num_computed_tokens // self.block_size\n",
        "        keep = request.num_confirmed_computed_tokens // self.block_size\n",
        "Async: a priority victim unscheduled in this step also loses the registrations of "
        "blocks its earlier step, still in flight, is writing (they are computed). It was "
        "a known gap until CACHE-SCHEDULE-KEPT said what a victim's freed blocks keep "
        "(CACHE-CONTENT and CACHE-COMPUTED bound registrations from above only, and "
        "CACHE-COMPLETE judges requests still running). Judging only registrations older "
        "than the step, that left seed 9 alive, where the mutant dropped only what the "
        "step registered for a victim it served first (a block filled by a landing while "
        "its last KV was in flight): the output does not say whether a victim was served. "
        "The state does: running_replay.py replays the running loop, and a clause of "
        "CACHE-SCHEDULE-KEPT judges what the service of a served victim registered "
        '(docs/FORMAL.md, "No longer left free"). benchmarks/bench_mutants.py: 10 of '
        "seeds 1-10 (issue 36).",
        {"CACHE-SCHEDULE-KEPT", "CACHE-HIT-LONGEST", "CACHE-COMPLETE"},
    ),
)
