"""NO-EMPTY-STEP: proved with its preconditions; without either, a stall."""

from __future__ import annotations

import pytest
import z3

from schedspec.properties.fake_model import FakeModel
from schedspec.properties.pipeline import run_step
from schedspec.reference import Scheduler
from schedspec.spec import ConfigError, Request, SchedulerConfig
from schedspec.spec.formal.progress import progress_lemmas, stall_without
from schedspec.spec.formal.solving import value

TIMEOUT = 60.0


def test_progress_lemmas_prove() -> None:
    outcomes = progress_lemmas(TIMEOUT)
    assert len(outcomes) == 4
    assert all(o.proved for o in outcomes), [o for o in outcomes if not o.proved]


def test_without_the_precondition_the_step_stalls_forever() -> None:
    outcome = stall_without("fits-empty-cache", 2, TIMEOUT)
    assert outcome.verdict == "counterexample"
    model = outcome.model
    assert model is not None
    num_blocks = int(value(model, z3.Int("num_blocks")))
    max_model_len = int(value(model, z3.Int("max_model_len")))
    tokens = int(value(model, z3.Int("s[0].tokens")))
    lookahead = int(value(model, z3.Int("lookahead")))
    # The request (its tokens and lookahead slots, capped at max_model_len) needs more
    # blocks than the cache has: nothing can ever run it.
    assert -(-min(tokens + lookahead, max_model_len) // 2) > num_blocks
    assert num_blocks * 2 < max_model_len
    # The config checks refuse exactly this config, naming the field and the bound.
    with pytest.raises(ConfigError, match="num_blocks \\* block_size") as refused:
        SchedulerConfig(
            block_size=2,
            num_blocks=num_blocks,
            max_num_batched_tokens=max(max_model_len, 8),
            max_num_seqs=1,
            max_model_len=max_model_len,
        )
    assert refused.value.field == "num_blocks"


def test_without_padding_fitting_the_budget_a_prefix_hit_waits_forever() -> None:
    """A finding (not refused by SchedulerConfig; vLLM refuses max_num_batched_tokens <=
    num_lookahead_tokens at start-up): with spec-decode padding and a budget below
    1 + num_speculative_tokens, a waiting request with one token left after its prefix
    hit is padded past the whole budget, waits for budget, and nothing else runs.
    Z3 finds the stall; the reference, given the same shape, stalls too."""
    outcome = stall_without("padding-fits-budget", 2, TIMEOUT)
    assert outcome.verdict == "counterexample"
    model = outcome.model
    assert model is not None
    budget, num_spec = (int(value(model, z3.Int(name))) for name in ("budget", "num_spec"))
    assert value(model, z3.Bool("pad_spec_decode")) and value(model, z3.Bool("prefix_caching"))
    assert budget < 1 + num_spec
    hit = int(value(model, z3.Int("c[0].hit")))
    assert int(value(model, z3.Int("s[0].tokens"))) - hit == 1 and hit > 0
    # The reference: a's prompt is cached when it finishes; b shares all but its last
    # token, so one token is left to compute, padded to 1 + 2 > the budget of 2.
    config = SchedulerConfig(
        block_size=2,
        num_blocks=16,
        max_num_batched_tokens=2,
        max_num_seqs=1,
        max_model_len=16,
        enable_prefix_caching=True,
        num_speculative_tokens=2,
        pad_spec_decode=True,
    )
    scheduler = Scheduler(config)
    model_runner = FakeModel(num_speculative_tokens=2)
    scheduler.add_request(Request("a", [1, 2, 3, 4, 5], max_tokens=1))
    while scheduler.has_unfinished_requests():
        run_step(scheduler, model_runner)
    scheduler.add_request(Request("b", [1, 2, 3, 4, 9], max_tokens=1))
    for _ in range(3):
        assert run_step(scheduler, model_runner)[0].num_scheduled_tokens == {}
    assert scheduler.has_unfinished_requests()
