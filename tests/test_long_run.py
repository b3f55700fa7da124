"""Long seeded random runs: the step-level rules hold throughout and everything drains.

The official invariant predicates arrive with the invariant suite; these are
the foundation's own end-to-end checks (behaviour 11 and the no-leak rule).
"""

from __future__ import annotations

import random

import pytest

from schedspec.engines.fake_model import FakeModel
from schedspec.reference import Scheduler
from schedspec.spec import Request, RequestStatus, SchedulerConfig, SchedulerOutput
from tests.sched_helpers import single_group_kv


def _random_config(rng: random.Random) -> SchedulerConfig:
    block_size = rng.choice([1, 2, 4, 16])
    max_model_len = rng.choice([16, 64, 200])
    chunked = rng.random() < 0.7
    max_num_seqs = rng.randint(1, 8)
    budget = rng.randint(max_num_seqs, 300)
    if not chunked:
        budget = max(budget, max_model_len)
    spec = rng.choice([0, 0, 2, 4])
    return SchedulerConfig(
        block_size=block_size,
        # Between one and three max_model_len requests' worth: preemption is common.
        num_blocks=-(-max_model_len // block_size) * rng.randint(1, 3),
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=rng.choice([0, 0, 1, 7, max_model_len]),
        enable_prefix_caching=rng.random() < 0.5,
        watermark=rng.choice([0.0, 0.0, 0.1, 0.5]),
        policy=rng.choice(["fcfs", "priority"]),
        num_speculative_tokens=spec,
        num_lookahead_tokens=rng.choice([None, 0]),
    )


def _random_request(rng: random.Random, rid: str, config: SchedulerConfig) -> Request:
    # Shared prefixes (few distinct tokens) so the prefix cache gets hits.
    prompt_len = rng.choice(
        [
            1,
            min(config.block_size, config.max_model_len - 1),
            config.max_model_len - 1,
            rng.randint(1, config.max_model_len - 1),
        ]
    )
    prompt = [rng.randrange(3) for _ in range(prompt_len)]
    return Request(
        rid,
        prompt,
        max_tokens=rng.randint(1, 40),
        eos_token_id=rng.choice([None, 5]),
        stop_token_ids=rng.choice([(), (6, 7)]),
        priority=rng.randint(0, 3),
    )


def _check_step(scheduler: Scheduler, output: SchedulerOutput, before: dict[str, int]) -> None:
    config = scheduler.config
    assert output.total_num_scheduled_tokens <= config.max_num_batched_tokens
    assert all(n > 0 for n in output.num_scheduled_tokens.values())
    assert len(scheduler.running) <= config.max_num_seqs
    if output.preempted_req_ids:
        assert not output.scheduled_new_reqs
        assert not any(d.resumed for d in output.scheduled_cached_reqs)
    for rid in output.preempted_req_ids:
        request = scheduler.requests[rid]
        assert request.status is RequestStatus.PREEMPTED
        assert request.num_computed_tokens == 0 and request.spec_token_ids == []
        assert single_group_kv(scheduler).get_block_ids(rid) == ()
    for rid, num in output.num_scheduled_tokens.items():
        request = scheduler.requests[rid]
        assert request.status is RequestStatus.RUNNING
        assert request.num_computed_tokens <= config.max_model_len - 1
        assert request.num_computed_tokens <= request.num_tokens + len(
            output.scheduled_spec_decode_tokens.get(rid, ())
        )
        blocks = single_group_kv(scheduler).get_block_ids(rid)
        assert len(blocks) * config.block_size >= request.num_computed_tokens
        if rid in before:  # MONOTONE at schedule time: exactly the scheduled tokens
            assert before[rid] + num == request.num_computed_tokens


@pytest.mark.parametrize("seed", range(40))
def test_random_run_keeps_step_rules_and_drains_with_no_leak(seed: int) -> None:
    rng = random.Random(seed)
    config = _random_config(rng)
    scheduler = Scheduler(config)
    model = FakeModel(
        seed=seed,
        vocab_size=8,
        draft_acceptance=0.6,
        num_speculative_tokens=config.num_speculative_tokens,
    )
    next_id = 0
    for step_index in range(2000):
        if step_index < 60 and rng.random() < 0.5:
            for _ in range(rng.randint(1, 3)):
                scheduler.add_request(_random_request(rng, f"r{next_id}", config))
                next_id += 1
        if scheduler.requests and rng.random() < 0.05:
            scheduler.finish_requests(rng.choice(list(scheduler.requests)))
        if step_index >= 60 and not scheduler.has_unfinished_requests():
            break
        before = {
            rid: r.num_computed_tokens
            for rid, r in scheduler.requests.items()
            if r.status is RequestStatus.RUNNING
        }
        output = scheduler.schedule()
        _check_step(scheduler, output, before)
        model_output = model.execute(output)
        scheduler.update_from_output(output, model_output)
        drafts = model.propose_drafts(model_output)
        if drafts:
            scheduler.update_draft_token_ids(drafts)
    else:
        pytest.fail(
            f"seed {seed}: {scheduler.get_num_unfinished_requests()} requests never drained"
        )
    pool = single_group_kv(scheduler).block_pool
    assert pool.get_num_free_blocks() == config.num_blocks
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert single_group_kv(scheduler).req_to_blocks == {}
