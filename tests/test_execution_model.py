"""The tiny model, the dense baseline, greedy verification, stop rules, the drafter
and the provenance tags: worked examples."""

from __future__ import annotations

import pytest
import torch

from schedspec.gpu_impl.execution import (
    DenseSequence,
    ExecutionError,
    PerturbedDrafter,
    StopRule,
    TinyModel,
    TinyModelConfig,
    dense_generate,
)
from schedspec.gpu_impl.execution.kv_provenance import PrefixTags
from schedspec.gpu_impl.execution.sampler import verify_greedy
from schedspec.gpu_impl.execution.tiny_model import causal_attention
from tests.test_execution_invariance import MODEL, one_thread, tiny_model  # noqa: F401


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("vocab_size", 0, "vocab_size: must be an int >= 1, got 0"),
        ("num_layers", True, "num_layers: must be an int >= 1, got True"),
        ("hidden_size", 30, "hidden_size: must be a multiple of num_heads (4), got 30"),
    ],
)
def test_a_bad_model_config_names_the_field_and_bound(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ExecutionError) as caught:
        TinyModelConfig(**{field: value})  # type: ignore[arg-type]
    assert str(caught.value) == message and caught.value.field == field


def test_a_position_past_the_table_is_refused() -> None:
    model = TinyModel(TinyModelConfig(max_positions=4))
    with pytest.raises(ExecutionError, match="positions: must be < max_positions \\(4\\), got 4"):
        DenseSequence(model, 8).feed([1, 2, 3, 4, 5])


def test_the_same_seed_gives_the_same_weights_and_another_seed_does_not() -> None:
    a, b, c = tiny_model(), tiny_model(), TinyModel(TinyModelConfig(seed=1))
    assert torch.equal(a.weights.lm_head, b.weights.lm_head)
    assert not torch.equal(a.weights.lm_head, c.weights.lm_head)


def test_causal_attention_hides_the_future() -> None:
    """The query at position 0 sees only key 0, so it returns value 0 exactly;
    the query at position 1 returns a mix of values 0 and 1."""
    q = torch.ones(2, 1, 2, dtype=torch.float64)
    keys = torch.zeros(3, 1, 2, dtype=torch.float64)
    values = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[9.0, 9.0]]], dtype=torch.float64)
    out = causal_attention(q[None], keys[None], values[None], torch.tensor([[0, 1]]))[0]
    assert out[0, 0].tolist() == [1.0, 0.0]
    assert out[1, 0].tolist() == [0.5, 0.5]  # equal scores over keys 0 and 1, none on 2


def test_grouped_requests_attend_only_to_their_own_keys() -> None:
    """Two requests in one call: each query mixes only its own request's values,
    and a padded key past the shorter context (position 2 of request 0) is hidden."""
    q = torch.ones(2, 1, 1, 2, dtype=torch.float64)
    keys = torch.zeros(2, 3, 1, 2, dtype=torch.float64)
    values = torch.tensor(
        [[[[1.0, 0.0]], [[0.0, 1.0]], [[99.0, 99.0]]], [[[2.0, 0.0]], [[0.0, 2.0]], [[0.0, 5.0]]]],
        dtype=torch.float64,
    )
    out = causal_attention(q, keys, values, torch.tensor([[1], [2]]))
    assert out[0, 0, 0].tolist() == [0.5, 0.5]
    assert out[1, 0, 0].tolist() == pytest.approx([2 / 3, 7 / 3])


def test_feeding_token_by_token_equals_feeding_at_once() -> None:
    """KV cached row by row gives the logits of one pass over the whole prompt."""
    tokens = [5, 17, 3, 3, 90, 41, 8]
    whole = DenseSequence(tiny_model(), 16).feed(tokens)
    stepwise = DenseSequence(tiny_model(), 16)
    rows = [stepwise.feed([t])[0] for t in tokens]
    assert torch.allclose(torch.stack(rows), whole, atol=1e-12, rtol=0)


def test_truncate_forgets_positions_so_refeeding_gives_the_same_logits() -> None:
    sequence = DenseSequence(tiny_model(), 16)
    sequence.feed([1, 2, 3])
    first = sequence.feed([4])
    sequence.feed([50, 51])
    sequence.truncate(3)
    assert sequence.length == 3
    assert torch.equal(sequence.feed([4]), first)


@pytest.mark.parametrize(
    ("drafts", "greedy", "emitted"),
    [
        ((), (7,), [7]),  # plain decode
        ((7, 8, 9), (7, 8, 9, 4), [7, 8, 9, 4]),  # all accepted, plus the bonus token
        ((7, 5, 9), (7, 8, 9, 4), [7, 8]),  # rejected at the second: the target's 8 instead
        ((1, 8), (7, 8, 2), [7]),  # the first is wrong: nothing kept but the target's token
    ],
)
def test_verify_greedy(
    drafts: tuple[int, ...], greedy: tuple[int, ...], emitted: list[int]
) -> None:
    assert verify_greedy(drafts, greedy) == emitted


@pytest.mark.parametrize(
    ("rule", "outputs", "done"),
    [
        (StopRule(max_tokens=5, max_model_len=20, eos_token_id=3), [1, 3], True),
        (StopRule(max_tokens=5, max_model_len=20, stop_token_ids=(8, 9)), [9], True),
        (StopRule(max_tokens=5, max_model_len=20, eos_token_id=3), [1, 2, 4], False),
        (StopRule(max_tokens=3, max_model_len=20), [1, 2, 4], True),
        (StopRule(max_tokens=9, max_model_len=10), [1, 2, 4], True),  # 7 + 3 = max_model_len
        (StopRule(max_tokens=9, max_model_len=11), [1, 2, 4], False),
    ],
)
def test_stop_rules(rule: StopRule, outputs: list[int], done: bool) -> None:
    assert rule.is_done(7, outputs) is done


def test_dense_generation_stops_at_eos_and_keeps_it() -> None:
    model = tiny_model()
    free = dense_generate(model, [4, 5, 6], StopRule(max_tokens=8, max_model_len=64))
    assert len(free) == 8
    eos = free[3]
    stopped = dense_generate(model, [4, 5, 6], StopRule(8, 64, eos_token_id=eos))
    assert stopped == free[: free.index(eos) + 1]


def test_an_unperturbed_drafter_guesses_the_target_greedy_tokens() -> None:
    model = tiny_model()
    truth = dense_generate(model, [4, 5, 6], StopRule(max_tokens=6, max_model_len=64))
    exact = PerturbedDrafter(model.perturbed(0.0, 1), 3, 64)
    assert exact.propose([4, 5, 6], "a") == truth[:3]
    assert exact.propose([4, 5, 6, *truth[:2]], "a") == truth[2:5]  # extends its own cache
    noisy = PerturbedDrafter(model.perturbed(1.0, 1), 3, 64)
    assert noisy.propose([4, 5, 6], "a") != truth[:3]


def test_prefix_tags_keep_known_tokens_only() -> None:
    """A draft's tag is not remembered: the token later emitted at that position
    gets the tag of the real prefix."""
    tags = PrefixTags()
    with_draft = tags.of("a", [1, 2], drafts=[9])
    real = tags.of("a", [1, 2, 3])
    assert with_draft[:2] == real[:2]
    assert with_draft[2] != real[2]
    assert PrefixTags().of("b", [1, 2, 3]) == real  # a function of the tokens alone
    assert PrefixTags().of("b", [2, 1, 3])[2] != real[2]
