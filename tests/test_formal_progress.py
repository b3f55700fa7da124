"""NO-EMPTY-STEP: proved with the add_request precondition; without it, a stall."""

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
