"""NO-EMPTY-STEP: proved with its preconditions; without either, a stall."""

from __future__ import annotations

import pytest
import z3

from schedspec.spec import ConfigError, SchedulerConfig
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
    """Found by Z3: with spec-decode padding and a budget below 1 + num_speculative_tokens,
    a waiting request with one token left after its prefix hit is padded past the whole
    budget, waits for budget, and nothing else runs. So SchedulerConfig refuses the
    config (vLLM refuses only max_num_batched_tokens <= num_lookahead_tokens), which is
    the precondition the progress proof carries."""
    outcome = stall_without("padding-fits-budget", 2, TIMEOUT)
    assert outcome.verdict == "counterexample"
    model = outcome.model
    assert model is not None
    budget, num_spec = (int(value(model, z3.Int(name))) for name in ("budget", "num_spec"))
    assert value(model, z3.Bool("pad_spec_decode")) and value(model, z3.Bool("prefix_caching"))
    assert budget < 1 + num_spec
    hit = int(value(model, z3.Int("c[0].hit")))
    assert int(value(model, z3.Int("s[0].tokens"))) - hit == 1 and hit > 0
    # The reference's shape of it: a's prompt cached, b sharing all but its last token,
    # one token left, padded to 1 + 2 > a budget of 2. The config is refused at once.
    with pytest.raises(ConfigError) as refused:
        SchedulerConfig(
            block_size=2,
            num_blocks=16,
            max_num_batched_tokens=2,
            max_num_seqs=1,
            max_model_len=16,
            enable_prefix_caching=True,
            num_speculative_tokens=2,
            pad_spec_decode=True,
        )
    assert refused.value.field == "max_num_batched_tokens"
